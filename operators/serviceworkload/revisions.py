"""Revisions of a ServiceWorkload's template, recorded as apps/v1 ControllerRevisions.

One ControllerRevision per distinct template, named `<workload>-<hash>`, its `data` the
template itself and its `revision` a number that grows with every rollout. The hash is also
the pods' `pilotfish.io/revision` label, so "which pods run which template" is a label query,
and it is what `status.currentRevision` / `status.updateRevision` hold.

Why ControllerRevisions (StatefulSets and DaemonSets use them too): the history lives in the
API, owned by the workload (garbage-collected with it), readable by `kubectl`, so undo and a
restarted operator need nothing but the API.

Setting the template back to an earlier one (by hand or with `rollout undo`) is not a new
revision: the revision with the same hash is reused and renumbered to the newest, as a
StatefulSet's history does, so `rollout history` reads in the order things happened. The
time a revision last became the update revision is stamped on it (ANNOTATION_ACTIVATED): it
starts the progress-deadline clock of the rollout to it.

Renumbering is a delete (conditional on the resourceVersion read) and a create of the same
name and data, never a patch: `data` is a RawExtension that the API server compares byte
for byte on every update, and a JSON patch re-encodes it (whitespace, escaping), so any
patch of a revision written by a client that formats JSON differently from Go is refused
as "data: field is immutable". Pods do not refer to the revision object, only to its hash,
so re-creating it changes nothing for them; a crash between the two calls leaves the
revision missing, and the next sync records it again with the next number.

The hash is 10 characters of SHA-256 of the canonical JSON of the template (~47 bits): a
collision is not expected in the life of a cluster, but it is detected (same name, different
data) and reported rather than rolled out.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pilotfish.kube.rest import Resource
from pilotfish.podtemplate import owner_reference
from pilotfish.workloads import LABEL_REVISION, LABEL_WORKLOAD

CONTROLLER_REVISIONS: Final = Resource("apps", "v1", "controllerrevisions")
ANNOTATION_ACTIVATED: Final = "pilotfish.io/revision-activated-at"
# Copied from the workload when a revision is recorded, as Deployments do for ReplicaSets.
ANNOTATION_CHANGE_CAUSE: Final = "kubernetes.io/change-cause"

HASH_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"  # no vowels: no words; as k8s' SafeEncode
HASH_LENGTH: Final = 10

Obj = dict[str, Any]


class RevisionCollision(Exception):
    """Two different templates hashed to the same revision name."""


class UndoError(Exception):
    """There is no revision to go back to (or not the one asked for)."""


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def template_hash(template: Mapping[str, Any]) -> str:
    """The revision's hash: stable across processes and Python versions (no `hash()`)."""
    n = int.from_bytes(hashlib.sha256(canonical_json(template)).digest()[:8], "big")
    chars = []
    for _ in range(HASH_LENGTH):
        n, digit = divmod(n, len(HASH_ALPHABET))
        chars.append(HASH_ALPHABET[digit])
    return "".join(chars)


def revision_name(workload: str, hash_: str) -> str:
    return f"{workload}-{hash_}"


@dataclass(frozen=True)
class RevisionInfo:
    name: str
    hash: str
    number: int
    template: Mapping[str, Any]
    created_at: str | None
    activated_at: str | None
    resource_version: str | None
    change_cause: str | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)


def revision_info(obj: Mapping[str, Any]) -> RevisionInfo:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    name = str(meta.get("name", ""))
    return RevisionInfo(
        name=name,
        hash=str(labels.get(LABEL_REVISION) or name.rsplit("-", 1)[-1]),
        number=int(obj.get("revision") or 0),
        template=obj.get("data") or {},
        created_at=meta.get("creationTimestamp"),
        activated_at=annotations.get(ANNOTATION_ACTIVATED) or meta.get("creationTimestamp"),
        resource_version=meta.get("resourceVersion"),
        change_cause=annotations.get(ANNOTATION_CHANGE_CAUSE),
        annotations=dict(annotations),
    )


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether `uid` is the object's controller (we never adopt what another owner made)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("controller") and r.get("uid") == uid for r in refs)


