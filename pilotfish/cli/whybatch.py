"""The batch layer of `kubectl pilotfish why`: which task a pod is and what it waits on first,
and `why bw/NAME` for a whole BatchWorkload.

A task pod can wait on four different things, each someone else's to fix: its gang (the
other members must exist and be ready: the batch operator creates them), its team's quota
(the team's budget), another gate, or the scheduler (no node fits). Telling which one comes
first saves reading the rest. A BatchWorkload's tasks that do not exist yet wait on none of
those: their creation is paced to what the scheduler can place, and the batch operator
reports that pacing in the workload's status, which is read here defensively (any field may
be absent while the operator has not written it).

The `explain_*` functions are pure (objects, now) -> sentences; `task_layer` and `run_batch`
only read and print.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TextIO

from pilotfish import gates, workloads
from pilotfish.cli.output import ago
from pilotfish.kube.rest import BATCHWORKLOADS, PODS, ApiError, Rest
from pilotfish.timeutil import SYSTEM_CLOCK, Clock
from pilotfish.timeutil import parse_time_or_none as _time

BATCH_KINDS: Final = frozenset(
    {"bw", "bws", "batchworkload", "batchworkloads", "batchworkload.pilotfish.io"}
)
POD_KINDS: Final = frozenset({"po", "pod", "pods"})
# Gates a gang member may still hold and be ready: the gang's own, and quota, which is
# checked for the gang as a whole at its release.
JOINT_GATES: Final = frozenset({gates.GANG_GATE, gates.QUOTA_GATE})


def parse_target(target: str) -> tuple[str, str]:
    """("pod" | "batchworkload", name) of `POD`, `pod/NAME`, `bw/NAME`; ValueError else."""
    kind, sep, name = target.partition("/")
    if not sep:
        return "pod", target
    if not name or "/" in name:
        raise ValueError(f"'{target}' is not KIND/NAME")
    if kind.lower() in POD_KINDS:
        return "pod", name
    if kind.lower() in BATCH_KINDS:
        return "batchworkload", name
    raise ValueError(
        f"cannot explain a {kind}: `why` takes POD, pod/NAME, bw/NAME or batchworkload/NAME"
    )


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


# --- a task pod ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """Which task a pod is: its BatchWorkload (name, and uid from the owner reference), its
    index and attempt (as the batch operator labels and annotates it)."""

    workload: str
    uid: str
    index: str
    attempt: str


def task_of(pod: Mapping[str, Any]) -> Task | None:
    meta = _meta(pod)
    labels = meta.get("labels") or {}
    owner = gates.batch_owner(pod)
    name = owner[0] if owner else str(labels.get(workloads.LABEL_BATCH) or "")
    if not name:
        return None
    return Task(
        workload=name,
        uid=owner[1] if owner else "",
        index=str(labels.get(workloads.LABEL_TASK_INDEX) or "?"),
        attempt=str((meta.get("annotations") or {}).get(workloads.ANNOTATION_TASK_ATTEMPT) or "?"),
    )


def _is_own(task: Task, bw: Mapping[str, Any] | None) -> bool:
    return bw is not None and (not task.uid or _meta(bw).get("uid") == task.uid)


def _gang_size(task: Task, bw: Mapping[str, Any] | None) -> tuple[int | None, str]:
    where = f"BatchWorkload {task.workload}"
    if bw is None:
        return None, f"{where} was not found"
    if not _is_own(task, bw):
        return None, f"{where} is another object now (uid {_meta(bw).get('uid')}), not this pod's"
    size = _int((bw.get("spec") or {}).get("gang"))
    if size is None or size < 1:
        return None, f"{where} has no usable spec.gang"
    return size, ""


def _alive_member(task: Task, pod: Mapping[str, Any]) -> bool:
    meta = _meta(pod)
    owner = gates.batch_owner(pod)
    phase = (pod.get("status") or {}).get("phase")
    return (
        (meta.get("labels") or {}).get(gates.LABEL_GANG) == task.workload
        and owner is not None
        and owner[0] == task.workload
        and (not task.uid or owner[1] == task.uid)
        and phase not in ("Succeeded", "Failed")
        and not meta.get("deletionTimestamp")
    )


def _ready(pod: Mapping[str, Any]) -> bool:
    held = {g for g in gates.scheduling_gates(pod) if gates.is_pilotfish_gate(g)}
    return held <= JOINT_GATES


def gang_sentence(
    task: Task, bw: Mapping[str, Any] | None, members: Sequence[Mapping[str, Any]]
) -> str:
    """What the gang of a pod still holding the gang gate waits for, counted from its
    members (the alive pods of the namespace with the gang label, owned by the workload)."""
    size, problem = _gang_size(task, bw)
    if size is None:
        return (
            f"It waits first on its gang, which cannot be sized: {problem}; the gate "
            "controller holds the gang gate until it can."
        )
    alive = [m for m in members if _alive_member(task, m)]
    ready = [m for m in alive if _ready(m)]
    head = (
        f"It waits first on its gang: {len(alive)} of {size} member pods exist, "
        f"{len(ready)} ready (spec.gang {size} of BatchWorkload {task.workload})"
    )
    if len(alive) < size:
        return head + "; all go to the scheduler together once all exist and are ready."
    if len(ready) < len(alive):
        return head + "; the others wait on their own gates first."
    if any(gates.QUOTA_GATE in gates.scheduling_gates(m) for m in alive):
        return head + "; together they wait for their team's quota to fit the whole gang."
    return (
        head + "; the gate controller releases them together in its next round (if this "
        "lasts, check that the Pilotfish operator is running)."
    )


def first_wait(
    pod: Mapping[str, Any],
    task: Task,
    bw: Mapping[str, Any] | None,
    members: Sequence[Mapping[str, Any]],
) -> str:
    """The first thing the task waits on, in the order they are passed: gang, quota, any
    other gate, the scheduler; or that it waits on nothing of these any more."""
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    if phase in ("Succeeded", "Failed"):
        return f"It waits on nothing: the task's pod has finished ({phase})."
    held = gates.scheduling_gates(pod)
    if gates.GANG_GATE in held:
        return gang_sentence(task, bw, members)
    if gates.QUOTA_GATE in held:
        return (
            "It waits first on quota: its team's batch quota has no room for it yet (the "
            "quota line says how much); the gate controller releases it when there is."
        )
    if held:
        return f"It waits first on gate(s) {', '.join(held)} (below)."
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        scheduled = next(
            (
                c
                for c in (pod.get("status") or {}).get("conditions") or []
                if c.get("type") == "PodScheduled"
            ),
            None,
        )
        if scheduled and scheduled.get("status") == "False":
            message = str(scheduled.get("message") or scheduled.get("reason") or "").strip()
            return f"It waits first on the scheduler, which found no node: {message}"
        return "It waits first on the scheduler: not gated, not placed yet."
    return f"It is past the scheduler: bound to node {node} (phase {phase})."


def explain_task(
    pod: Mapping[str, Any],
    task: Task,
    bw: Mapping[str, Any] | None,
    members: Sequence[Mapping[str, Any]],
) -> list[str]:
    meta = _meta(pod)
    ns = meta.get("namespace")
    head = (
        f"Pod {ns}/{meta.get('name')} is task {task.index} (attempt {task.attempt}) of "
        f"BatchWorkload {ns}/{task.workload}"
    )
    if bw is None:
        head += " (not found: deleted? its pods are then garbage collected)"
    elif not _is_own(task, bw):
        head += " (a workload of that name with another uid exists: this pod's was deleted)"
    return [head + ".", first_wait(pod, task, bw, members)]


async def task_layer(rest: Rest, pod: Mapping[str, Any], err: TextIO) -> list[str]:
    """The task sentences of a task pod ([] for any other pod): reads its BatchWorkload and,
    while it holds the gang gate, its gang's pods."""
    task = task_of(pod)
    if task is None:
        return []
    ns = str(_meta(pod).get("namespace") or "")
    bw: dict[str, Any] | None = None
    try:
        bw = await rest.get(BATCHWORKLOADS.path(ns, task.workload))
    except ApiError as e:
        if not e.not_found:
            print(f"warning: cannot read BatchWorkload {ns}/{task.workload} ({e.status})", file=err)
    members: list[dict[str, Any]] = []
    if gates.GANG_GATE in gates.scheduling_gates(pod):
        try:
            selector = f"{gates.LABEL_GANG}={task.workload}"
            members, _ = await rest.list_pages(PODS.path(ns), {"labelSelector": selector})
        except ApiError as e:
            print(f"warning: cannot list the gang's pods ({e.status} {e.message})", file=err)
    return explain_task(pod, task, bw, members)


