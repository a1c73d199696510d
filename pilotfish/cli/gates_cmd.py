"""`kubectl pilotfish gates`: list gated pods, and the audited manual release and cancel.

Listing answers "what is waiting, on what, and for how much longer" from the creation-time
gate record the webhook wrote (pilotfish.gates), so it shows the terms the controller will
apply, not whatever the GatePolicy says today.

`release` and `cancel` are on-call's path when the gate controller is down (seeds B.8): each
is one conditional write decided from the pod as read, refused with a clear message when the
pod is not what the person thinks it is, and leaves three records of who did what and why:
an annotation on the pod (release), an events.k8s.io Event, and the API server's audit log
entry for the request itself. Who may do it is decided by the API server (RBAC plus the
chart's ValidatingAdmissionPolicy), never by this client: a denial is printed as the server
worded it.

The deciding is pure (`gate_rows`, `plan_release`, `plan_cancel`); the functions at the
bottom only read, call the pure functions and write.
"""

from __future__ import annotations

import datetime
import json
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, TextIO

from pilotfish import gates, timeutil
from pilotfish.cli.connect import Identity
from pilotfish.cli.output import human_duration, table
from pilotfish.kube.rest import EVENTS, PODS, STRATEGIC_MERGE_PATCH, ApiError
from pilotfish.names import GATE_PREFIX
from pilotfish.timeutil import parse_time_or_none as _time
from pilotfish.timeutil import utcnow

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
# events.k8s.io/v1 limits: note at most 1 kB, reportingInstance at most 128 characters.
NOTE_MAX: Final = 1024
INSTANCE_MAX: Final = 128

# Recorded as `by` when the API server will not say who the caller is.
UNKNOWN_USER: Final = "unknown (see the API server's audit log)"

DryRun = Literal["none", "client", "server"]


class Refused(Exception):
    """The request does not fit the pod as read; the message says why and what it holds."""


# --- listing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateRow:
    """One Pilotfish gate held by one pod, with its creation-time terms when recorded."""

    namespace: str
    pod: str
    gate: str
    created: datetime.datetime | None
    record: gates.GateRecord | None
    review: bool
    state: str | None  # reason of the gates.pilotfish.io/State condition

    @property
    def deadline(self) -> datetime.datetime | None:
        if self.record is None:
            return None
        try:
            return timeutil.parse_time(self.record.deadline)
        except ValueError:
            return None


