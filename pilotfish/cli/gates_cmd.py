"""`kubectl pilotfish gates`: list gated pods, and the audited manual release and cancel.

`release` and `cancel` are on-call's path when the gate controller is down (seeds B.8): each
is one conditional write decided from the pod as read, refused with a clear message when the
pod is not what the person thinks it is, and leaves three records of who did what and why:
an annotation on the pod (release), an events.k8s.io Event, and the API server's audit log
entry for the request itself. Who may do it is decided by the API server (RBAC plus the
chart's ValidatingAdmissionPolicy), never by this client: a denial is printed as the server
worded it.

The deciding is pure (`gates_list`, `gates_plan`); this module reads, plans and writes, both
commands through the one `read_plan_write`, and records Events through the same recorder
the controllers use.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TextIO, TypeVar

from pilotfish import timeutil
from pilotfish.cli.connect import Identity
from pilotfish.cli.gates_list import list_gates
from pilotfish.cli.gates_plan import (
    ANNOTATION_MANUAL_RELEASE,
    REASON_CANCELLED,
    REASON_MANUALLY_RELEASED,
    RELEASERS_GROUP,
    REPORTING_CONTROLLER,
    UNKNOWN_USER,
    CancelPlan,
    EventNote,
    Refused,
    cancel_aborted,
    denial_lines,
    plan_cancel,
    plan_release,
    reporting_instance,
)
from pilotfish.kube.events import EventRecorder
from pilotfish.kube.rest import PODS, STRATEGIC_MERGE_PATCH, ApiError, Rest

__all__ = [
    "ANNOTATION_MANUAL_RELEASE",
    "REASON_CANCELLED",
    "REASON_MANUALLY_RELEASED",
    "RELEASERS_GROUP",
    "DryRun",
    "cancel_pod",
    "list_gates",
    "read_plan_write",
    "release_gate",
]

DryRun = Literal["none", "client", "server"]
WhoAmI = Callable[[Rest], Awaitable[Identity]]


class Plan(Protocol):
    @property
    def resource_version(self) -> str: ...

    def describe(self) -> list[str]: ...


P = TypeVar("P", bound=Plan)


@dataclass(frozen=True)
class Outcome(Generic[P]):
    """How a read-plan-write ended; the command turns it into words and an exit code.

    written: the write was accepted (on a server dry run: would be); client: a client dry
    run planned and stopped; unreadable: the GET failed (`error`); refused: the plan did not
    fit the pod (`refusal`); conflict: the pod changed twice under us; failed: the write was
    refused for another reason (`error`).
    """

    kind: Literal["written", "client", "unreadable", "refused", "conflict", "failed"]
    plan: P | None = None
    pod: dict[str, Any] | None = None  # as read and planned from
    error: ApiError | None = None
    refusal: str = ""


async def read_plan_write(
    rest: Rest,
    namespace: str,
    name: str,
    *,
    plan: Callable[[dict[str, Any]], P],
    write: Callable[[P, dict[str, Any]], Awaitable[object]],
    dry_run: DryRun,
    before_write: Callable[[dict[str, Any], P], Awaitable[None]] | None = None,
    out: TextIO,
    err: TextIO,
) -> Outcome[P]:
    """Read the pod, plan from it, write conditionally on the version read; on a conflict
    re-read and re-plan once (the second plan may refuse: the pod is no longer what it was).

    `write(plan, params)` gets the dry-run query parameters; `before_write` runs before each
    real write (cancel records its Event there, before the delete).
    """
    for attempt in (1, 2):
        try:
            pod = await rest.request("GET", PODS.path(namespace, name))
        except ApiError as e:
            return Outcome("unreadable", error=e)
        try:
            planned = plan(pod)
        except Refused as e:
            return Outcome("refused", refusal=str(e))
        if dry_run != "none":
            for line in planned.describe():
                print(f"(dry run) {line}", file=out)
        if dry_run == "client":
            return Outcome("client", planned, pod)
        if before_write is not None and dry_run == "none":
            await before_write(pod, planned)
        try:
            await write(planned, {"dryRun": "All"} if dry_run == "server" else {})
        except ApiError as e:
            if e.conflict and attempt == 1:
                print(
                    f"pod {namespace}/{name} changed since it was read (resourceVersion "
                    f"{planned.resource_version}); re-reading it and trying once more",
                    file=err,
                )
                continue
            return Outcome("conflict" if e.conflict else "failed", planned, pod, e)
        return Outcome("written", planned, pod)
    raise AssertionError("unreachable: the second attempt always returns")


class _Recorder:
    """This run's Events: written at once (the process is about to exit), and a failure is
    told to the person, since the audit log then is the only record."""

    def __init__(self, rest: Rest, by: Identity, clock: timeutil.Clock, err: TextIO) -> None:
        self.events = EventRecorder(rest, REPORTING_CONTROLLER, reporting_instance(by), clock=clock)
        self.err = err

    async def record(self, pod: dict[str, Any], event: EventNote) -> bool:
        written = await self.events.emit(pod, event.reason, event.note, action=event.action)
        if written is None:
            print(
                f"warning: could not record Event {event.reason}; the API server's audit log "
                "still has the request",
                file=self.err,
            )
        return written is not None


async def _identity(rest: Rest, whoami: WhoAmI, err: TextIO) -> Identity:
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
    rest: Rest,
    namespace: str,
    pod_name: str,
    gate: str,
    reason: str,
    *,
    whoami: WhoAmI,
    dry_run: DryRun = "none",
    clock: timeutil.Clock = timeutil.SYSTEM_CLOCK,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Remove one gate (conditional patch), then record the Event.

    Exit code 0 when the gate was removed (or would be, on a dry run), 1 otherwise.
    """
    by = await _identity(rest, whoami, err)
    ref = f"{namespace}/{pod_name}"
    done = await read_plan_write(
        rest,
        namespace,
        pod_name,
        plan=lambda pod: plan_release(pod, gate, by, reason, clock.now()),
        write=lambda plan, params: rest.request(
            "PATCH",
            PODS.path(namespace, pod_name),
            params=params,
            body=plan.patch,
            content_type=STRATEGIC_MERGE_PATCH,
        ),
        dry_run=dry_run,
        out=out,
        err=err,
    )
    plan = done.plan
    if done.kind == "unreadable" and done.error is not None:
        print(f"error: cannot read pod {ref}: {done.error.message}", file=err)
    elif done.kind == "refused":
        print(f"error: {done.refusal}", file=err)
    elif done.kind == "conflict":
        print(
            f"error: pod {ref} changed again while releasing; "
            "nothing was changed, check `kubectl pilotfish why` and retry",
            file=err,
        )
    elif done.kind == "failed" and done.error is not None and plan is not None:
        for line in denial_lines(f"release {plan.gate} on {ref}", done.error, by, True):
            print(line, file=err)
    elif done.kind == "client":
        return 0
    elif done.kind == "written" and plan is not None:
        if dry_run == "server":
            print("(dry run) the API server accepts this release; nothing was changed", file=out)
            return 0
        keeps = ", ".join(plan.remaining) if plan.remaining else "no scheduling gates"
        print(
            f"pod/{pod_name} released from {plan.gate} by {by.username}; it keeps {keeps}", file=out
        )
        await _Recorder(rest, by, clock, err).record(done.pod or {}, plan.event)
        return 0
    return 1


