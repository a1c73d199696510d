"""`kubectl pilotfish why POD`: why a pod is not running yet, in plain sentences (a batch
task also says which task it is and what it waits on first; `why bw/NAME` explains a whole
BatchWorkload: `whybatch`; a pod on a lost node, and an at-most-one pod: `whylost`; a batch
pod waiting for reclaimed capacity: `whyreclaim`).

The seeds' pitfall: calling SchedulingGated a scheduling failure. A gated pod was never tried
by the scheduler; an unschedulable one was tried and refused; a bound pod that does not run
is the kubelet's (image, crash, readiness) business. Each needs a different person and a
different fix, so `explain` first tells these apart and then quotes the evidence the cluster
already holds: the gate record and the gate controller's State condition, the scheduler's
PodScheduled message and FailedScheduling events, container states and the Ready condition.

`explain` is pure (pod, events, now) -> sentences; the command only reads and prints.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Sequence
from typing import Any, Final, TextIO

from pilotfish import gates
from pilotfish.cli.gates_list import condition_text, state_condition
from pilotfish.cli.output import ago, human_duration
from pilotfish.cli.whybatch import parse_target, run_batch, task_layer
from pilotfish.cli.whylost import lost_layer
from pilotfish.cli.whymaintenance import maintenance_name, run_maintenance
from pilotfish.cli.whyquota import quota_layer
from pilotfish.cli.whyreclaim import reclaim_layer
from pilotfish.kube.rest import PODS, ApiError, Resource, Rest
from pilotfish.timeutil import SYSTEM_CLOCK, Clock
from pilotfish.timeutil import parse_time_or_none as _time

CORE_EVENTS: Final = Resource("", "v1", "events")

IMAGE_REASONS: Final = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "RegistryUnavailable",
        "ImageInspectError",
        "SignatureValidationFailed",
    }
)
CREATING_REASONS: Final = frozenset({"ContainerCreating", "PodInitializing"})

ON_EXPIRY_MEANING: Final = {
    "Fail": "the pod is failed",
    "Retry": "the condition is retried with backoff",
    "Review": "the gate stays and the pod is flagged for a person to review",
}


def _condition(pod: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def _event_time(event: dict[str, Any]) -> datetime.datetime | None:
    """When an event was last seen: series, lastTimestamp, eventTime, then creation."""
    series = event.get("series") or {}
    for value in (
        series.get("lastObservedTime"),
        event.get("lastTimestamp"),
        event.get("deprecatedLastTimestamp"),
        event.get("eventTime"),
        event.get("firstTimestamp"),
        (event.get("metadata") or {}).get("creationTimestamp"),
    ):
        t = _time(value)
        if t is not None:
            return t
    return None


def _event_count(event: dict[str, Any]) -> int:
    series = event.get("series") or {}
    return int(series.get("count") or event.get("count") or event.get("deprecatedCount") or 1)


def latest_event(events: Sequence[dict[str, Any]], reason: str) -> dict[str, Any] | None:
    """The most recently seen event with `reason` (core/v1 or events.k8s.io/v1 shape)."""
    matching = [e for e in events if e.get("reason") == reason]
    if not matching:
        return None
    epoch = datetime.datetime.min.replace(tzinfo=datetime.UTC)
    return max(matching, key=lambda e: _event_time(e) or epoch)


def _event_text(event: dict[str, Any], now: datetime.datetime) -> str:
    message = str(event.get("message") or event.get("note") or "").strip()
    count = _event_count(event)
    times = f", {count} times" if count > 1 else ""
    return f"{message} ({ago(_event_time(event), now)}{times})"


def _gate_sentence(
    gate: str,
    record: gates.GateRecord | None,
    created: datetime.datetime | None,
    now: datetime.datetime,
) -> str:
    if record is None:
        return (
            f"{gate} has no creation-time record (annotation {gates.ANNOTATION_RECORD}): no "
            "GatePolicy put it there, so no Pilotfish controller will release it; release it "
            "with `kubectl pilotfish gates release` or cancel the pod."
        )
    cond = record.condition or {}
    what = {
        "GateSignal": f"signal '{cond.get('signalName')}' is raised",
        "Quota": "the team's quota admits the pod",
        "Image": f"its images are present on {cond.get('minNodes') or 1} node(s)",
        "Gang": f"{cond.get('size')} pods of its gang can be released together",
    }.get(str(cond.get("type")), f"its condition {condition_text(cond)} holds")
    source = f"from GatePolicy {record.policy} generation {record.generation}"
    if record.policy == gates.GANG_POLICY:
        what = (
            f"the spec.gang pods of BatchWorkload {cond.get('workload')} can be released together"
        )
        source = "put there for the BatchWorkload's gang"
    parts = [f"{gate} is removed when {what} ({condition_text(cond)}, {source})"]
    if created is not None:
        parts.append(f"it has waited {human_duration((now - created).total_seconds())}")
    deadline = _time(record.deadline)
    meaning = ON_EXPIRY_MEANING.get(record.on_expiry, record.on_expiry)
    if deadline is None:
        parts.append(f"its deadline '{record.deadline}' is unreadable")
    elif deadline > now:
        left = human_duration((deadline - now).total_seconds())
        parts.append(
            f"deadline {record.deadline} (in {left}), then onExpiry {record.on_expiry}: {meaning}"
        )
    else:
        late = human_duration((now - deadline).total_seconds())
        parts.append(
            f"its deadline {record.deadline} passed {late} ago (EXPIRED), onExpiry "
            f"{record.on_expiry}: {meaning}"
        )
    if record.attempts:
        parts.append(f"retried {record.attempts} time(s) so far")
    return "; ".join(parts) + "."


def _explain_gated(
    pod: dict[str, Any], ref: str, ours: list[str], others: list[str], now: datetime.datetime
) -> list[str]:
    lines: list[str] = []
    record = gates.read_record(pod)
    meta = pod.get("metadata") or {}
    created = _time(record.created if record else None) or _time(meta.get("creationTimestamp"))
    if ours:
        lines.append(
            f"Pod {ref} is gated: it waits on {len(ours)} Pilotfish gate(s) "
            f"({', '.join(ours)}) and the scheduler will not try to place it until they are "
            "removed (this is not a scheduling failure)."
        )
        for gate in ours:
            lines.append(
                _gate_sentence(gate, record.gates.get(gate) if record else None, created, now)
            )
        state = state_condition(pod)
        if state is None:
            lines.append(
                f"The gate controller has not reported on it yet (no {gates.POD_CONDITION} "
                "condition); if that lasts, check that the Pilotfish operator is running."
            )
        else:
            since = _time(state.get("lastTransitionTime"))
            message = str(state.get("message") or "").strip()
            lines.append(
                f"The gate controller reports {state.get('reason')} ({ago(since, now)})"
                + (f": {message}" if message else ".")
            )
        if (meta.get("labels") or {}).get(gates.LABEL_REVIEW) == "required":
            lines.append(
                f"It is flagged for human review ({gates.LABEL_REVIEW}=required): decide with "
                "`kubectl pilotfish gates release` or `kubectl pilotfish gates cancel`."
            )
        if others:
            lines.append(
                f"It also waits on {len(others)} gate(s) Pilotfish does not own: "
                f"{', '.join(others)}; their own controllers must remove them."
            )
    else:
        lines.append(
            f"Pod {ref} is gated by scheduling gate(s) Pilotfish does not own: "
            f"{', '.join(others)}. The scheduler will not try to place it until their owners "
            "remove them (this is not a scheduling failure)."
        )
    return lines


def _explain_unbound(
    pod: dict[str, Any], ref: str, events: Sequence[dict[str, Any]], now: datetime.datetime
) -> list[str]:
    scheduled = _condition(pod, "PodScheduled")
    failed = latest_event(events, "FailedScheduling")
    scheduler = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
    lines: list[str] = []
    if (scheduled and scheduled.get("status") == "False") or failed is not None:
        reason = (scheduled or {}).get("reason") or "Unschedulable"
        message = str((scheduled or {}).get("message") or "").strip()
        since = _time((scheduled or {}).get("lastTransitionTime"))
        head = f"Pod {ref} is unschedulable: {scheduler} tried and found no node for it"
        if message:
            head += f" ({reason}, {ago(since, now)}): {message}"
        lines.append(head.rstrip(".") + ".")
        if failed is not None:
            lines.append(f"Latest FailedScheduling event: {_event_text(failed, now)}.")
    else:
        lines.append(
            f"Pod {ref} waits for {scheduler} to place it: it is not gated and has not been "
            "tried yet (if this lasts, check that this scheduler is running)."
        )
    nominated = (pod.get("status") or {}).get("nominatedNodeName")
    if nominated:
        lines.append(
            f"It is nominated for node {nominated}: lower-priority pods are being preempted "
            "there to make room."
        )
    return lines


def _container_sentences(pod: dict[str, Any]) -> list[str]:
    status = pod.get("status") or {}
    images = {
        c.get("name"): c.get("image")
        for key in ("initContainers", "containers")
        for c in (pod.get("spec") or {}).get(key) or []
    }
    out: list[str] = []
    for key, kind in (
        ("initContainerStatuses", "Init container"),
        ("containerStatuses", "Container"),
    ):
        for cs in status.get(key) or []:
            name = cs.get("name")
            state = cs.get("state") or {}
            waiting = state.get("waiting")
            terminated = state.get("terminated")
            restarts = int(cs.get("restartCount") or 0)
            if waiting is not None:
                reason = str(waiting.get("reason") or "Waiting")
                message = str(waiting.get("message") or "").strip()
                detail = f": {message}" if message else ""
                if reason in IMAGE_REASONS:
                    image = cs.get("image") or images.get(name) or "?"
                    out.append(f"{kind} {name} cannot pull its image {image} ({reason}){detail}.")
                elif reason == "CrashLoopBackOff":
                    last = (cs.get("lastState") or {}).get("terminated") or {}
                    exit_text = (
                        f"; last exit: {last.get('reason') or 'terminated'} with code "
                        f"{last.get('exitCode')}"
                        if last
                        else ""
                    )
                    out.append(
                        f"{kind} {name} is crash-looping (restarted {restarts} times){exit_text}"
                        f"{detail}."
                    )
                elif reason in CREATING_REASONS:
                    out.append(f"{kind} {name} is being created ({reason}).")
                else:
                    out.append(f"{kind} {name} is waiting: {reason}{detail}.")
            elif terminated is not None:
                code = terminated.get("exitCode")
                if kind == "Init container" and code == 0:
                    continue
                reason = terminated.get("reason") or "Terminated"
                message = str(terminated.get("message") or "").strip()
                out.append(
                    f"{kind} {name} terminated: {reason} with exit code {code}"
                    + (f": {message}" if message else "")
                    + "."
                )
            elif "running" in state and kind == "Container" and not cs.get("ready"):
                out.append(
                    f"{kind} {name} is running but not ready (its readiness probe has not "
                    "passed yet)" + (f"; restarted {restarts} times" if restarts else "") + "."
                )
    return out


def explain(
    pod: dict[str, Any], events: Sequence[dict[str, Any]], now: datetime.datetime
) -> list[str]:
    """Why `pod` is where it is, as sentences; the first one is the verdict.

    Verdicts, in the order they are checked: being deleted, finished, gated (Pilotfish gates,
    other gates), not yet bound (unschedulable or not tried yet), bound but not running or
    not ready, running and ready.
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    ref = f"{meta.get('namespace')}/{meta.get('name')}"
    phase = status.get("phase") or "Pending"
    lines: list[str] = []

    deleting = _time(meta.get("deletionTimestamp"))
    if deleting is not None:
        lines.append(f"Pod {ref} is being deleted (requested {ago(deleting, now)}).")

    if phase in ("Succeeded", "Failed"):
        reason = status.get("reason")
        message = str(status.get("message") or "").strip()
        extra = f": {reason}" if reason else ""
        extra += f": {message}" if message else ""
        lines.append(f"Pod {ref} has finished: it {phase}{extra}.")
        if phase == "Failed":
            lines.extend(_container_sentences(pod))
        return lines

    held = gates.scheduling_gates(pod)
    if held:
        ours = [g for g in held if gates.is_pilotfish_gate(g)]
        others = [g for g in held if not gates.is_pilotfish_gate(g)]
        return lines + _explain_gated(pod, ref, ours, others, now)

    node = spec.get("nodeName")
    if not node:
        state = state_condition(pod)
        lines.extend(_explain_unbound(pod, ref, events, now))
        if state is not None and state.get("reason") == gates.STATE_EXPIRED:
            lines.append(f"Its Pilotfish gates expired: {str(state.get('message') or '').strip()}")
        return lines

    ready = _condition(pod, "Ready")
    containers = _container_sentences(pod)
    if phase == "Running" and ready and ready.get("status") == "True":
        since = _time(ready.get("lastTransitionTime"))
        lines.append(f"Pod {ref} is running on node {node} and ready ({ago(since, now)}).")
        return lines

    if phase == "Running":
        lines.append(f"Pod {ref} is running on node {node} but is not ready.")
    else:
        lines.append(
            f"Pod {ref} is bound to node {node} but not running yet (phase {phase}): the "
            "scheduler's part is done; the node's kubelet has not started it."
        )
    lines.extend(containers)
    if ready and ready.get("status") != "True":
        reason = ready.get("reason") or "NotReady"
        message = str(ready.get("message") or "").strip()
        lines.append(
            f"Ready is {ready.get('status')}: {reason}" + (f": {message}." if message else ".")
        )
    return lines


