"""`kubectl pilotfish drain`: the NodeMaintenance it writes, what `--wait` prints as the
status moves (the maintenance controller is played by the test, writing status as it
would) and its exit codes, against the shared in-memory API."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

from pilotfish.cli.drain_cmd import changes, drain_cmd, maintenance_body, outcome, what_blocks
from pilotfish.cli.kubectl_plugin import parser
from pilotfish.kube.rest import NODEMAINTENANCES, NODES
from tests.fakeapi import FakeApi, wait_for

Obj = dict[str, Any]
NM = NODEMAINTENANCES.path(name="nm1")
BUDGET_BLOCK = {
    "pod": "shop/web-1",
    "reason": "DisruptionBudget",
    "budget": "shop/web",
    "message": "allows 0 disruptions",
}


def nm_status(phase: str, progress: str, *nodes: Obj, blocked: str = "False") -> Obj:
    return {
        "observedGeneration": 1,
        "phase": phase,
        "progress": progress,
        "nodes": list(nodes),
        "conditions": [
            {
                "type": "Blocked",
                "status": blocked,
                "reason": "DrainBlocked" if blocked == "True" else "NotBlocked",
                "message": "node n1: pod shop/web-1 held by budget shop/web",
            }
        ],
    }


def nm(status: Obj | None = None) -> Obj:
    return {
        "metadata": {"name": "nm1", "generation": 1},
        "spec": {"nodes": ["n1", "n2"]},
        **({"status": status} if status else {}),
    }


def test_the_body_has_the_wire_names_and_refuses_a_node_twice() -> None:
    body = maintenance_body(
        ["n1", "n2"], max_concurrent=2, one_per_zone=True, order="FewestProductionFirst",
        reason="kernel upgrade",
    )  # fmt: skip
    assert body["apiVersion"] == "pilotfish.io/v1alpha1" and body["kind"] == "NodeMaintenance"
    assert body["metadata"] == {"generateName": "drain-n1-"}
    assert body["spec"] == {
        "nodes": ["n1", "n2"],
        "maxConcurrent": 2,
        "order": "FewestProductionFirst",
        "onePerZone": True,
        "reason": "kernel upgrade",
    }
    assert maintenance_body(["n1"], name="nm1")["metadata"] == {"name": "nm1"}
    with pytest.raises(ValueError, match="node n1 is given twice"):
        maintenance_body(["n1", "n2", "n1"])


def test_the_parser_takes_the_flags_and_refuses_a_bad_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = parser().parse_args(
        ["drain", "n1", "n2", "--max-concurrent", "3", "--one-per-zone", "--wait",
         "--timeout", "5m", "--order", "FewestProductionFirst", "--name", "nm1"]
    )  # fmt: skip
    assert (args.nodes, args.max_concurrent, args.one_per_zone, args.wait, args.timeout) == (
        ["n1", "n2"],
        3,
        True,
        True,
        300.0,
    )
    assert (args.order, args.name) == ("FewestProductionFirst", "nm1")
    with pytest.raises(SystemExit):
        parser().parse_args(["drain", "n1", "--max-concurrent", "0"])
    assert "--max-concurrent must be a whole number >= 1: 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser().parse_args(["drain", "n1", "--order", "Random"])
    assert "invalid choice: 'Random'" in capsys.readouterr().err
    no_wait = parser().parse_args(["drain", "n1", "--timeout", "5m"])
    assert no_wait.func(no_wait) == 2
    assert "--timeout 300s needs --wait" in capsys.readouterr().err
    twice = parser().parse_args(["drain", "n1", "n1"])
    assert twice.func(twice) == 2
    assert "node n1 is given twice" in capsys.readouterr().err


def test_changes_print_each_node_transition_and_new_blocker_once() -> None:
    draining = {"name": "n1", "state": "Draining", "podsLeft": 2, "blockers": [BUDGET_BLOCK]}
    first = nm(nm_status("Draining", "0/2", draining))
    assert changes(None, first) == [
        "node n1: Draining, 2 pods left",
        "  blocked: shop/web-1: DisruptionBudget (budget shop/web): allows 0 disruptions",
        "phase Draining, 0/2 drained",
    ]
    assert changes(first, first) == [], "nothing new, nothing printed"
    blocked = nm(nm_status("Draining", "0/2", draining, blocked="True"))
    assert changes(first, blocked) == ["Blocked: node n1: pod shop/web-1 held by budget shop/web"]
    drained = nm(nm_status("Draining", "1/2", {"name": "n1", "state": "Drained"}))
    assert changes(blocked, drained) == ["node n1: Drained"]


def test_outcome_done_failed_and_an_older_generation() -> None:
    assert outcome(nm(nm_status("Done", "2/2")))[0] == "done"
    failed = nm(
        nm_status("Failed", "1/2", {"name": "n2", "state": "Failed", "message": "no such node"})
    )
    state, message = outcome(failed)
    assert state == "failed" and "n2 (no such node)" in message
    stale = nm(nm_status("Done", "2/2"))
    stale["metadata"]["generation"] = 2
    assert outcome(stale)[0] == "waiting", "a Done for an earlier spec is no answer"
    assert outcome(nm())[0] == "waiting"


def test_what_blocks_names_the_budget_the_pod_and_the_nodes_not_started() -> None:
    draining = {"name": "n1", "state": "Draining", "podsLeft": 1, "blockers": [BUDGET_BLOCK]}
    text = what_blocks(nm(nm_status("Draining", "0/2", draining)))
    assert "node n1: Draining, 1 pod left" in text
    assert "shop/web-1: DisruptionBudget (budget shop/web)" in text
    assert "not started: n2" in text


# -- against the API ---------------------------------------------------------------------------


@pytest.fixture
async def api() -> FakeApi:  # async: the fake notifies its watches on the running loop
    fake = FakeApi()
    for n in ("n1", "n2"):
        fake.put(NODES.path(name=n), {"metadata": {"name": n}})
    return fake


async def test_drain_creates_the_maintenance_and_exits_at_once_without_wait(
    api: FakeApi,
) -> None:
    out = io.StringIO()
    body = maintenance_body(["n1", "n2"], name="nm1")
    assert await drain_cmd(api, body, wait=False, limit=0, out=out) == 0
    created = api.obj(NM)
    assert created is not None and created["spec"]["nodes"] == ["n1", "n2"]
    assert out.getvalue() == "nodemaintenance.pilotfish.io/nm1 created\n"


async def test_an_unknown_node_creates_nothing(api: FakeApi) -> None:
    err = io.StringIO()
    body = maintenance_body(["n1", "n9"], name="nm1")
    assert await drain_cmd(api, body, wait=True, limit=1, err=err) == 1
    assert "no such node: n9; nothing was created" in err.getvalue()
    assert api.obj(NM) is None


async def progress_to(api: FakeApi, status: Obj) -> None:
    await wait_for("the maintenance", lambda: api.obj(NM))
    api.put(NM, {**(api.obj(NM) or {}), "status": status})


async def test_wait_follows_the_status_until_done(api: FakeApi) -> None:
    out = io.StringIO()
    body = maintenance_body(["n1", "n2"], name="nm1")
    waiting = asyncio.create_task(drain_cmd(api, body, wait=True, limit=30, out=out))
    draining = {"name": "n1", "state": "Draining", "podsLeft": 1, "blockers": [BUDGET_BLOCK]}
    await progress_to(api, nm_status("Draining", "0/2", draining))
    await wait_for("the blocker printed", lambda: "blocked: shop/web-1" in out.getvalue())
    assert not waiting.done()
    done = [{"name": n, "state": "Drained"} for n in ("n1", "n2")]
    await progress_to(api, nm_status("Done", "2/2", *done))
    assert await asyncio.wait_for(waiting, 5) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == "nodemaintenance.pilotfish.io/nm1 created"
    assert "node n1: Draining, 1 pod left" in lines
    assert "node n2: Drained" in lines
    assert lines[-1] == "nodemaintenance nm1 done: 2/2 nodes drained"


async def test_wait_exits_1_on_failed_and_on_timeout_naming_what_blocks(api: FakeApi) -> None:
    err = io.StringIO()
    waiting = asyncio.create_task(
        drain_cmd(api, maintenance_body(["n1"], name="nm1"), wait=True, limit=30, err=err)
    )
    failed = {"name": "n1", "state": "Failed", "message": "node n1 not found"}
    await progress_to(api, nm_status("Failed", "0/1", failed))
    assert await asyncio.wait_for(waiting, 5) == 1
    assert "nodemaintenance nm1 failed: n1 (node n1 not found)" in err.getvalue()

    err = io.StringIO()
    body = maintenance_body(["n1", "n2"], name="nm2")
    path = NODEMAINTENANCES.path(name="nm2")
    waiting = asyncio.create_task(drain_cmd(api, body, wait=True, limit=0.5, err=err))
    await wait_for("the maintenance", lambda: api.obj(path))
    draining = {"name": "n1", "state": "Draining", "podsLeft": 1, "blockers": [BUDGET_BLOCK]}
    api.put(path, {**(api.obj(path) or {}), "status": nm_status("Draining", "0/2", draining)})
    assert await asyncio.wait_for(waiting, 5) == 1
    text = err.getvalue()
    assert "timed out after 0.5s waiting for nodemaintenance nm2 (0/2 drained)" in text
    assert "shop/web-1: DisruptionBudget (budget shop/web)" in text


async def test_wait_exits_1_when_the_maintenance_is_deleted(api: FakeApi) -> None:
    err = io.StringIO()
    body = maintenance_body(["n1"], name="nm1")
    waiting = asyncio.create_task(drain_cmd(api, body, wait=True, limit=30, err=err))
    await wait_for("the maintenance", lambda: api.obj(NM))
    await asyncio.sleep(0)
    api.remove(NM)
    assert await asyncio.wait_for(waiting, 5) == 1
    assert "nodemaintenance nm1 was deleted" in err.getvalue()