def state_condition(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The gate controller's gates.pilotfish.io/State condition on `pod`, if any."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == gates.POD_CONDITION:
            return dict(cond)
    return None


def gate_rows(pods: Sequence[dict[str, Any]]) -> list[GateRow]:
    """One row per Pilotfish gate still on each pod, sorted by namespace, pod, gate.

    Gates of other owners are not listed: Pilotfish neither decides nor may remove them. A
    Pilotfish gate without a record (no GatePolicy put it there) is still listed, so a gate
    no controller will ever release is visible rather than silent.
    """
    rows: list[GateRow] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        held = [g for g in gates.scheduling_gates(pod) if gates.is_pilotfish_gate(g)]
        if not held:
            continue
        record = gates.read_record(pod)
        created = _time(record.created if record else None) or _time(meta.get("creationTimestamp"))
        review = (meta.get("labels") or {}).get(gates.LABEL_REVIEW) == "required"
        cond = state_condition(pod)
        for gate in held:
            rows.append(
                GateRow(
                    namespace=str(meta.get("namespace", "")),
                    pod=str(meta.get("name", "")),
                    gate=gate,
                    created=created,
                    record=record.gates.get(gate) if record else None,
                    review=review,
                    state=str(cond.get("reason")) if cond and cond.get("reason") else None,
                )
            )
    rows.sort(key=lambda r: (r.namespace, r.pod, r.gate))
    return rows


def condition_text(condition: dict[str, Any] | None) -> str:
    """`GateSignal(warehouse-export)`, `Gang(size=8)`, `Image(minNodes=2)`, `Quota`."""
    if not condition:
        return "-"
    kind = str(condition.get("type", "?"))
    if condition.get("signalName"):
        return f"{kind}({condition['signalName']})"
    if condition.get("size") is not None:
        return f"{kind}(size={condition['size']})"
    if condition.get("minNodes") is not None:
        return f"{kind}(minNodes={condition['minNodes']})"
    return kind


def deadline_text(deadline: datetime.datetime | None, now: datetime.datetime) -> str:
    """`in 4m12s`, or `EXPIRED 2m ago` once the deadline has passed; `-` when unknown."""
    if deadline is None:
        return "-"
    left = (deadline - now).total_seconds()
    if left <= 0:
        return f"EXPIRED {human_duration(-left)} ago"
    return f"in {human_duration(left)}"


HEADER: Final = (
    "NAMESPACE",
    "POD",
    "GATE",
    "CONDITION",
    "AGE",
    "DEADLINE",
    "ON-EXPIRY",
    "REVIEW",
    "STATE",
)


def render_table(rows: Sequence[GateRow], now: datetime.datetime, wide: bool = False) -> str:
    """kubectl-style table; `wide` adds the absolute deadline, the policy and its generation."""
    header = list(HEADER)
    if wide:
        header += ["DEADLINE-AT", "POLICY"]
    body = []
    for r in rows:
        cells = [
            r.namespace,
            r.pod,
            r.gate,
            condition_text(r.record.condition if r.record else None),
            human_duration((now - r.created).total_seconds()) if r.created else "-",
            deadline_text(r.deadline, now),
            r.record.on_expiry if r.record else "-",
            "required" if r.review else "-",
            r.state or "-",
        ]
        if wide:
            cells += [
                r.record.deadline if r.record else "-",
                f"{r.record.policy}@{r.record.generation}" if r.record else "-",
            ]
        body.append(cells)
    return table(header, body)


def rows_json(rows: Sequence[GateRow], now: datetime.datetime) -> dict[str, Any]:
    """The same facts, machine-readable, with absolute times and seconds as numbers."""
    items = []
    for r in rows:
        deadline = r.deadline
        items.append(
            {
                "namespace": r.namespace,
                "pod": r.pod,
                "gate": r.gate,
                "condition": r.record.condition if r.record else None,
                "policy": r.record.policy if r.record else None,
                "policyGeneration": r.record.generation if r.record else None,
                "createdAt": timeutil.format_time(r.created) if r.created else None,
                "ageSeconds": int((now - r.created).total_seconds()) if r.created else None,
                "deadline": r.record.deadline if r.record else None,
                "remainingSeconds": (
                    int((deadline - now).total_seconds()) if deadline is not None else None
                ),
                "expired": deadline is not None and deadline <= now,
                "onExpiry": r.record.on_expiry if r.record else None,
                "attempts": r.record.attempts if r.record else None,
                "review": r.review,
                "state": r.state,
                "recorded": r.record is not None,
            }
        )
    return {"items": items}


# --- planning the manual release and cancel ---------------------------------------------


def micro_time(t: datetime.datetime) -> str:
    """An API MicroTime (events.k8s.io eventTime)."""
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def event_body(
    pod: dict[str, Any],
    *,
    reason: str,
    action: str,
    note: str,
    now: datetime.datetime,
    instance: str,
) -> dict[str, Any]:
    """An events.k8s.io/v1 Event about `pod` from the plugin, at the version it was decided on."""
    meta = pod["metadata"]
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        # client-go's naming: the object's name and the event's time in hex nanoseconds
        # (generateName cannot be used: "name." is not a valid subdomain on its own).
        "metadata": {
            "name": f"{meta['name'][:230]}.{int(now.timestamp() * 1e9):x}",
            "namespace": meta["namespace"],
        },
        "eventTime": micro_time(now),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": _clip(instance, INSTANCE_MAX),
        "action": action,
        "reason": reason,
        "type": "Normal",
        "note": _clip(note, NOTE_MAX),
        "regarding": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
    }


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
    event: dict[str, Any]

    def describe(self) -> list[str]:
        keep = ", ".join(self.remaining) if self.remaining else "no gates"
        return [
            f"release gate {self.gate} on pod {self.namespace}/{self.pod} "
            f"(resourceVersion {self.resource_version}); the pod keeps {keep}",
            f"PATCH {PODS.path(self.namespace, self.pod)} ({STRATEGIC_MERGE_PATCH}):",
            "  " + json.dumps(self.patch, sort_keys=True),
            f"then create Event {self.event['reason']}: {self.event['note']}",
        ]