async def run(
    rest: Rest,
    namespace: str,
    name: str,
    clock: Clock = SYSTEM_CLOCK,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Read the pod and its events, print the explanation; 1 if the pod cannot be read."""
    try:
        pod = await rest.request("GET", PODS.path(namespace, name))
    except ApiError as e:
        print(f"error: cannot read pod {namespace}/{name}: {e.message}", file=err)
        return 1
    uid = (pod.get("metadata") or {}).get("uid")
    try:
        events, _ = await rest.list_pages(
            CORE_EVENTS.path(namespace),
            {"fieldSelector": f"involvedObject.uid={uid},involvedObject.kind=Pod"},
        )
    except ApiError as e:
        print(f"warning: cannot read the pod's events ({e.status} {e.message})", file=err)
        events = []
    now = clock.now()
    lines = [*await task_layer(rest, pod, err), *explain(pod, events, now)]
    lines += await reclaim_layer(rest, pod, events, err)
    for line in [*lines, *await lost_layer(rest, pod, now, err)]:
        print(line, file=out)
    sentence = await quota_layer(rest, pod, namespace, err)
    if sentence:
        print(sentence, file=out)
    return 0


async def run_target(
    rest: Rest,
    namespace: str,
    target: str,
    clock: Clock = SYSTEM_CLOCK,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """`why POD`, `why pod/NAME`, `why bw/NAME` or `why nm/NAME` (2 for another kind)."""
    if (maintenance := maintenance_name(target)) is not None:
        return await run_maintenance(rest, maintenance, clock, out, err)
    try:
        kind, name = parse_target(target)
    except ValueError as e:
        print(f"error: {e}", file=err)
        return 2
    if kind == "batchworkload":
        return await run_batch(rest, namespace, name, clock, out, err)
    return await run(rest, namespace, name, clock, out, err)
