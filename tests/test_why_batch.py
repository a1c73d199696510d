"""`kubectl pilotfish why` for batch: a task pod says which task it is and the first thing it
waits on (gang, quota, another gate, the scheduler), and `why bw/NAME` says a workload's
progress and what its uncreated tasks wait on, from whatever of its status is written.
"""

from __future__ import annotations

import datetime
import io
from typing import Any

import pytest

from pilotfish import gates, names, timeutil, workloads
from pilotfish.cli import why
from pilotfish.cli.whybatch import explain_batch, explain_task, parse_target, task_of
from pilotfish.kube.rest import BATCHWORKLOADS, PODS
from pilotfish.timeutil import FakeClock
from tests.fakeapi import FakeApi

NOW = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)
GANG = gates.GANG_GATE


def at(seconds: float) -> str:
    return timeutil.format_time(NOW + datetime.timedelta(seconds=seconds))


def task(
    index: int = 3,
    *,
    held: tuple[str, ...] = (),
    uid: str = "uid-train",
    phase: str = "Pending",
    node: str | None = None,
    conditions: list[dict[str, Any]] | None = None,
    gang: bool = False,
    owned: bool = True,
) -> dict[str, Any]:
    labels = {workloads.LABEL_BATCH: "train", workloads.LABEL_TASK_INDEX: str(index)}
    if gang:
        labels[gates.LABEL_GANG] = "train"
    meta: dict[str, Any] = {
        "name": f"train-{index}-1",
        "namespace": "ml",
        "uid": f"u{index}",
        "creationTimestamp": at(-60),
        "labels": labels,
        "annotations": {workloads.ANNOTATION_TASK_ATTEMPT: "1"},
    }
    if owned:
        meta["ownerReferences"] = [
            {
                "apiVersion": names.API_VERSION,
                "kind": "BatchWorkload",
                "name": "train",
                "uid": uid,
                "controller": True,
            }
        ]
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    if held:
        spec["schedulingGates"] = [{"name": g} for g in held]
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": phase, "conditions": conditions or []},
    }


def batch(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": names.API_VERSION,
        "kind": "BatchWorkload",
        "metadata": {"name": "train", "namespace": "ml", "uid": "uid-train", "generation": 2},
        "spec": {"completions": 200, "parallelism": 50, **spec},
    }
    if status is not None:
        obj["status"] = status
    return obj


# --- which task, then what first -----------------------------------------------------------


def test_task_of_reads_owner_index_and_attempt() -> None:
    t = task_of(task(7))
    assert t is not None and (t.workload, t.uid, t.index, t.attempt) == (
        "train",
        "uid-train",
        "7",
        "1",
    )
    plain = task()
    del plain["metadata"]["labels"][workloads.LABEL_BATCH]
    del plain["metadata"]["ownerReferences"]
    assert task_of(plain) is None


GANG_MEMBERS = [task(i, held=(GANG,), gang=True) for i in range(5)]
CASES = [
    (
        "gang-incomplete",
        task(3, held=(GANG,), gang=True),
        batch(gang=8),
        GANG_MEMBERS,
        "It waits first on its gang: 5 of 8 member pods exist, 5 ready (spec.gang 8 of "
        "BatchWorkload train); all go to the scheduler together once all exist and are ready.",
    ),
    (
        "gang-member-not-ready",
        task(3, held=(GANG,), gang=True),
        batch(gang=2),
        [task(0, held=(GANG,), gang=True), task(1, held=(GANG, "gates.pilotfish.io/x"), gang=True)],
        "It waits first on its gang: 2 of 2 member pods exist, 1 ready",
    ),
    (
        "gang-over-quota",
        task(3, held=(GANG, gates.QUOTA_GATE), gang=True),
        batch(gang=2),
        [task(i, held=(GANG, gates.QUOTA_GATE), gang=True) for i in range(2)],
        "together they wait for their team's quota to fit the whole gang",
    ),
    (
        "gang-finished-and-foreign-pods-do-not-count",
        task(3, held=(GANG,), gang=True),
        batch(gang=3),
        [
            *GANG_MEMBERS[:2],
            task(8, held=(GANG,), gang=True, phase="Succeeded"),
            task(9, held=(GANG,), gang=True, uid="uid-old"),
            task(10, held=(GANG,), gang=True, owned=False),
        ],
        "2 of 3 member pods exist, 2 ready",
    ),
    (
        "gang-workload-gone",
        task(3, held=(GANG,), gang=True),
        None,
        [],
        "It waits first on its gang, which cannot be sized: BatchWorkload train was not found",
    ),
    (
        "gang-workload-recreated",
        task(3, held=(GANG,), gang=True, uid="uid-old"),
        batch(gang=2),
        [],
        "cannot be sized: BatchWorkload train is another object now (uid uid-train)",
    ),
    (
        "quota",
        task(3, held=(gates.QUOTA_GATE,)),
        batch(),
        [],
        "It waits first on quota: its team's batch quota has no room for it yet",
    ),
    (
        "another-gate",
        task(3, held=("example.com/license",)),
        batch(),
        [],
        "It waits first on gate(s) example.com/license (below).",
    ),
    (
        "scheduler",
        task(
            3,
            conditions=[
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/20 nodes are available: 20 Insufficient cpu.",
                }
            ],
        ),
        batch(),
        [],
        "It waits first on the scheduler, which found no node: 0/20 nodes are available: 20 "
        "Insufficient cpu.",
    ),
    ("not-tried", task(3), batch(), [], "It waits first on the scheduler: not gated"),
    (
        "running",
        task(3, node="kwok-1", phase="Running"),
        batch(),
        [],
        "It is past the scheduler: bound to node kwok-1 (phase Running).",
    ),
    ("done", task(3, phase="Succeeded"), batch(), [], "It waits on nothing: the task's pod has"),
]