# --- a BatchWorkload ----------------------------------------------------------------------


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == kind:
            return c
    return None


def _pacing_sentence(status: Mapping[str, Any], spec: Mapping[str, Any]) -> str | None:
    waiting = _int(status.get("waiting"))
    if waiting is None:
        return "How many tasks wait to be created is not reported yet (no status.waiting)."
    if waiting == 0:
        return None
    pacing = status.get("pacing")
    text = (
        f"{waiting} task(s) wait to be created: creation is paced to what the scheduler can place"
    )
    if not isinstance(pacing, Mapping):
        return text + " (status.pacing not written yet)."
    in_flight, limit = _int(pacing.get("inFlight")), _int(pacing.get("limit"))
    rate = _number(pacing.get("bindsPerSecond"))
    parts = [
        f"{in_flight if in_flight is not None else '?'} created-but-unbound pod(s) in flight",
        f"limit {limit if limit is not None else '?'} now",
        f"binds measured at {rate:g}/s" if rate is not None else "bind rate not measured yet",
    ]
    text += f" ({', '.join(parts)})"
    held = _int(pacing.get("heldForProduction"))
    yielded = _number(pacing.get("yieldRate"))
    allowed = _number(pacing.get("createRate"))
    queueing = _number(pacing.get("apiQueueingSeconds"))
    cap = _number(spec.get("creationRate"))
    if held:
        text += f"; holding creation: {held} production pods waiting for placement"
    elif yielded:
        text += f"; yielding to production pods arriving: at most {yielded:g} creates/s"
    elif allowed and (cap is None or allowed < cap):
        late = f" (now {queueing * 1000:.0f} ms)" if queueing is not None else ""
        text += (
            f"; backing off while the API server queues: at most {allowed:g} creates/s, "
            "paced on how late its watch shows the operator's own writes" + late
        )
    elif in_flight is not None and limit is not None and in_flight >= limit:
        text += "; at the limit, the next task is created as soon as one of those binds"
    if cap is not None:
        text += f"; creation is also capped at spec.creationRate {cap:g}/s"
    return text + "."


