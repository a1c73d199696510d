"""Pilotfish's own labels and annotations on pods: set at creation, then changed by Pilotfish only.

They decide releases and charges: the gate record and the release marks (every key under
`gates.pilotfish.io/`), the team, the band, the gang and the epoch. A tenant who could edit
them after admission could rewrite what releases its gates, charge another team or join a
gang of its own making, so after creation no one but Pilotfish's operator may add, change or
remove them. Two independent guards enforce it at the API server, each on its own: the
chart's ValidatingAdmissionPolicy `pilotfish-pod-metadata` (it holds while the webhooks are
down) and the validating webhook's review of pod UPDATEs (`pilotfish.webhooks.podupdate`).
This module is the one list of the keys; a test holds the chart's copy to it.

One exception, for on-call: `kubectl pilotfish gates release` records who removed a gate by
hand in `gates.pilotfish.io/manual-release`, in the same write that removes the gate. That
annotation may be added or changed with the removal of a Pilotfish gate, which the
`pilotfish-gate-ownership` policy reserves for the operator and the releaser groups; so
whoever is refused the removal is refused by that policy, in its words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from pilotfish import gates, names, workloads

PREFIX: Final = names.GATE_PREFIX
# A task pod's job, index, attempt and failure count are among them: a task relabelled to
# another index would let two pods run one index, and a rewritten failure count would let a
# task retry past its limit.
KEYS: Final = (
    names.LABEL_TEAM,
    names.LABEL_BAND,
    gates.LABEL_GANG,
    names.ANNOTATION_EPOCH,
    workloads.LABEL_BATCH,
    workloads.LABEL_TASK_INDEX,
    workloads.ANNOTATION_TASK_ATTEMPT,
    workloads.ANNOTATION_TASK_FAILURES,
)
# The operator writes every one of them; no other Pilotfish component updates pods.
WRITER: Final = names.SA_OPERATOR

MANUAL_RELEASE: Final = gates.ANNOTATION_MANUAL_RELEASE
RULE: Final = (
    f"Pilotfish's pod labels and annotations ({PREFIX}*, {', '.join(KEYS)}) are fixed at "
    f"creation; only {WRITER} may change them ({MANUAL_RELEASE} may be added or changed "
    f"only with the removal of a {PREFIX} gate)"
)

Where = Literal["label", "annotation"]
How = Literal["added", "changed", "removed"]


def is_pilotfish_key(key: str) -> bool:
    """Whether `key` (a label or annotation key) is one only Pilotfish may change."""
    return key.startswith(PREFIX) or key in KEYS


def operator_username(namespace: str) -> str:
    """The API server's name for the operator's ServiceAccount in `namespace`."""
    return names.service_account_user(namespace, WRITER)


def pilotfish_creators(namespace: str) -> frozenset[str]:
    """The accounts Pilotfish creates tenants' pods as, in `namespace`: the operator's
    (ServiceWorkloads) and the batch operator's (BatchWorkloads)."""
    batch = names.service_account_user(namespace, names.SA_BATCH)
    return frozenset({operator_username(namespace), batch})


@dataclass(frozen=True, order=True)
class Change:
    """One Pilotfish key an update adds, changes or removes."""

    where: Where
    key: str
    how: How

    def __str__(self) -> str:
        return f"{self.where} {self.key} {self.how}"


def _diff(where: Where, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    out: list[Change] = []
    for key in sorted({*old, *new}):
        if not is_pilotfish_key(key):
            continue
        if key not in old:
            out.append(Change(where, key, "added"))
        elif key not in new:
            out.append(Change(where, key, "removed"))
        elif old[key] != new[key]:
            out.append(Change(where, key, "changed"))
    return out


def changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """The Pilotfish keys that differ between two pods' metadata (labels first)."""
    return [
        *_diff("label", old.get("labels") or {}, new.get("labels") or {}),
        *_diff("annotation", old.get("annotations") or {}, new.get("annotations") or {}),
    ]


def forbidden(
    old_meta: Mapping[str, Any],
    new_meta: Mapping[str, Any],
    old_spec: Mapping[str, Any],
    new_spec: Mapping[str, Any],
) -> list[Change]:
    """What `RULE` forbids in an update by anyone but the operator."""
    changed = changes(old_meta, new_meta)
    if not removes_pilotfish_gate(old_spec, new_spec):
        return changed
    return [
        c
        for c in changed
        if not (c.where == "annotation" and c.key == MANUAL_RELEASE and c.how != "removed")
    ]


def removes_pilotfish_gate(old_spec: Mapping[str, Any], new_spec: Mapping[str, Any]) -> bool:
    """Whether an update takes a `gates.pilotfish.io/` scheduling gate off the pod."""
    before = {str(g.get("name")) for g in old_spec.get("schedulingGates") or []}
    after = {str(g.get("name")) for g in new_spec.get("schedulingGates") or []}
    return any(gates.is_pilotfish_gate(g) for g in before - after)