@pytest.mark.parametrize(
    ("pod", "bw", "members", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_task_says_which_task_then_what_it_waits_on_first(
    pod: dict[str, Any], bw: dict[str, Any] | None, members: list[dict[str, Any]], says: str
) -> None:
    t = task_of(pod)
    assert t is not None
    head, first = explain_task(pod, t, bw, members)
    assert head.startswith(f"Pod ml/{pod['metadata']['name']} is task 3 (attempt 1) of ")
    assert "BatchWorkload ml/train" in head
    assert says in first, first


def test_a_task_of_a_deleted_workload_says_so() -> None:
    pod = task(3)
    t = task_of(pod)
    assert t is not None
    head, _ = explain_task(pod, t, None, [])
    assert "(not found: deleted? its pods are then garbage collected)" in head


# --- a whole BatchWorkload -----------------------------------------------------------------

RUNNING = {
    "active": 16,
    "succeeded": 120,
    "failed": 2,
    "disrupted": 1,
    "observedGeneration": 2,
    "waiting": 62,
    "pacing": {"inFlight": 32, "limit": 32, "bindsPerSecond": 40.5},
    "conditions": [{"type": "Suspended", "status": "False", "reason": "Resumed"}],
}


def test_progress_and_pacing() -> None:
    lines = explain_batch(batch(RUNNING, creationRate=50), NOW)
    assert lines == [
        "BatchWorkload ml/train: 120 of 200 tasks succeeded, 16 active, 2 failed (backoffLimit "
        "6), 1 disrupted (recreated, not counted).",
        "It is not suspended.",
        "62 task(s) wait to be created: creation is paced to what the scheduler can place (32 "
        "created-but-unbound pod(s) in flight, limit 32 now, binds measured at 40.5/s); at the "
        "limit, the next task is created as soon as one of those binds; creation is also "
        "capped at spec.creationRate 50/s.",
    ]


def test_backing_off_while_the_api_server_queues() -> None:
    pacing = {"inFlight": 3, "limit": 32, "bindsPerSecond": 40.5}
    status = {**RUNNING, "pacing": {**pacing, "createRate": 6.2, "apiQueueingSeconds": 0.184}}
    text = " ".join(explain_batch(batch(status), NOW))
    assert (
        "; backing off while the API server queues: at most 6.2 creates/s, paced on how late "
        "its watch shows the operator's own writes (now 184 ms)."
    ) in text
    capped_lower = " ".join(explain_batch(batch(status, creationRate=5), NOW))
    assert "backing off" not in capped_lower and "spec.creationRate 5/s" in capped_lower


def test_a_status_not_yet_written() -> None:
    [line] = explain_batch(batch(), NOW)
    assert "its status is not written yet" in line and "(200 tasks)" in line


@pytest.mark.parametrize(
    ("status", "says"),
    [
        ({"active": 1}, "not reported yet (no status.waiting)"),
        ({"waiting": 5}, "5 task(s) wait to be created: creation is paced to what the "),
        ({"waiting": 5}, "(status.pacing not written yet)"),
        (
            {"waiting": 5, "pacing": {"inFlight": "x", "bindsPerSecond": None}},
            "(? created-but-unbound pod(s) in flight, limit ? now, bind rate not measured yet)",
        ),
        ({"succeeded": "lots"}, "BatchWorkload ml/train: ? of 200 tasks succeeded, ? active"),
    ],
)
def test_a_partly_written_status_is_read_defensively(status: dict[str, Any], says: str) -> None:
    assert says in " ".join(explain_batch(batch(status), NOW))


def test_no_pacing_line_when_nothing_waits() -> None:
    text = " ".join(explain_batch(batch({**RUNNING, "waiting": 0}), NOW))
    assert "wait to be created" not in text


def test_suspended() -> None:
    status = {**RUNNING, "conditions": [{"type": "Suspended", "status": "True"}]}
    lines = explain_batch(batch(status, suspend=True), NOW)
    assert lines[-1] == "It is suspended (spec.suspend): no task pods are created."
    pending = explain_batch(batch(RUNNING, suspend=True), NOW)
    assert "the batch operator has not confirmed it yet" in pending[-1]
    resuming = explain_batch(batch(status), NOW)
    assert "It is being resumed" in " ".join(resuming)


@pytest.mark.parametrize(
    ("kind", "reason", "says"),
    [
        ("Complete", "Completed", "It is complete (Completed, 10s ago)."),
        ("Failed", "BackoffLimitExceeded", "It has failed (BackoffLimitExceeded, 10s ago): 7"),
    ],
)
def test_finished(kind: str, reason: str, says: str) -> None:
    cond = {"type": kind, "status": "True", "reason": reason, "lastTransitionTime": at(-10)}
    if kind == "Failed":
        cond["message"] = "7 task failures, backoffLimit 6"
    lines = explain_batch(batch({**RUNNING, "conditions": [cond]}), NOW)
    assert says in lines[-1]
    assert not any("wait to be created" in line for line in lines)


def test_a_spec_not_yet_observed() -> None:
    lines = explain_batch(batch({**RUNNING, "observedGeneration": 1}), NOW)
    assert "has not acted on the latest spec yet (generation 2, observed 1)" in lines[1]


# --- the command -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "parsed"),
    [
        ("p", ("pod", "p")),
        ("pod/p", ("pod", "p")),
        ("bw/train", ("batchworkload", "train")),
        ("batchworkload/train", ("batchworkload", "train")),
        ("BatchWorkloads/train", ("batchworkload", "train")),
    ],
)
def test_targets(target: str, parsed: tuple[str, str]) -> None:
    assert parse_target(target) == parsed


@pytest.mark.parametrize(
    ("target", "says"),
    [("sw/web", "cannot explain a sw"), ("bw/", "is not KIND/NAME"), ("bw/a/b", "KIND/NAME")],
)
def test_bad_targets(target: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_target(target)


async def test_why_reads_the_task_its_workload_and_gang() -> None:
    api = FakeApi()
    api.put(BATCHWORKLOADS.path("ml", "train"), batch(RUNNING, gang=3))
    for i in range(2):
        api.put(PODS.path("ml", f"train-{i}-1"), task(i, held=(GANG,), gang=True))
    out, err = io.StringIO(), io.StringIO()
    code = await why.run_target(api, "ml", "train-1-1", FakeClock(NOW), out, err)
    assert code == 0, err.getvalue()
    lines = out.getvalue().splitlines()
    assert lines[0] == "Pod ml/train-1-1 is task 1 (attempt 1) of BatchWorkload ml/train."
    assert lines[1].startswith("It waits first on its gang: 2 of 3 member pods exist, 2 ready")
    assert lines[2].startswith("Pod ml/train-1-1 is gated")

    out = io.StringIO()
    assert await why.run_target(api, "ml", "bw/train", FakeClock(NOW), out, err) == 0
    assert out.getvalue().startswith("BatchWorkload ml/train: 120 of 200 tasks succeeded")
    assert "Its first 3 tasks form a gang" in out.getvalue()

    err = io.StringIO()
    assert await why.run_target(api, "ml", "bw/nope", FakeClock(NOW), io.StringIO(), err) == 1
    assert "cannot read BatchWorkload ml/nope" in err.getvalue()
    assert await why.run_target(api, "ml", "sw/x", FakeClock(NOW), io.StringIO(), err) == 2


def test_the_gang_gates_record_is_explained_as_the_workloads() -> None:
    pod = task(3, held=(GANG,), gang=True)
    record = gates.GateRecord(
        policy=gates.GANG_POLICY,
        generation=0,
        condition=gates.gang_condition("train"),
        timeout_seconds=86400,
        deadline=at(86400 - 60),
        on_expiry="Review",
    )
    pod["metadata"]["annotations"][gates.ANNOTATION_RECORD] = gates.PodGates(
        at(-60), {GANG: record}
    ).encode()
    text = " ".join(why.explain(pod, [], NOW))
    assert (
        f"{GANG} is removed when the spec.gang pods of BatchWorkload train can be released "
        "together (Gang(workload=train), put there for the BatchWorkload's gang)"
    ) in text
    assert "then onExpiry Review: the gate stays" in text
    assert "None" not in text and "GatePolicy" not in text
