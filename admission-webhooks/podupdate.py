"""Pod UPDATEs: Pilotfish's labels and annotations stay as admission left them (pure review).

The keys that decide releases and charges (`pilotfish.podmeta`) may be added, changed or
removed after creation by Pilotfish's operator only. The chart's ValidatingAdmissionPolicy
`pilotfish-pod-metadata` enforces the same rule inside the API server; this review is the
second, independent guard, so neither a policy binding deleted by mistake nor a webhook
that is down lets a tenant through alone.

Which UPDATEs reach it is decided by the chart's `matchConditions`: only those that change
labels or annotations, and never the operator's own, so a webhook outage holds no gate
release, status write or garbage-collector patch (those never touch these keys; status is a
subresource the rule does not match). Whatever does arrive is judged in full here: the
review does not rely on the filter.

On-call's manual release (`kubectl pilotfish gates release`) writes
`gates.pilotfish.io/manual-release` in the same write that removes a Pilotfish gate; the
annotation is accepted with such a removal only, which the `pilotfish-gate-ownership`
policy reserves for the operator and the releaser groups.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pilotfish import names, podmeta
from pilotfish.httpserver import BadRequest
from pilotfish.webhooks.admission import Decision


@dataclass(frozen=True)
class Writers:
    """Who may change Pilotfish's keys: the operator's ServiceAccount, by username."""

    operator: str

    @classmethod
    def of_namespace(cls, namespace: str) -> Writers:
        return cls(podmeta.operator_username(namespace))

    @classmethod
    def from_env(cls) -> Writers:
        return cls.of_namespace(pilotfish_namespace())


def pilotfish_namespace() -> str:
    """The chart runs every component in one namespace and names it in PILOTFISH_NAMESPACE;
    local mode runs the host processes for pilotfish-system."""
    return os.environ.get("PILOTFISH_NAMESPACE") or names.SYSTEM_NAMESPACE


DEFAULT_WRITERS = Writers.of_namespace(names.SYSTEM_NAMESPACE)
# Keys named in one denial; a pod may carry thousands, the message stays readable.
MAX_NAMED: Final = 20


def is_pod_update(request: Mapping[str, Any]) -> bool:
    """An UPDATE of a pod itself (not of a subresource such as status)."""
    kind = request.get("kind")
    pod = not isinstance(kind, Mapping) or kind.get("kind", "Pod") == "Pod"
    return request.get("operation") == "UPDATE" and pod and not request.get("subResource")


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadRequest(f"{where} must be an object, got {type(value).__name__}")
    return value


def _part(obj: Mapping[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata with labels and annotations, spec with its gates), shapes checked."""
    meta = _mapping(obj.get("metadata"), f"{where}.metadata")
    spec = _mapping(obj.get("spec"), f"{where}.spec")
    held = spec.get("schedulingGates") or []
    if not isinstance(held, list) or not all(isinstance(g, Mapping) for g in held):
        raise BadRequest(f"{where}.spec.schedulingGates must be a list of objects")
    return (
        {
            "labels": _mapping(meta.get("labels"), f"{where}.metadata.labels"),
            "annotations": _mapping(meta.get("annotations"), f"{where}.metadata.annotations"),
        },
        {"schedulingGates": held},
    )


def review(request: Mapping[str, Any], writers: Writers = DEFAULT_WRITERS) -> Decision:
    """Deny an UPDATE by anyone but the operator that adds, changes or removes one of
    Pilotfish's pod labels or annotations, naming each key and the rule."""
    if not is_pod_update(request):
        return Decision.allow()
    user = _mapping(request.get("userInfo"), "request.userInfo").get("username")
    if user == writers.operator:
        return Decision.allow()
    new, old = request.get("object"), request.get("oldObject")
    if not isinstance(new, Mapping) or not isinstance(old, Mapping):
        raise BadRequest("a pod UPDATE needs request.object and request.oldObject (objects)")
    new_meta, new_spec = _part(new, "request.object")
    old_meta, old_spec = _part(old, "request.oldObject")
    changed = podmeta.forbidden(old_meta, new_meta, old_spec, new_spec)
    if not changed:
        return Decision.allow()
    who = user if isinstance(user, str) and user else "an unnamed user"
    named = ", ".join(map(str, changed[:MAX_NAMED]))
    if len(changed) > MAX_NAMED:
        named += f" and {len(changed) - MAX_NAMED} more"
    return Decision.deny(f"{named} by {who}: {podmeta.RULE}")
