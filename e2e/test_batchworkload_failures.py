"""BatchWorkload task failures against the real control plane: retries with backoff, the
job's and the per-index limits, disruptions that are not failures, and outcomes that happen
while the operator is down.

As in test_batchworkload, the tenant submits each job, kwok keeps its tasks running and the
test ends each one as a kubelet would report it: a failure is phase Failed with the container
terminated by exit code 1; a preemption is phase Failed with the DisruptionTarget condition
the scheduler sets; an eviction goes through the policy/v1 Eviction API, as a drain does.
"""

from __future__ import annotations

from collections import Counter

import pytest

from e2e import batch, taskwatch
from e2e.batch import Outcome, job, pods_left
from e2e.conftest import Env, Tenant, wait_until
from e2e.taskwatch import Seen, TaskWatch
from pilotfish.devcluster import supervisor
from pilotfish.operators.batchworkload.pacing import BACKOFF_BASE_SECONDS

TEAM = "e2e"  # the namespace fixture's team, granted every band without limits
# The operator's first retry waits at least this long after a task failed; the backoff
# doubles with each failure of the index.
FIRST_BACKOFF = BACKOFF_BASE_SECONDS
# Slack for the two clocks involved: the watch here sees the failure a little after the
# operator does.
SLACK = 0.5


def retry_waits(watch: TaskWatch, index: int) -> list[float]:
    """Seconds from each failure of `index` seen to the next attempt's pod seen created."""
    waits: list[float] = []
    failed_at: float | None = None
    for s in watch.events():
        if taskwatch.index_of(s.pod) != index:
            continue
        if failed_at is None and taskwatch.phase(s.pod) == "Failed":
            failed_at = s.at
        elif failed_at is not None and s.type == "ADDED":
            waits.append(s.at - failed_at)
            failed_at = None
    return waits


def attempts(watch: TaskWatch, index: int) -> list[tuple[int, str]]:
    return [(taskwatch.attempt_of(p), taskwatch.phase(p)) for p in watch.of_index(index)]


def test_a_task_failing_twice_retries_with_backoff_and_counts_toward_the_limit(
    env: Env, namespace: str, tenant: Tenant
) -> None:
    def outcome(index: int, attempt: int) -> Outcome:
        return "fail" if index == 1 and attempt < 2 else "succeed"

    body = batch.batchworkload("flaky", TEAM, 3, 3)
    with job(env, tenant, body, outcome) as (watch, _):
        bw = batch.wait_condition(env.api, namespace, "flaky", "Complete", reason="Completed")
        wait_until("the finished pods deleted", lambda: not pods_left(env, namespace, "flaky"))

    st = batch.status(bw)
    assert (st["succeeded"], st["failed"], st["completedIndexes"]) == (3, 2, "0-2"), st
    assert st.get("disrupted", 0) == 0
    assert attempts(watch, 1) == [(0, "Failed"), (1, "Failed"), (2, "Succeeded")]
    assert watch.outcomes("Succeeded") == Counter(dict.fromkeys(range(3), 1))
    assert watch.violations == []
    first, second = retry_waits(watch, 1)
    assert first >= FIRST_BACKOFF - SLACK, f"the first retry came {first:.2f}s after the failure"
    assert second >= 2 * FIRST_BACKOFF - SLACK, f"the second retry waited only {second:.2f}s"


def test_failures_beyond_the_backoff_limit_fail_the_job_and_stop_its_pods(
    env: Env, namespace: str, tenant: Tenant
) -> None:
    def outcome(index: int, attempt: int) -> Outcome | None:
        return "fail" if index == 0 else None  # index 1 runs until the job stops it

    body = batch.batchworkload("doomed", TEAM, 2, 2, backoffLimit=1)
    with job(env, tenant, body, outcome) as (watch, _):
        bw = batch.wait_condition(
            env.api, namespace, "doomed", "Failed", reason="BackoffLimitExceeded"
        )
        failed_at = len(watch.events())
        wait_until("the job's pods removed", lambda: not pods_left(env, namespace, "doomed"))
        later = [s.name for s in watch.events()[failed_at:] if s.type == "ADDED"]

    st = batch.status(bw)
    assert (st["failed"], st["succeeded"]) == (2, 0), st
    assert batch.condition(bw, "Complete").get("status") in (None, "False")
    assert attempts(watch, 0) == [(0, "Failed"), (1, "Failed")], "no third attempt past the limit"
    assert later == [], f"pods created after the job failed: {later}"
    assert batch.status(batch.get(env.api, namespace, "doomed")).get("active", 0) == 0
    assert watch.violations == []


