"""`kubectl pilotfish why nm/NAME`: a NodeMaintenance's progress and a sentence per blocker
naming the pod, the budget and who can unblock it; rendered from objects alone."""

from __future__ import annotations

import datetime
import io
from typing import Any

from pilotfish.cli.why import run_target
from pilotfish.cli.whymaintenance import explain_maintenance, maintenance_name
from pilotfish.kube.rest import NODEMAINTENANCES
from pilotfish.timeutil import FakeClock, format_time
from tests.fakeapi import FakeApi

Obj = dict[str, Any]
NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)


def at(minutes_ago: float) -> str:
    return format_time(NOW - datetime.timedelta(minutes=minutes_ago))


def maintenance(**status: Any) -> Obj:
    return {
        "metadata": {"name": "nm1", "generation": 1, "creationTimestamp": at(12)},
        "spec": {
            "nodes": ["n1", "n2", "n3"],
            "maxConcurrent": 2,
            "onePerZone": True,
            "reason": "kernel 6.8",
            "batchTaskDeadlineSeconds": 900,
        },
        **({"status": {"observedGeneration": 1, **status}} if status else {}),
    }


def blocker(pod: str, reason: str, budget: str | None = None, message: str = "") -> Obj:
    return {"pod": pod, "reason": reason, "budget": budget, "message": message}


def test_target_names() -> None:
    assert maintenance_name("nm/nm1") == "nm1"
    assert maintenance_name("nodemaintenance.pilotfish.io/nm1") == "nm1"
    assert maintenance_name("NodeMaintenances/x") == "x"
    assert maintenance_name("bw/job") is None
    assert maintenance_name("web-1") is None
    assert maintenance_name("nm/") is None


def test_progress_and_each_blocker_as_a_sentence() -> None:
    nm = maintenance(
        phase="Draining",
        progress="1/3",
        nodes=[
            {"name": "n1", "state": "Drained", "podsLeft": 0},
            {
                "name": "n2",
                "state": "Draining",
                "podsLeft": 5,
                "blockers": [
                    blocker("shop/web-1", "DisruptionBudget", "shop/web", "allows 0"),
                    blocker("shop/db-0", "WaitingForSurge"),
                    blocker("jobs/task-3", "BatchTaskRunning"),
                    blocker("shop/cache-0", "LocalStorage"),
                    blocker("shop/api-2", "EvictionRefused", "shop/api"),
                ],
            },
        ],
        conditions=[
            {
                "type": "Blocked",
                "status": "True",
                "reason": "DrainBlocked",
                "lastTransitionTime": at(7),
                "message": "node n2: pod shop/web-1 held by budget shop/web",
            }
        ],
    )
    lines = explain_maintenance(nm, NOW)
    assert lines[0] == (
        "NodeMaintenance nm1, created 12m ago (kernel 6.8): 3 node(s), at most 2 node(s) at a "
        "time, one per zone, order Given."
    )
    assert lines[1] == "Phase Draining: 1/3 nodes drained."
    assert lines[2] == (
        "Blocked since 7m ago (a node held longer than 5m): "
        "node n2: pod shop/web-1 held by budget shop/web."
    )
    assert "Node n1: Drained: no pod left to evict." in lines
    assert "Node n2: Draining, 5 pods left." in lines
    text = "\n".join(lines)
    assert (
        "Pod shop/web-1 waits (DisruptionBudget): its PodDisruptionBudget shop/web allows no "
        "disruption now" in text
    )
    assert "allows 0" in text, "the controller's message is quoted"
    assert "Pod shop/db-0 waits (WaitingForSurge): its ServiceWorkload may lose no Ready" in text
    assert "batchTaskDeadlineSeconds (900s)" in text
    assert "spec.allowLocalStorage: true" in text
    assert "refused its last eviction (429) because of budget shop/api" in text
    assert lines[-1] == "Node n3: Pending: waits its turn.", "a node not reported yet"


def test_done_complete_and_nothing_reported_yet() -> None:
    done = maintenance(
        phase="Done",
        progress="3/3",
        nodes=[{"name": n, "state": "Drained"} for n in ("n1", "n2", "n3")],
        conditions=[{"type": "Complete", "status": "True", "reason": "Drained"}],
    )
    lines = explain_maintenance(done, NOW)
    assert "Phase Done: 3/3 nodes drained." in lines
    assert any(line.startswith("Complete: every node is drained") for line in lines)
    assert not any(line.startswith("Blocked") for line in lines)

    fresh = explain_maintenance(maintenance(), NOW)
    assert "has not reported on it yet" in fresh[-1]

    stale = maintenance(phase="Done", progress="3/3")
    stale["metadata"]["generation"] = 2
    assert "reported for an earlier version of the spec" in explain_maintenance(stale, NOW)[1]


def test_a_failed_node_and_an_unknown_reason_are_said_plainly() -> None:
    nm = maintenance(
        phase="Failed",
        progress="2/3",
        nodes=[
            {"name": "n1", "state": "Failed", "message": "node n1 not found"},
            {"name": "n2", "state": "Draining", "blockers": [blocker("a/b", "Mystery")]},
        ],
    )
    text = "\n".join(explain_maintenance(nm, NOW))
    assert "Node n1: Failed: it cannot be drained (node n1 not found)." in text
    assert "Pod a/b waits (Mystery)." in text


async def test_why_dispatches_nm_targets() -> None:
    api = FakeApi()
    api.put(NODEMAINTENANCES.path(name="nm1"), maintenance(phase="Draining", progress="0/3"))
    out, err = io.StringIO(), io.StringIO()
    assert await run_target(api, "default", "nm/nm1", FakeClock(NOW), out, err) == 0
    assert "Phase Draining: 0/3 nodes drained." in out.getvalue()
    assert await run_target(api, "default", "nm/none", FakeClock(NOW), out, err) == 1
    assert "cannot read NodeMaintenance none" in err.getvalue()