async def cancel_pod(
    rest: Rest,
    namespace: str,
    pod_name: str,
    reason: str,
    *,
    whoami: WhoAmI,
    dry_run: DryRun = "none",
    clock: timeutil.Clock = timeutil.SYSTEM_CLOCK,
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
    ref = f"{namespace}/{pod_name}"
    events = _Recorder(rest, by, clock, err)
    recorded: dict[str, Any] | None = None  # the pod as it was when GateCancelled was recorded

    async def record_first(pod: dict[str, Any], plan: CancelPlan) -> None:
        nonlocal recorded
        if recorded is None:
            await events.record(pod, plan.event)
            recorded = pod

    async def abort(why: str) -> int:
        print(f"error: {why}", file=err)
        if recorded is not None:
            await events.record(recorded, cancel_aborted(by, why))
        return 1

    done = await read_plan_write(
        rest,
        namespace,
        pod_name,
        plan=lambda pod: plan_cancel(pod, by, reason),
        write=lambda plan, params: rest.request(
            "DELETE", PODS.path(namespace, pod_name), params=params, body=plan.delete_options
        ),
        dry_run=dry_run,
        before_write=record_first,
        out=out,
        err=err,
    )
    gone = done.error is not None and done.error.not_found
    if done.kind == "unreadable" and done.error is not None:
        if gone and recorded is not None:
            print(f"pod {ref} is already gone", file=out)
            return 0
        return await abort(f"cannot read pod {ref}: {done.error.message}")
    if done.kind == "refused":
        return await abort(done.refusal)
    if done.kind == "conflict":
        return await abort(f"pod {ref} changed again while cancelling; not deleted")
    if done.kind == "failed" and done.error is not None:
        if gone:
            print(f"pod {ref} is already gone", file=out)
            return 0
        for line in denial_lines(f"delete pod {ref}", done.error, by):
            print(line, file=err)
        return await abort(f"pod {ref} was not deleted")
    if dry_run == "server":
        print("(dry run) the API server accepts this delete; nothing was changed", file=out)
    elif dry_run == "none":
        print(f"pod/{pod_name} cancelled (deleted) by {by.username}", file=out)
    return 0
