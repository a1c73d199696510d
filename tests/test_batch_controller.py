"""The BatchWorkload controller on the in-memory API: tasks run to completion, each index
succeeds once, failures back off and count, disruptions do not, suspend stops and resumes,
and a deleted job's pods are let go."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from pilotfish.api.batchworkload import DEFAULT_BACKOFF_LIMIT, BatchWorkload, BatchWorkloadSpec
from pilotfish.gates import GANG_GATE, LABEL_GANG
from pilotfish.kube.rest import PODS
from pilotfish.operators.batchworkload.model import LABEL_TASK_RECORDED
from pilotfish.timeutil import FakeClock
from pilotfish.workloads import (
    ANNOTATION_TASK_ATTEMPT,
    ANNOTATION_TASK_FAILURES,
    ENV_COMPLETION_INDEX,
    ENV_TASK_INDEX,
    FINALIZER_TASK,
    LABEL_BATCH,
)
from tests.batch_harness import BW, NS, Cluster, World, batch, index_of, start


async def world(spec: dict[str, object], **kw: float) -> World:
    return await start(Cluster(), FakeClock(), create=spec, **kw)


async def test_every_index_succeeds_exactly_once() -> None:
    w = await world(batch(completions=20, parallelism=5))
    try:
        for _ in range(30):
            await w.converge()
            if w.api.condition("Complete"):
                break
            assert len(w.api.live()) <= 5
            w.api.run_all()
        status = w.api.status()
        assert w.api.condition("Complete") == ("True", "Completed")
        assert status["succeeded"] == 20 and status["completedIndexes"] == "0-19"
        assert status["active"] == 0 and status["failed"] == 0
        assert status.get("completionTime") and status.get("startTime")
        created = Counter(n.rsplit("-", 2)[1] for n in w.api.creates())
        assert created == Counter({str(i): 1 for i in range(20)})
        assert w.api.pods_of() == []  # finalizers off, pods deleted
        pod_writes = [c for c in w.api.writes("/pods") if not c.path.endswith("/events")]
        assert len(pod_writes) <= 3 * 20
        status_writes = w.api.writes("/status")
        assert len(status_writes) < 20
        reasons = {e["reason"] for e in await w.events()}
        assert {"Started", "Completed"} <= reasons
    finally:
        await w.stop()


async def test_task_pod_carries_the_contract() -> None:
    w = await world(batch(completions=3, parallelism=3, placement={"spread": "node"}))
    try:
        await w.converge()
        pod = w.api.obj(PODS.path(NS, "job-2-0"))
        assert pod is not None
        meta, spec = pod["metadata"], pod["spec"]
        assert meta["labels"][LABEL_BATCH] == "job" and index_of(pod) == 2
        assert meta["labels"]["pilotfish.io/team"] == "ml"
        assert meta["labels"]["pilotfish.io/band"] == "batch"
        assert "pilotfish.io/workload" not in meta["labels"]
        assert meta["annotations"][ANNOTATION_TASK_ATTEMPT] == "0"
        assert meta["finalizers"] == [FINALIZER_TASK]
        (owner,) = meta["ownerReferences"]
        assert owner["kind"] == "BatchWorkload"
        assert owner["controller"] and owner["blockOwnerDeletion"]
        assert spec["restartPolicy"] == "Never"
        env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
        assert env == {ENV_TASK_INDEX: "2", ENV_COMPLETION_INDEX: "2"}
        (spread,) = spec["topologySpreadConstraints"]
        assert spread["labelSelector"] == {"matchLabels": {LABEL_BATCH: "job"}}
    finally:
        await w.stop()


async def test_failures_back_off_then_exceed_the_backoff_limit() -> None:
    w = await world(batch(completions=1, parallelism=1, backoffLimit=2), backoff_base=10.0)
    try:
        await w.converge()
        w.api.bind("job-0-0")
        w.api.finish("job-0-0", "Failed")
        result = await w.converge()
        assert w.api.status()["failed"] == 1
        assert [p["metadata"]["name"] for p in w.api.live()] == []
        assert result.after is not None and 9.9 < result.after < 10.5  # the first backoff
        w.clock.advance(5)
        await w.converge()
        assert w.api.live() == []  # still backing off
        w.clock.advance(5.1)
        await w.converge()
        (retry,) = w.api.live()
        assert retry["metadata"]["name"] == "job-0-1"
        assert retry["metadata"]["annotations"][ANNOTATION_TASK_FAILURES] == "1"
        kept = w.api.obj(PODS.path(NS, "job-0-0"))  # recorded and kept, as a Job keeps it
        assert kept is not None and FINALIZER_TASK not in kept["metadata"].get("finalizers", [])
        assert kept["metadata"]["labels"][LABEL_TASK_RECORDED] == "true"
        w.api.bind("job-0-1")
        w.api.finish("job-0-1", "Failed")
        result = await w.converge()
        assert result.after is not None and 19.9 < result.after < 20.5  # doubled
        w.clock.advance(20.1)
        await w.converge()
        w.api.bind("job-0-2")
        w.api.finish("job-0-2", "Failed")
        await w.converge()
        assert w.api.condition("Failed") == ("True", "BackoffLimitExceeded")
        assert w.api.status()["failed"] == 3
        w.clock.advance(1000)
        await w.converge()
        assert w.api.live() == [] and w.api.tracked() == []
        assert "Failed" in {e["reason"] for e in await w.events()}
    finally:
        await w.stop()


async def test_backoff_limit_exceeded_stops_the_running_pods() -> None:
    w = await world(batch(completions=4, parallelism=4, backoffLimit=0))
    try:
        await w.converge()
        for p in w.api.live():
            w.api.bind(p["metadata"]["name"])
        w.api.finish("job-1-0", "Failed")
        await w.converge()
        assert w.api.condition("Failed") == ("True", "BackoffLimitExceeded")
        assert w.api.tracked() == []
        assert all(p["metadata"].get("deletionTimestamp") for p in w.api.pods_of())
        w.api.kubelet_ends()
        await w.converge()
        assert w.api.pods_of() == []
    finally:
        await w.stop()


async def test_an_index_over_its_limit_fails_and_the_others_go_on() -> None:
    w = await world(
        batch(completions=3, parallelism=3, backoffLimitPerIndex=0, backoffLimit=10),
        backoff_base=0.0,
    )
    try:
        await w.converge()
        w.api.bind("job-1-0")
        w.api.finish("job-1-0", "Failed")
        await w.converge()
        assert w.api.status()["failedIndexes"] == "1"
        assert w.api.condition("Failed") is None  # the others still run
        w.api.run_all()
        await w.converge()
        status = w.api.status()
        assert w.api.condition("Failed") == ("True", "FailedIndexes")
        assert status["completedIndexes"] == "0,2" and status["succeeded"] == 2
        assert "job-1-1" not in w.api.creates()
    finally:
        await w.stop()


async def test_with_a_per_index_limit_and_no_backoff_limit_failures_have_no_limit_in_all() -> None:
    # 8 indexes failing once each: 8 failures, more than the default backoffLimit of 6, but
    # with backoffLimitPerIndex set and backoffLimit unset only the per-index limit applies.
    w = await world(batch(completions=8, parallelism=8, backoffLimitPerIndex=1), backoff_base=0.0)
    try:
        await w.converge()
        for i in range(8):
            w.api.bind(f"job-{i}-0")
            w.api.finish(f"job-{i}-0", "Failed")
        await w.converge()
        assert w.api.status()["failed"] == 8
        assert w.api.condition("Failed") is None
        w.api.run_all()
        await w.converge()
        assert w.api.condition("Complete") == ("True", "Completed")
    finally:
        await w.stop()


async def test_without_a_per_index_limit_an_unset_backoff_limit_is_six() -> None:
    w = await world(batch(completions=7, parallelism=7), backoff_base=0.0)
    try:
        await w.converge()
        for i in range(7):
            w.api.bind(f"job-{i}-0")
            w.api.finish(f"job-{i}-0", "Failed")
        await w.converge()
        assert w.api.condition("Failed") == ("True", "BackoffLimitExceeded")
    finally:
        await w.stop()


async def test_a_preempted_task_is_recreated_and_not_counted() -> None:
    w = await world(batch(completions=1, parallelism=1, backoffLimit=0))
    try:
        await w.converge()
        w.api.bind("job-0-0")
        w.api.finish("job-0-0", "Failed", disrupted=True)
        await w.converge()
        status = w.api.status()
        assert status["disrupted"] == 1 and status["failed"] == 0
        assert w.api.condition("Failed") is None
        (again,) = w.api.live()
        assert again["metadata"]["name"] == "job-0-1"
        assert again["metadata"]["annotations"][ANNOTATION_TASK_FAILURES] == "0"
        w.api.run_all()
        await w.converge()
        assert w.api.condition("Complete") == ("True", "Completed")
    finally:
        await w.stop()


async def test_suspend_deletes_pods_and_resume_brings_them_back() -> None:
    w = await world(batch(completions=6, parallelism=3))
    try:
        await w.converge()
        assert len(w.api.live()) == 3
        w.api.edit_spec(suspend=True)
        await w.converge()
        assert w.api.pods_of() == []
        assert w.api.condition("Suspended") == ("True", "Suspended")
        before = len(w.api.creates())
        await w.converge()
        assert len(w.api.creates()) == before
        w.api.edit_spec(suspend=False)
        await w.converge()
        assert w.api.condition("Suspended") == ("False", "Resumed")
        assert len(w.api.live()) == 3
        for _ in range(5):
            w.api.run_all()
            await w.converge()
        assert w.api.condition("Complete") == ("True", "Completed")
    finally:
        await w.stop()


async def test_the_gang_is_created_gated_in_one_sync_and_retries_are_not() -> None:
    w = await world(batch(completions=14, parallelism=14, gang=12))
    try:
        await w.step()  # one sync: the whole gang, past the in-flight minimum of 10
        gang = [p for p in w.api.pods_of() if index_of(p) < 12]
        assert len(gang) == 12
        for p in gang:
            assert {"name": GANG_GATE} in p["spec"]["schedulingGates"]
            assert p["metadata"]["labels"][LABEL_GANG] == "job"
        await w.converge()
        for p in gang:  # the gate controller releases it; the scheduler binds it
            w.api.bind(p["metadata"]["name"])
        w.api.finish("job-3-0", "Failed")
        await w.converge()
        w.clock.advance(11)
        await w.converge()
        retry = w.api.obj(PODS.path(NS, "job-3-1"))
        assert retry is not None
        assert GANG_GATE not in [g["name"] for g in retry["spec"].get("schedulingGates") or []]
        assert LABEL_GANG not in retry["metadata"]["labels"]
    finally:
        await w.stop()


async def test_a_deleted_job_lets_go_of_its_pods() -> None:
    w = await world(batch(completions=3, parallelism=3))
    try:
        await w.converge()
        assert len(w.api.tracked()) == 3
        w.api.remove(BW)
        await w.converge()
        assert w.api.tracked() == []
    finally:
        await w.stop()


async def test_someone_deleting_a_running_pod_waits_for_it_to_end() -> None:
    """The finalizer holds a deleted pod until its outcome is in; no replacement starts
    while it may still run."""
    w = await world(batch(completions=1, parallelism=1, backoffLimit=3), backoff_base=0.0)
    try:
        await w.converge()
        w.api.bind("job-0-0")
        await w.api.delete(PODS.path(NS, "job-0-0"))
        await w.converge()
        assert [p["metadata"]["name"] for p in w.api.pods_of()] == ["job-0-0"]
        w.api.finish("job-0-0", "Failed")
        await w.converge()
        assert w.api.obj(PODS.path(NS, "job-0-0")) is None
        assert [p["metadata"]["name"] for p in w.api.live()] == ["job-0-1"]
        assert w.api.status()["failed"] == 1
    finally:
        await w.stop()


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
async def test_restart_between_status_write_and_finalizer_removal(phase: str) -> None:
    """kill -9 right after the status recorded the outcome: a fresh controller on the same
    API neither loses nor repeats it."""
    api, clock = Cluster(), FakeClock()
    w = await start(api, clock, backoff_base=0.0, create=batch(completions=3, parallelism=3))
    await w.converge()
    w.api.bind("job-1-0")
    w.api.finish("job-1-0", phase)
    # The process dies at its first write to that pod: right after the status write for a
    # success; for a failure, after the replacement's create (the failed pod is kept until
    # the replacement exists, its failure count is read from it).
    api.fail_next("PATCH", "/pods/job-1-0", 500)
    with pytest.raises(Exception, match="injected 500"):
        for _ in range(3):
            await w.step()
    await w.stop()
    status = api.status()
    expect = ("1", 1, 0) if phase == "Succeeded" else ("", 0, 1)
    assert (status["completedIndexes"], status["succeeded"], status["failed"]) == expect
    assert "job-1-0" in api.tracked()

    again = await start(api, clock, backoff_base=0.0)
    try:
        await again.converge()
        status = api.status()
        assert (status["completedIndexes"], status["succeeded"], status["failed"]) == expect
        assert "job-1-0" not in api.tracked()
        if phase == "Failed":
            retry = api.obj(PODS.path(NS, "job-1-1"))
            assert retry is not None
            assert retry["metadata"]["annotations"][ANNOTATION_TASK_FAILURES] == "1"
        for _ in range(4):
            api.run_all()
            await again.converge()
        status = api.status()
        assert status["completedIndexes"] == "0-2" and status["succeeded"] == 3
        assert status["failed"] == (1 if phase == "Failed" else 0)
    finally:
        await again.stop()


async def test_an_evicted_pod_that_never_reports_an_end_is_let_go_and_replaced() -> None:
    """kwok deletes a pod the moment no finalizer holds it and never marks it Failed: the
    eviction is recorded from the DisruptionTarget condition, the finalizer comes off, and
    the replacement (next attempt, failures unchanged) starts once the pod is gone."""
    w = await world(batch(completions=2, parallelism=2, backoffLimit=0))
    try:
        await w.converge()
        w.api.bind("job-1-0")

        def evicted(pod: dict[str, object]) -> None:
            pod["metadata"]["finalizers"] = [FINALIZER_TASK]  # type: ignore[index]
            pod["status"] = {  # the Eviction API's condition on a running pod
                "phase": "Running",
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "EvictionByEvictionAPI",
                    }
                ],
            }

        w.api.edit_pod("job-1-0", evicted)
        await w.api.delete(PODS.path(NS, "job-1-0"))
        await w.converge()
        status = w.api.status()
        assert (status["disrupted"], status["failed"]) == (1, 0)
        assert w.api.obj(PODS.path(NS, "job-1-0")) is None
        retry = w.api.obj(PODS.path(NS, "job-1-1"))
        assert retry is not None
        assert retry["metadata"]["annotations"][ANNOTATION_TASK_FAILURES] == "0"
        assert w.api.condition("Failed") is None
    finally:
        await w.stop()


def test_the_backoff_limit_in_force_follows_the_job_api() -> None:
    def spec(**kw: Any) -> BatchWorkloadSpec:
        return BatchWorkload.model_validate(batch(**kw)).spec

    assert spec().failures_tolerated == DEFAULT_BACKOFF_LIMIT
    assert spec(backoffLimitPerIndex=2).failures_tolerated is None
    assert spec(backoffLimitPerIndex=2, backoffLimit=3).failures_tolerated == 3
    assert spec(backoffLimit=0).failures_tolerated == 0
