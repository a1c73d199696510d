"""One round's decision for a ServiceWorkload: observed snapshot in, `Plan` out. Pure.

The phases, in the order the Deployment controller runs them:

1. sync (`sync`): the template's ControllerRevision and the PodDisruptionBudget; a round
   that must record a revision stops there (pods of it wait for it to be visible);
2. rolling (`rolling.plan`): pods to create, drain and delete within the budget; for an
   `atMostOne` workload the fencing phase (`atmostone`) instead, which replaces, never surges;
   while nodes it runs on are drained for maintenance, a surge-first workload plans for
   `replicas` plus its pods there (`drain`), so the drain's replacements start first;
3. progress (`progress`): complete, paused, progressing or stalled at the deadline;
4. status (`status.compute_status`): counts and conditions, computed last and from the
   pods observed at the start of the round, never from what the round is about to do;
   then the history beyond its limit.

Every write in the plan is conditional on what it was decided from (a `test` of the
resourceVersion, a uid precondition, a name chosen before the create), so a plan decided
from a view that turned out stale is refused, not half-applied on top of someone's change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pilotfish.api.serviceworkload import PROGRESSING
from pilotfish.operators.serviceworkload import atmostone, drain, rolling
from pilotfish.operators.serviceworkload import progress as prog
from pilotfish.operators.serviceworkload import revisions as revs
from pilotfish.operators.serviceworkload.model import Event, Observed, parse_time, pod_state
from pilotfish.operators.serviceworkload.status import (
    compute_status,
    drop_condition,
    put_condition,
    stable_revision,
    transition_time,
)
from pilotfish.operators.serviceworkload.sync import (
    PdbWrite,
    RecordRevision,
    decide_sync,
    prune,
)
from pilotfish.timeutil import format_micro_time, format_time
from pilotfish.workloads import ANNOTATION_DRAIN

Obj = dict[str, Any]

EVENT_INVALID_SPEC: Final = "InvalidSpec"
EVENT_ROLLOUT_COMPLETE: Final = prog.REASON_COMPLETE
EVENT_STALLED: Final = prog.REASON_DEADLINE_EXCEEDED


@dataclass(frozen=True)
class CreatePods:
    revision: str
    count: int
    template: Mapping[str, Any] | None  # None: the revision's ControllerRevision is gone


@dataclass(frozen=True)
class DrainPod:
    name: str
    patch: list[Obj]  # JSON patch with a `test` of the pod's resourceVersion


@dataclass(frozen=True)
class DeletePod:
    name: str
    uid: str | None  # the delete's precondition: never a same-named pod of someone else
    reason: str


PodWrite = DrainPod | DeletePod


@dataclass(frozen=True)
class StatusWrite:
    status: Obj
    resource_version: str  # of the workload the status was computed from
    announce: Event | None = None  # posted once the status is written


@dataclass(frozen=True)
class Plan:
    key: str
    sw: Obj  # what the Events regard
    events: tuple[Event, ...] = ()  # posted whatever the writes do
    revision: RecordRevision | None = None
    pdb: PdbWrite | None = None
    takedowns: tuple[PodWrite, ...] = ()
    creates: tuple[CreatePods, ...] = ()
    status: StatusWrite | None = None
    prune: tuple[revs.RevisionInfo, ...] = ()
    # An atMostOne workload's steps (instead of `takedowns` and `creates`), and the template
    # of the revision its next pod runs.
    fencing: atmostone.FencingPlan | None = None
    fencing_template: Mapping[str, Any] | None = None
    # The earliest moment (wall time) the decision would change with no event.
    wake_at: float | None = None
    state: prog.State | None = None  # for the rollout-state gauge
    summary: Mapping[str, Any] = field(default_factory=dict)  # for the log


def invalid(key: str, sw: Obj, problem: str) -> Plan:
    note = f"cannot act on this spec: {problem}"
    return Plan(key, sw, events=(Event(EVENT_INVALID_SPEC, note, "Sync", "Warning"),))


def drain_patch(pod: Mapping[str, Any], now: str) -> list[Obj]:
    """Ask for the pod to leave rotation, only on the version decided from (JSON patch)."""
    meta = pod["metadata"]
    annotations = dict(meta.get("annotations") or {})
    annotations[ANNOTATION_DRAIN] = now
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
        {"op": "add", "path": "/metadata/annotations", "value": annotations},
    ]


def pod_writes(
    obs: Observed, plan: rolling.Plan, templates: Mapping[str, Mapping[str, Any]]
) -> tuple[tuple[PodWrite, ...], tuple[CreatePods, ...]]:
    """The planner's actions as conditional writes on the pods they were decided from."""
    by_name = {str(p["metadata"]["name"]): p for p in obs.pods}
    stamp = format_micro_time(obs.at)
    takedowns: list[PodWrite] = []
    creates: list[CreatePods] = []
    for action in plan.actions:
        if isinstance(action, rolling.Create):
            tpl = templates.get(action.revision)
            creates.append(CreatePods(action.revision, action.count, tpl))
            continue
        pod = by_name[action.pod]
        if isinstance(action, rolling.Drain):
            takedowns.append(DrainPod(action.pod, drain_patch(pod, stamp)))
        else:
            uid = pod["metadata"].get("uid")
            takedowns.append(DeletePod(action.pod, str(uid) if uid else None, action.reason))
    return tuple(takedowns), tuple(creates)


def fencing_summary(fence: atmostone.FencingPlan) -> dict[str, Any]:
    lease = fence.lease.body if fence.lease else None
    return {
        "at_most_one": fence.condition[1],
        "lease_epoch": atmostone.epoch_of(lease) if lease else None,
        "fenced_deletes": [d.name for d in fence.deletes],
        "fenced_create": fence.create.name if fence.create else None,
    }