def plan_release(
    pod: dict[str, Any],
    requested_gate: str,
    by: Identity,
    reason: str,
    now: datetime.datetime,
    instance: str,
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
    at = timeutil.format_time(now)
    record = {"gate": gate, "by": by.username, "reason": why, "at": at}
    patch = gates.remove_gate_patch(gate)
    patch["metadata"] = {
        "resourceVersion": str(meta.get("resourceVersion", "")),
        "annotations": {ANNOTATION_MANUAL_RELEASE: json.dumps(record, sort_keys=True)},
    }
    note = f"gate {gate} released manually by {by.username}: {why}"
    return ReleasePlan(
        namespace=str(meta.get("namespace")),
        pod=str(meta.get("name")),
        gate=gate,
        resource_version=str(meta.get("resourceVersion", "")),
        remaining=tuple(g for g in held if g != gate),
        patch=patch,
        event=event_body(
            pod,
            reason=REASON_MANUALLY_RELEASED,
            action=ACTION_RELEASE,
            note=note,
            now=now,
            instance=instance,
        ),
    )


@dataclass(frozen=True)
class CancelPlan:
    namespace: str
    pod: str
    resource_version: str
    held: tuple[str, ...]
    delete_options: dict[str, Any]
    event: dict[str, Any]

    def describe(self) -> list[str]:
        return [
            f"cancel pod {self.namespace}/{self.pod} (resourceVersion {self.resource_version}), "
            f"which holds {', '.join(self.held)}",
            f"create Event {self.event['reason']}: {self.event['note']}",
            f"then DELETE {PODS.path(self.namespace, self.pod)} with preconditions "
            + json.dumps(self.delete_options["preconditions"], sort_keys=True),
        ]


def plan_cancel(
    pod: dict[str, Any],
    by: Identity,
    reason: str,
    now: datetime.datetime,
    instance: str,
) -> CancelPlan:
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
    note = f"gated pod cancelled by {by.username} while holding {', '.join(ours)}: {why}"
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
        event=event_body(
            pod,
            reason=REASON_CANCELLED,
            action=ACTION_CANCEL,
            note=note,
            now=now,
            instance=instance,
        ),
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


# --- doing it -----------------------------------------------------------------------------


class RestLike(Protocol):
    """The part of pilotfish.kube.rest.Rest these commands use (a fake in unit tests)."""

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = ...,
        body: Any = ...,
        content_type: str = ...,
        request_timeout: float | None = ...,
    ) -> dict[str, Any]: ...

    async def list_pages(
        self, path: str, params: dict[str, Any] | None = ..., page: int = ...
    ) -> tuple[list[dict[str, Any]], str]: ...


Clock = Callable[[], datetime.datetime]


