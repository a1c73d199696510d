"""Planning `kubectl pilotfish gates release` and `cancel`: pure, from the pod as read.

Each plan is one conditional write (it carries the resourceVersion it was decided from)
plus the Event that records it; `gates_cmd` executes both. A request that does not fit the
pod as read is refused here with a message saying what the pod holds, before anything is
written.
"""

from __future__ import annotations

import datetime
import json
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from pilotfish import gates, timeutil
from pilotfish.cli.connect import Identity
from pilotfish.kube.rest import PODS, STRATEGIC_MERGE_PATCH, ApiError
from pilotfish.names import GATE_PREFIX

# What a manual release leaves on the pod: JSON {gate, by, reason, at} of the latest one.
ANNOTATION_MANUAL_RELEASE: Final = gates.ANNOTATION_MANUAL_RELEASE
# Event reasons (events.k8s.io/v1) of the manual path.
REASON_MANUALLY_RELEASED: Final = "GateManuallyReleased"
REASON_CANCELLED: Final = "GateCancelled"
REASON_CANCEL_ABORTED: Final = "GateCancelAborted"
ACTION_RELEASE: Final = "ReleaseGate"
ACTION_CANCEL: Final = "CancelPod"
REPORTING_CONTROLLER: Final = "pilotfish.io/kubectl-pilotfish"
# The group the chart's ValidatingAdmissionPolicy lets remove Pilotfish gates by hand.
RELEASERS_GROUP: Final = "pilotfish:gate-releasers"

# Recorded as `by` when the API server will not say who the caller is.
UNKNOWN_USER: Final = "unknown (see the API server's audit log)"


class Refused(Exception):
    """The request does not fit the pod as read; the message says why and what it holds."""


@dataclass(frozen=True)
class EventNote:
    """The Event a plan leaves about the pod it was decided from."""

    reason: str
    action: str
    note: str