def owned_revisions(objs: Iterable[Mapping[str, Any]], uid: str) -> list[RevisionInfo]:
    """The workload's revisions, oldest number first."""
    return sorted((revision_info(o) for o in objs if controlled_by(o, uid)), key=lambda r: r.number)


@dataclass(frozen=True)
class CreateRevision:
    hash: str
    number: int


@dataclass(frozen=True)
class ActivateRevision:
    """An old revision becomes the update revision again: renumber it to the newest."""

    revision: RevisionInfo
    number: int


def next_revision(
    revisions: Sequence[RevisionInfo], template: Mapping[str, Any]
) -> CreateRevision | ActivateRevision | None:
    """What to record for the current template; None when it already is the newest."""
    update = template_hash(template)
    newest = max((r.number for r in revisions), default=0)
    same = next((r for r in revisions if r.hash == update), None)
    if same is None:
        return CreateRevision(update, newest + 1)
    if canonical_json(same.template) != canonical_json(template):
        raise RevisionCollision(
            f"ControllerRevision {same.name} holds a different template with the same hash"
        )
    if same.number < newest or sum(1 for r in revisions if r.number == newest) > 1:
        return ActivateRevision(same, newest + 1)
    return None


def revision_body(
    sw: Mapping[str, Any], hash_: str, number: int, template: Mapping[str, Any], now: str
) -> Obj:
    meta = sw["metadata"]
    annotations = {ANNOTATION_ACTIVATED: now}
    cause = (meta.get("annotations") or {}).get(ANNOTATION_CHANGE_CAUSE)
    if cause:
        annotations[ANNOTATION_CHANGE_CAUSE] = cause
    return {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": revision_name(meta["name"], hash_),
            "namespace": meta["namespace"],
            "labels": {LABEL_WORKLOAD: meta["name"], LABEL_REVISION: hash_},
            "annotations": annotations,
            "ownerReferences": [owner_reference(sw)],
        },
        "data": dict(template),
        "revision": number,
    }


def to_prune(
    revisions: Sequence[RevisionInfo], keep: int, update_hash: str, in_use: set[str]
) -> list[RevisionInfo]:
    """Old revisions beyond `strategy.revisionHistoryLimit`, oldest first.

    As Deployments count old ReplicaSets: every revision but the update one is old; of those
    beyond the limit, the oldest go first, skipping any that still has pods or is the
    stable (current) revision, which are never deleted.
    """
    old = sorted((r for r in revisions if r.hash != update_hash), key=lambda r: r.number)
    excess = len(old) - keep
    out: list[RevisionInfo] = []
    for r in old:
        if len(out) >= excess:
            break
        if r.hash not in in_use:
            out.append(r)
    return out


def undo_target(
    revisions: Sequence[RevisionInfo], current_hash: str, to_revision: int | None = None
) -> RevisionInfo:
    """The revision `rollout undo` goes back to: the given number, else the newest one that
    is not the current template."""
    if to_revision is not None:
        for r in revisions:
            if r.number == to_revision:
                return r
        known = ", ".join(str(r.number) for r in revisions) or "none"
        raise UndoError(f"revision {to_revision} not found (revisions: {known})")
    older = [r for r in revisions if r.hash != current_hash]
    if not older:
        raise UndoError("no previous revision to roll back to")
    return max(older, key=lambda r: r.number)


def undo_patch(sw: Mapping[str, Any], target: RevisionInfo) -> list[dict[str, Any]]:
    """JSON patch writing the revision's template into spec, only on the version read."""
    return [
        {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": sw["metadata"]["resourceVersion"],
        },
        {"op": "replace", "path": "/spec/template", "value": dict(target.template)},
    ]