def test_an_index_over_its_own_limit_fails_while_the_others_complete(
    env: Env, namespace: str, tenant: Tenant
) -> None:
    def outcome(index: int, attempt: int) -> Outcome:
        return "fail" if index == 1 else "succeed"

    body = batch.batchworkload("picky", TEAM, 4, 4, backoffLimitPerIndex=0)
    with job(env, tenant, body, outcome) as (watch, _):
        bw = batch.wait_condition(env.api, namespace, "picky", "Failed", reason="FailedIndexes")

    st = batch.status(bw)
    assert (st["failedIndexes"], st["completedIndexes"]) == ("1", "0,2-3"), st
    assert (st["failed"], st["succeeded"]) == (1, 3), st
    assert attempts(watch, 1) == [(0, "Failed")], "an index past its limit is not retried"
    assert watch.violations == []


def disrupted_by_eviction(s: Seen) -> bool:
    return any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True"
        for c in (s.pod.get("status") or {}).get("conditions") or []
    )


def test_preempted_and_evicted_tasks_are_recreated_and_do_not_count(
    env: Env, namespace: str, tenant: Tenant
) -> None:
    first: dict[int, Outcome] = {0: "preempt", 1: "evict"}

    def outcome(index: int, attempt: int) -> Outcome:
        return first.get(index, "succeed") if attempt == 0 else "succeed"

    # backoffLimit 0: a disruption counted as a failure would fail the whole job.
    body = batch.batchworkload("bumpy", TEAM, 3, 3, backoffLimit=0)
    with job(env, tenant, body, outcome) as (watch, _):
        bw = batch.wait_condition(env.api, namespace, "bumpy", "Complete", reason="Completed")

    st = batch.status(bw)
    assert (st["succeeded"], st["failed"], st["disrupted"]) == (3, 0, 2), st
    assert [a for a, _ in attempts(watch, 0)] == [0, 1]
    assert [a for a, _ in attempts(watch, 1)] == [0, 1]
    evicted = watch.of_index(1)[0]["metadata"]["uid"]
    assert watch.first(evicted, lambda p: bool(p["metadata"].get("deletionTimestamp")))
    assert any(disrupted_by_eviction(s) for s in watch.events() if s.uid == evicted), (
        "the Eviction API set no DisruptionTarget condition: the test's premise is wrong"
    )
    assert watch.outcomes("Succeeded") == Counter(dict.fromkeys(range(3), 1))
    assert watch.violations == [], watch.violations


@pytest.mark.disruptive
def test_outcomes_while_the_operator_is_down_are_counted_once_after_it_restarts(
    env: Env, namespace: str, tenant: Tenant
) -> None:
    """The tracking finalizer keeps each ended pod until its outcome is in the status: tasks
    that end while the operator is down (SIGKILL, no cleanup) are counted by its successor,
    each once, and those it had already counted are not counted again."""
    env.require_local()
    ending = {"on": False}

    def outcome(index: int, attempt: int) -> Outcome | None:
        if index == 3 and attempt == 0:
            return "fail"
        return "succeed" if ending["on"] or index < 6 else None

    body = batch.batchworkload("survivor", TEAM, 16, 8)
    with job(env, tenant, body, outcome) as (watch, tasks):
        wait_until(
            "the first outcomes counted",
            lambda: batch.status(batch.get(env.api, namespace, "survivor")).get("failed") == 1,
            timeout=60,
        )
        env.kill("pilotfish-operator")
        ending["on"] = True
        tasks.rescan()  # the running tasks end while nobody records them
        port = env.host_process("pilotfish-operator").port
        wait_until("the operator's port free", lambda: not supervisor.port_in_use(port), 30)
        env.restart("pilotfish-operator")
        bw = batch.wait_condition(env.api, namespace, "survivor", "Complete", timeout=180)

    st = batch.status(bw)
    assert (st["succeeded"], st["failed"], st["completedIndexes"]) == (16, 1, "0-15"), st
    assert watch.outcomes("Succeeded") == Counter(dict.fromkeys(range(16), 1))
    assert watch.violations == []