def pod_ref(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _held_text(held: Sequence[str]) -> str:
    return ", ".join(held) if held else "no scheduling gates"


def resolve_gate(requested: str, held: Sequence[str]) -> str:
    """The gate on the pod that `requested` names; a bare condition means the Pilotfish one.

    `warehouse-ready` is accepted for `gates.pilotfish.io/warehouse-ready` (less to type at
    3 a.m.); anything else must match exactly. Only Pilotfish gates may be released here:
    other owners' gates belong to their own controllers (seeds B.4).
    """
    name = requested if "/" in requested else f"{GATE_PREFIX}{requested}"
    if not gates.is_pilotfish_gate(name):
        raise Refused(
            f"{requested} is not a Pilotfish gate (prefix {GATE_PREFIX}): its owner's "
            "controller removes it, not kubectl pilotfish"
        )
    if name not in held:
        raise Refused(f"the pod does not hold gate {name}; it holds: {_held_text(held)}")
    return name


def reporting_instance(by: Identity) -> str:
    """Which plugin run reported: the user and the host it ran on."""
    return f"kubectl-pilotfish/{by.username}@{socket.gethostname()}"


def _check_reason(reason: str) -> str:
    text = " ".join(reason.split())
    if not text:
        raise Refused("--reason must say why (it goes into the Event and the pod's annotation)")
    return text


@dataclass(frozen=True)
class ReleasePlan:
    namespace: str
    pod: str
    gate: str
    resource_version: str
    remaining: tuple[str, ...]  # gates the pod keeps
    patch: dict[str, Any]
    event: EventNote

    def describe(self) -> list[str]:
        keep = ", ".join(self.remaining) if self.remaining else "no gates"
        return [
            f"release gate {self.gate} on pod {self.namespace}/{self.pod} "
            f"(resourceVersion {self.resource_version}); the pod keeps {keep}",
            f"PATCH {PODS.path(self.namespace, self.pod)} ({STRATEGIC_MERGE_PATCH}):",
            "  " + json.dumps(self.patch, sort_keys=True),
            f"then create Event {self.event.reason}: {self.event.note}",
        ]


def plan_release(
    pod: dict[str, Any],
    requested_gate: str,
    by: Identity,
    reason: str,
    now: datetime.datetime,
) -> ReleasePlan:
    """The one conditional write that removes exactly one gate, and its Event.

    The patch carries the resourceVersion it was decided from, so if the pod changed since
    (the controller released it, someone cancelled it) the API server refuses it instead of
    acting on a stale picture. The `$patch: delete` directive names the gate, so every other
    gate on the pod is left as it is. The annotation goes in the same write: the gate never
    disappears without the record of who removed it.
    """
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        raise Refused(f"pod {pod_ref(pod)} is being deleted; there is nothing to release")
    held = gates.scheduling_gates(pod)
    gate = resolve_gate(requested_gate, held)
    why = _check_reason(reason)
    record = {"gate": gate, "by": by.username, "reason": why, "at": timeutil.format_time(now)}
    patch = gates.remove_gate_patch(gate)
    patch["metadata"] = {
        "resourceVersion": str(meta.get("resourceVersion", "")),
        "annotations": {ANNOTATION_MANUAL_RELEASE: json.dumps(record, sort_keys=True)},
    }
    return ReleasePlan(
        namespace=str(meta.get("namespace")),
        pod=str(meta.get("name")),
        gate=gate,
        resource_version=str(meta.get("resourceVersion", "")),
        remaining=tuple(g for g in held if g != gate),
        patch=patch,
        event=EventNote(
            REASON_MANUALLY_RELEASED,
            ACTION_RELEASE,
            f"gate {gate} released manually by {by.username}: {why}",
        ),
    )


@dataclass(frozen=True)
class CancelPlan:
    namespace: str
    pod: str
    resource_version: str
    held: tuple[str, ...]
    delete_options: dict[str, Any]
    event: EventNote

    def describe(self) -> list[str]:
        return [
            f"cancel pod {self.namespace}/{self.pod} (resourceVersion {self.resource_version}), "
            f"which holds {', '.join(self.held)}",
            f"create Event {self.event.reason}: {self.event.note}",
            f"then DELETE {PODS.path(self.namespace, self.pod)} with preconditions "
            + json.dumps(self.delete_options["preconditions"], sort_keys=True),
        ]


def plan_cancel(pod: dict[str, Any], by: Identity, reason: str) -> CancelPlan:
    """Delete a pod that still waits on Pilotfish gates, conditional on the version read.

    Refused for pods no longer gated by Pilotfish: once released the pod belongs to the
    scheduler and its workload, and deleting it is an ordinary `kubectl delete`, not a gate
    decision that should be recorded as one.
    """
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        raise Refused(f"pod {pod_ref(pod)} is already being deleted")
    held = gates.scheduling_gates(pod)
    ours = tuple(g for g in held if gates.is_pilotfish_gate(g))
    if not ours:
        raise Refused(
            f"pod {pod_ref(pod)} holds no Pilotfish gates (it holds: {_held_text(held)}); "
            "it is not waiting on Pilotfish, so cancel does not apply (use kubectl delete pod)"
        )
    why = _check_reason(reason)
    return CancelPlan(
        namespace=str(meta.get("namespace")),
        pod=str(meta.get("name")),
        resource_version=str(meta.get("resourceVersion", "")),
        held=ours,
        delete_options={
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {
                "uid": meta.get("uid"),
                "resourceVersion": str(meta.get("resourceVersion", "")),
            },
        },
        event=EventNote(
            REASON_CANCELLED,
            ACTION_CANCEL,
            f"gated pod cancelled by {by.username} while holding {', '.join(ours)}: {why}",
        ),
    )


def cancel_aborted(by: Identity, why: str) -> EventNote:
    """The Event that takes back a recorded cancellation that did not happen."""
    return EventNote(
        REASON_CANCEL_ABORTED, ACTION_CANCEL, f"cancel by {by.username} did not happen: {why}"
    )


def denial_lines(
    verb: str, err: ApiError, by: Identity | None, removes_gate: bool = False
) -> list[str]:
    """What to tell a person the API server refused: its own words, then who they are (and,
    for a gate removal, which group the gate-ownership policy lets through)."""
    lines = [f"error: the API server refused to {verb} ({err.status} {err.reason}):"]
    lines.append(f"  {err.message}")
    if err.status in (401, 403, 422) and by is not None:
        lines.append(f"you are {by.describe()}")
        if removes_gate and RELEASERS_GROUP not in by.groups:
            lines.append(
                f"removing Pilotfish gates by hand is for members of group {RELEASERS_GROUP} "
                "(and the Pilotfish operator); ask your cluster admins"
            )
    return lines