def explain_batch(bw: Mapping[str, Any], now: datetime.datetime) -> list[str]:
    """Progress, whether it is suspended or finished, and what its uncreated tasks wait on."""
    meta = _meta(bw)
    spec = bw.get("spec") or {}
    ref = f"{meta.get('namespace')}/{meta.get('name')}"
    status = bw.get("status")
    completions = _int(spec.get("completions"))
    total = completions if completions is not None else "?"
    if not isinstance(status, Mapping) or not status:
        return [
            f"BatchWorkload {ref} ({total} tasks): its status is not written yet, the batch "
            "operator has not reported on it (if this lasts, check that the Pilotfish operator "
            "is running)."
        ]

    def count(key: str) -> str:
        value = _int(status.get(key))
        return str(value) if value is not None else "?"

    limit = _int(spec.get("backoffLimit"))
    lines = [
        f"BatchWorkload {ref}: {count('succeeded')} of {total} tasks succeeded, "
        f"{count('active')} active, {count('failed')} failed (backoffLimit "
        f"{limit if limit is not None else 6}), {count('disrupted')} disrupted (recreated, "
        "not counted)."
    ]
    generation, observed = _int(meta.get("generation")), _int(status.get("observedGeneration"))
    if generation is not None and observed is not None and observed < generation:
        lines.append(
            f"The batch operator has not acted on the latest spec yet (generation "
            f"{generation}, observed {observed})."
        )
    for kind, verb in (("Complete", "is complete"), ("Failed", "has failed")):
        cond = _condition(status, kind)
        if cond is not None and cond.get("status") == "True":
            when = ago(_time(cond.get("lastTransitionTime")), now)
            message = str(cond.get("message") or "").strip()
            lines.append(
                f"It {verb} ({cond.get('reason') or kind}, {when})"
                + (f": {message}" if message else ".")
            )
            return lines
    suspended = _condition(status, "Suspended")
    if spec.get("suspend") is True:
        shown = suspended is not None and suspended.get("status") == "True"
        lines.append(
            "It is suspended (spec.suspend): no task pods are created"
            + ("." if shown else "; the batch operator has not confirmed it yet.")
        )
        return lines
    if suspended is not None and suspended.get("status") == "True":
        lines.append("It is being resumed: spec.suspend is false, the Suspended condition not yet.")
    else:
        lines.append("It is not suspended.")
    pacing = _pacing_sentence(status, spec)
    if pacing:
        lines.append(pacing)
    gang = _int(spec.get("gang"))
    if gang:
        lines.append(
            f"Its first {gang} tasks form a gang (spec.gang) released together; `kubectl "
            "pilotfish why` on one of them says how many exist."
        )
    return lines


async def run_batch(
    rest: Rest,
    namespace: str,
    name: str,
    clock: Clock = SYSTEM_CLOCK,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    try:
        bw = await rest.get(BATCHWORKLOADS.path(namespace, name))
    except ApiError as e:
        print(f"error: cannot read BatchWorkload {namespace}/{name}: {e.message}", file=err)
        return 1
    for line in explain_batch(bw, clock.now()):
        print(line, file=out)
    return 0