async def list_gates(
    rest: RestLike,
    namespace: str | None,
    output: str,
    now: Clock = utcnow,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Print the gated pods of `namespace` (None: all namespaces the caller may list)."""
    path = PODS.path(namespace)
    try:
        pods, _ = await rest.list_pages(path, {"labelSelector": f"{gates.LABEL_GATED}=true"})
    except ApiError as e:
        print(f"error: cannot list pods: {e.message} ({e.status} {e.reason})", file=err)
        return 1
    rows = gate_rows(pods)
    t = now()
    if output == "json":
        print(json.dumps(rows_json(rows, t), indent=2), file=out)
        return 0
    if not rows:
        where = f"in namespace {namespace}" if namespace else "in any namespace"
        print(f"No pods hold Pilotfish gates {where}.", file=err)
        return 0
    print(render_table(rows, t, wide=output == "wide"), file=out)
    return 0


async def _read_pod(rest: RestLike, namespace: str, name: str) -> dict[str, Any]:
    return await rest.request("GET", PODS.path(namespace, name))


def _dry_params(dry_run: DryRun) -> dict[str, Any]:
    return {"dryRun": "All"} if dry_run == "server" else {}


async def _create_event(rest: RestLike, event: dict[str, Any], err: TextIO) -> bool:
    ns = event["metadata"]["namespace"]
    try:
        await rest.request("POST", EVENTS.path(ns), body=event)
    except ApiError as e:
        print(
            f"warning: could not record Event {event['reason']}: {e.message} "
            f"({e.status} {e.reason}); the API server's audit log still has the request",
            file=err,
        )
        return False
    return True


async def _identity(
    rest: RestLike, whoami: Callable[[Any], Awaitable[Identity]], err: TextIO
) -> Identity:
    """Who the API server says the caller is. If it will not say (SelfSubjectReview
    disabled or forbidden), go on: on-call must be able to act when things are broken, and
    the audit log records the authenticated user of every write regardless."""
    try:
        return await whoami(rest)
    except ApiError as e:
        print(
            f"warning: cannot tell who you are (SelfSubjectReview: {e.status} {e.message}); "
            "recording the user as unknown, the API server's audit log names you",
            file=err,
        )
        return Identity(UNKNOWN_USER)


async def release_gate(
    rest: RestLike,
    namespace: str,
    pod_name: str,
    gate: str,
    reason: str,
    *,
    whoami: Callable[[Any], Awaitable[Identity]],
    dry_run: DryRun = "none",
    now: Clock = utcnow,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Read, plan, patch conditionally; on a conflict re-read and try once more; then the Event.

    Exit code 0 when the gate was removed (or would be, on a dry run), 1 otherwise.
    """
    by = await _identity(rest, whoami, err)
    for attempt in (1, 2):
        try:
            pod = await _read_pod(rest, namespace, pod_name)
        except ApiError as e:
            print(f"error: cannot read pod {namespace}/{pod_name}: {e.message}", file=err)
            return 1
        try:
            plan = plan_release(pod, gate, by, reason, now(), reporting_instance(by))
        except Refused as e:
            print(f"error: {e}", file=err)
            return 1
        if dry_run != "none":
            for line in plan.describe():
                print(f"(dry run) {line}", file=out)
        if dry_run == "client":
            return 0
        try:
            await rest.request(
                "PATCH",
                PODS.path(namespace, pod_name),
                params=_dry_params(dry_run),
                body=plan.patch,
                content_type=STRATEGIC_MERGE_PATCH,
            )
        except ApiError as e:
            if e.conflict and attempt == 1:
                print(
                    f"pod {namespace}/{pod_name} changed since it was read (resourceVersion "
                    f"{plan.resource_version}); re-reading it and trying once more",
                    file=err,
                )
                continue
            if e.conflict:
                print(
                    f"error: pod {namespace}/{pod_name} changed again while releasing; "
                    "nothing was changed, check `kubectl pilotfish why` and retry",
                    file=err,
                )
                return 1
            verb = f"release {plan.gate} on {namespace}/{pod_name}"
            for line in denial_lines(verb, e, by, removes_gate=True):
                print(line, file=err)
            return 1
        if dry_run == "server":
            print("(dry run) the API server accepts this release; nothing was changed", file=out)
            return 0
        print(
            f"pod/{pod_name} released from {plan.gate} by {by.username}; it keeps "
            f"{', '.join(plan.remaining) if plan.remaining else 'no scheduling gates'}",
            file=out,
        )
        await _create_event(rest, plan.event, err)
        return 0
    return 1  # unreachable: the second attempt always returns


async def cancel_pod(
    rest: RestLike,
    namespace: str,
    pod_name: str,
    reason: str,
    *,
    whoami: Callable[[Any], Awaitable[Identity]],
    dry_run: DryRun = "none",
    now: Clock = utcnow,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Record the cancellation as an Event, then delete the pod conditional on the version read.

    The Event comes first so that the record exists even if this process dies right after the
    delete. A conflict (the pod changed, e.g. the controller released it) re-reads and
    re-plans once: if it is no longer gated, cancel is refused rather than deleting a pod
    that is now the scheduler's. If the delete does not happen after the Event was recorded,
    a GateCancelAborted Event says so, so the pod's history never claims a cancellation that
    did not take place.
    """
    by = await _identity(rest, whoami, err)
    recorded: dict[str, Any] | None = None  # the pod as it was when GateCancelled was recorded

    async def abort(why: str) -> int:
        print(f"error: {why}", file=err)
        if recorded is not None:
            note = f"cancel by {by.username} did not happen: {why}"
            await _create_event(
                rest,
                event_body(
                    recorded,
                    reason=REASON_CANCEL_ABORTED,
                    action=ACTION_CANCEL,
                    note=note,
                    now=now(),
                    instance=reporting_instance(by),
                ),
                err,
            )
        return 1

    for attempt in (1, 2):
        try:
            pod = await _read_pod(rest, namespace, pod_name)
        except ApiError as e:
            if e.not_found and recorded is not None:
                print(f"pod {namespace}/{pod_name} is already gone", file=out)
                return 0
            return await abort(f"cannot read pod {namespace}/{pod_name}: {e.message}")
        try:
            plan = plan_cancel(pod, by, reason, now(), reporting_instance(by))
        except Refused as e:
            return await abort(str(e))
        if dry_run != "none":
            for line in plan.describe():
                print(f"(dry run) {line}", file=out)
        if dry_run == "client":
            return 0
        if dry_run == "none" and recorded is None:
            await _create_event(rest, plan.event, err)
            recorded = pod
        try:
            await rest.request(
                "DELETE",
                PODS.path(namespace, pod_name),
                params=_dry_params(dry_run),
                body=plan.delete_options,
            )
        except ApiError as e:
            if e.conflict and attempt == 1:
                print(
                    f"pod {namespace}/{pod_name} changed since it was read (resourceVersion "
                    f"{plan.resource_version}); re-reading it and trying once more",
                    file=err,
                )
                continue
            if e.conflict:
                return await abort(
                    f"pod {namespace}/{pod_name} changed again while cancelling; not deleted"
                )
            if e.not_found:
                print(f"pod {namespace}/{pod_name} is already gone", file=out)
                return 0
            for line in denial_lines(f"delete pod {namespace}/{pod_name}", e, by):
                print(line, file=err)
            return await abort(f"pod {namespace}/{pod_name} was not deleted")
        if dry_run == "server":
            print("(dry run) the API server accepts this delete; nothing was changed", file=out)
            return 0
        print(f"pod/{pod_name} cancelled (deleted) by {by.username}", file=out)
        return 0
    return 1  # unreachable: the second attempt always returns