def announcement(previous: Mapping[str, Any], status: Obj, verdict: prog.Progress) -> Event | None:
    """An Event when a rollout completes or stalls (the transitions people wait for)."""

    def progressing(s: Mapping[str, Any]) -> Mapping[str, Any]:
        return next((c for c in s.get("conditions") or [] if c.get("type") == PROGRESSING), {})

    before, after = progressing(previous), progressing(status)
    if before.get("reason") == after.get("reason"):
        return None
    message = str(after.get("message", ""))
    if verdict.state == "stalled":
        return Event(EVENT_STALLED, message, "Rollout", "Warning")
    if verdict.state == "complete":
        return Event(EVENT_ROLLOUT_COMPLETE, message, "Rollout")
    return None


def decide(obs: Observed) -> Plan:
    spec = obs.model.spec
    strategy = spec.strategy
    now = obs.now
    if spec.at_most_one:  # replace, never surge: the old pod is gone before the new exists
        budget = rolling.Budget(spec.replicas, 0, 1, float(strategy.min_ready_seconds))
    else:
        budget = rolling.resolve_budget(
            spec.replicas, strategy.max_surge, strategy.max_unavailable, strategy.min_ready_seconds
        )

    # 1. sync
    synced = decide_sync(obs, budget, format_micro_time(obs.at))
    if synced.blocked or synced.revision is not None:
        return Plan(obs.key, obs.sw, synced.events, synced.revision, synced.pdb)

    # 2. rolling
    template = obs.template
    update_hash = revs.template_hash(template)
    previous = obs.previous_status
    states = [pod_state(p, now) for p in obs.pods]
    desired = rolling.Desired(
        budget=budget,
        update_revision=update_hash,
        stable_revision=stable_revision(
            states, previous.get("currentRevision"), update_hash, False
        ),
        paused=strategy.paused,
        drain=spec.service is not None,
    )
    templates = {r.hash: r.template for r in obs.revisions}
    templates[update_hash] = template
    fence = None
    extra = 0
    if obs.fencing is not None:
        pods = rolling.Plan()
        takedowns: tuple[PodWrite, ...] = ()
        creates: tuple[CreatePods, ...] = ()
        revision = desired.stable_revision if strategy.paused else update_hash
        previous_reason = next(
            (
                c.get("reason")
                for c in previous.get("conditions") or []
                if c.get("type") == atmostone.CONDITION
            ),
            None,
        )
        fence = atmostone.decide_fencing(
            sw=obs.sw,
            pods=obs.pods,
            fencing=obs.fencing,
            replicas=spec.replicas,
            revision=revision or update_hash,
            at=obs.at,
            previous_reason=previous_reason,
        )
    else:
        # Planned maintenance: a surge-first workload keeps replacements for its pods on
        # draining nodes (`drain`); the budget, the PDB and the status stay `replicas`'.
        if drain.surge_first(obs.model, budget):
            extra = drain.drain_extra(obs.pods, states, budget, obs.draining)
        pods = rolling.plan(states, drain.with_extra(desired, extra), now)
        takedowns, creates = pod_writes(obs, pods, templates)

    # 3. progress
    complete = prog.is_complete(states, desired, now) or drain.complete_while_draining(
        states, desired, extra, now
    )
    update_rev = next((r for r in obs.revisions if r.hash == update_hash), None)
    conditions = previous.get("conditions") or []
    last = prog.last_progress_at(
        states,
        desired,
        now,
        activated_at=parse_time(update_rev.activated_at) if update_rev else now,
        progressing_since=parse_time(transition_time(conditions, PROGRESSING, "True")),
    )
    verdict = prog.assess(
        complete=complete,
        paused=strategy.paused,
        last_progress=last,
        deadline_seconds=strategy.progress_deadline_seconds,
        now=now,
    )

    # 4. status, from the pods observed; then history
    current = stable_revision(states, previous.get("currentRevision"), update_hash, complete)
    meta = obs.sw["metadata"]
    status = compute_status(
        name=obs.name,
        generation=obs.generation,
        pods=states,
        desired=desired,
        progress=verdict,
        current_revision=current,
        previous=previous,
        deadline_seconds=strategy.progress_deadline_seconds,
        now=now,
        now_str=format_time(obs.at),
        failure=obs.failure if obs.failure and obs.failure.generation == obs.generation else None,
    )
    if fence is not None:
        put_condition(status, atmostone.CONDITION, *fence.condition, obs.generation, obs.at)
    else:
        drop_condition(status, atmostone.CONDITION)
    write = None
    if status != previous:
        announce = announcement(previous, status, verdict)
        write = StatusWrite(status, str(meta["resourceVersion"]), announce)
    in_use = {p.revision for p in states} | {current, update_hash}
    wakes = [t for t in (pods.wake_at, verdict.deadline_at) if t is not None]
    if fence is not None and fence.wake_in is not None:
        wakes.append(now + max(0.0, fence.wake_in))
    return Plan(
        obs.key,
        obs.sw,
        synced.events,
        pdb=synced.pdb,
        takedowns=takedowns,
        creates=creates,
        status=write,
        prune=tuple(prune(obs, update_hash, in_use)),
        wake_at=min(wakes) if wakes else None,
        state=verdict.state,
        fencing=fence,
        fencing_template=templates.get(fence.create.revision) if fence and fence.create else None,
        summary={
            "creates": pods.creates,
            "drains": len(pods.drains),
            "deletes": len(pods.deletes),
            "update": update_hash,
            **({"drain_surges": extra} if extra else {}),
            **(fencing_summary(fence) if fence is not None else {}),
        },
    )
