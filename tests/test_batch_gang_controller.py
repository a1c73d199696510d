"""The batch gang gate through the real gate controller on the fake API server
(`tests.gates_harness`): the size read from the BatchWorkload informer, one round that
releases every member, what the pods and Events say while waiting, and a release cut short
by kill -9 completed exactly once by the next process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pilotfish import gates
from pilotfish.kube.rest import BATCHWORKLOADS, PODS
from pilotfish.operators.gates.apply import REASON_RELEASED, ROUND
from tests.gates_harness import Harness, running
from tests.test_batch_gang import batch, task_pod

GANG = gates.GANG_GATE


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    async with running(tmp_path) as harness:
        yield harness


def put_batch(h: Harness, **kw: Any) -> None:
    obj = batch(**kw)
    h.api.put(BATCHWORKLOADS.path("team-a", obj["metadata"]["name"]), obj)


def state(h: Harness, name: str) -> dict[str, Any]:
    [cond] = [c for c in h.pod(name)["status"]["conditions"] if c["type"] == gates.POD_CONDITION]
    return dict(cond)


async def test_the_controller_reads_the_processs_shared_batchworkload_informer(
    h: Harness,
) -> None:
    assert h.c.batches is h.rt.factory.informer(BATCHWORKLOADS)


async def test_members_wait_until_all_exist_then_go_in_one_round(h: Harness) -> None:
    put_batch(h, gang=3)
    for n in "ab":
        h.add(task_pod(n))
    await h.round()
    assert all(h.gate_patches(n) == [] for n in "ab")
    cond = state(h, "a")
    assert (cond["status"], cond["reason"]) == ("False", gates.STATE_GATED)
    assert cond["message"] == f"waiting for {GANG} (gang train: 2/3 pods present)"

    h.add(task_pod("c"))
    await h.round()
    assert all(h.pod(n)["spec"]["schedulingGates"] == [] for n in "abc")
    lines = h.lines()
    assert sorted(r["pod"] for r in lines) == ["team-a/a", "team-a/b", "team-a/c"]
    assert len({r["ts"] for r in lines}) == 1, "one round released the gang"
    [note] = [e["note"] for e in h.events() if e["reason"] == REASON_RELEASED]
    assert note.startswith(
        f"released {GANG} from 3 pods in one round: a, b, c; gang train: 3/3 pods present, 3 ready"
    ), "one Event for the gang's round, naming its members"


async def test_the_size_follows_the_workload_in_the_informer(h: Harness) -> None:
    """No spec.gang yet: held, saying so; once the workload shows its gang, the members go."""
    put_batch(h, gang=None)
    for n in "ab":
        h.add(task_pod(n))
    await h.round()
    assert (
        "BatchWorkload team-a/train cannot size it: it has no spec.gang"
        in (state(h, "a")["message"])
    )
    assert h.pod("a")["spec"]["schedulingGates"] == [{"name": GANG}]
    put_batch(h, gang=2)
    await h.round()
    assert all(h.pod(n)["spec"]["schedulingGates"] == [] for n in "ab")


async def test_a_release_cut_short_by_kill_9_is_completed_once_after_restart(
    h: Harness, tmp_path: Path
) -> None:
    """a's and b's releases are written, c's is not (the process dies); a and b run to
    completion before the next process starts. It releases c, and only c, and audits it."""
    put_batch(h, gang=3)
    for n in "abc":
        h.add(task_pod(n))
    await h.api.settle()
    h.api.fail_next("PATCH", "/pods/c", 503)
    with pytest.raises(Exception, match="503"):
        await h.round()
    assert h.pod("c")["spec"]["schedulingGates"] == [{"name": GANG}]
    await h.stop()
    for n in "ab":
        done = h.pod(n)
        done["status"]["phase"] = "Succeeded"
        h.api.put(PODS.path("team-a", n) + "/status", done)
    for i in range(2):  # a new process, then another: nothing is released twice
        fresh = Harness(h.api, tmp_path, identity=f"test-{i + 2}")
        await fresh.start()
        await fresh.round()
        await fresh.round()
        await fresh.stop()
    assert h.pod("c")["spec"]["schedulingGates"] == []
    assert [len(h.gate_patches(n)) for n in "abc"] == [1, 1, 2], "c: the refused one, then one"
    got = sorted((r["pod"], r["decision"]) for r in h.lines())
    assert got == [("team-a/a", "released"), ("team-a/b", "released"), ("team-a/c", "released")]
    [line_c] = [r for r in h.lines() if r["pod"] == "team-a/c"]
    assert "its release began in an earlier round (2 of 3 released)" in line_c["evidence"]


async def test_a_workloads_gang_change_starts_a_round_and_its_status_writes_do_not(
    h: Harness,
) -> None:
    """The batch operator writes a workload's status on every sync; only what sizes a gang
    (its uid, its spec.gang) is worth a round of every gated pod."""
    put_batch(h, gang=3)
    await h.api.settle()
    while len(h.c.queue):
        await h.c.queue.get()
        h.c.queue.done(ROUND)
    with_status = batch(gang=3) | {"status": {"active": 2, "waiting": 1}}
    h.api.put(BATCHWORKLOADS.path("team-a", "train"), with_status)
    await h.api.settle()
    assert len(h.c.queue) == 0, "a status write starts no round"
    put_batch(h, gang=2)
    await h.api.settle()
    assert len(h.c.queue) == 1, "a new spec.gang does"
