"""The reclaim controller on the in-memory API with a fake Prometheus: the figure written to
nodes, its threshold, decay and recovery, and giving capacity back by eviction."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from pilotfish import names
from pilotfish.kube.rest import NODES
from pilotfish.operators.reclaim import ReclaimController, reasons
from pilotfish.operators.reclaim.settings import ReclaimSettings
from pilotfish.promql import PromQLError
from tests.fakeapi import eviction_refused, wait_for
from tests.reclaim_harness import SETTINGS, Cluster, metric, node, start, unreachable

GI = 1024**3


@pytest.fixture
async def c() -> AsyncIterator[Cluster]:
    cluster = await start()
    yield cluster
    await cluster.stop()


def production(c: Cluster, on: str = "n1", prefix: str = "") -> None:
    """Production requesting 5.6 cores and 8Gi of an 8-core, 16Gi node, using 3.2 and 4Gi."""
    c.add_node(on)
    c.add_pod(f"{prefix}web", on, cpu="3", memory="5Gi")
    c.add_pod(f"{prefix}api", on, cpu="2600m", memory="3Gi")
    c.prom.use(on, f"{prefix}web", cpu=2.0, memory=3 * GI)
    c.prom.use(on, f"{prefix}api", cpu=1.2, memory=1 * GI)


async def test_batch_allocatable_is_allocatable_minus_p95_minus_margin(c: Cluster) -> None:
    production(c)
    await c.cycle()
    # cpu: 8 - 3.2 - 0.8 = 4 cores; memory: 16Gi - 4Gi - 1717986918.4, floored to the byte
    assert c.figure("n1") == ("4000", "11166914969")
    status = c.node("n1")["status"]
    assert status["capacity"][names.BATCH_CPU] == "4000"
    assert status["capacity"][names.BATCH_MEMORY] == status["allocatable"][names.BATCH_MEMORY]
    cond = c.condition("n1")
    assert (cond["status"], cond["reason"]) == ("True", reasons.MEASURED)
    assert "cpu 4 = allocatable 8 - p95 3200m" in cond["message"]
    figures = c.annotation("n1")
    assert figures["cpu"] == {
        "allocatable": "8",
        "reserved": "5600m",
        "p95": "3200m",
        "margin": "800m",
        "batch": "4",
        "reclaimed": "1600m",
    }
    assert figures["memory"]["reserved"] == "8Gi" and figures["memory"]["p95"] == "4Gi"
    assert figures["memory"]["margin"] == "1717986918"  # whole bytes, as the figure is
    assert cond["lastHeartbeatTime"] == cond["lastTransitionTime"]
    assert (figures["window"], figures["state"]) == ("1h", reasons.MEASURED)
    assert metric("pilotfish_reclaim_batch_allocatable_cores", node="n1") == 4.0
    assert metric("pilotfish_reclaim_reclaimed_cores", node="n1") == 1.6
    # the kubelet's conditions are kept: the condition merges by type
    assert any(x["type"] == "Ready" for x in c.node("n1")["status"]["conditions"])


async def test_a_pod_without_samples_counts_as_its_request(c: Cluster) -> None:
    production(c)
    c.add_pod("new", "n1", cpu="1", memory="1Gi")  # not scraped yet
    await c.cycle()
    assert c.figure("n1")[0] == "3000"  # 8 - (3.2 + 1) - 0.8


async def test_a_new_pod_s_cpu_counts_as_its_request_for_its_first_minute(c: Cluster) -> None:
    production(c)
    c.clock.advance(3600)
    c.add_pod("new", "n1", created="2026-01-01T01:00:30Z", cpu="1", memory="1Gi")
    c.prom.use("n1", "new", cpu=0.1, memory=0.5 * GI)  # a rate(...[1m]) still ramping up
    await c.cycle()  # the pod is 30 s old: 8 - (3.2 + 1) - 0.8
    assert c.figure("n1")[0] == "3000"
    assert c.annotation("n1")["memory"]["p95"] == "4608Mi"  # memory's gauge counts at once
    await c.cycle()  # 90 s old: its p95 counts
    assert c.figure("n1")[0] == "3900"


async def test_a_move_within_two_percent_is_not_written(c: Cluster) -> None:
    production(c)
    await c.cycle()
    writes = c.status_writes("n1")
    c.prom.use("n1", "web", cpu=2.15)  # 150m: under 2 % of 8 cores (160m)
    await c.cycle()
    assert c.status_writes("n1") == writes and c.figure("n1")[0] == "4000"
    c.prom.use("n1", "web", cpu=2.5)  # 500m
    await c.cycle()
    assert c.status_writes("n1") == writes + 1 and c.figure("n1")[0] == "3500"


async def test_stale_data_halves_the_figure_each_cycle_then_recovers(c: Cluster) -> None:
    production(c)
    await c.cycle()
    c.prom.ages["n1"] = 600.0  # older than staleAfter (180 s)
    seen = []
    for _ in range(6):
        await c.cycle()
        seen.append(c.figure("n1")[0])
    # 1 % of 8 cores is 80m: half of 125m is under it, so 0
    assert seen == ["2000", "1000", "500", "250", "125", "0"]
    cond = c.condition("n1")
    assert (cond["status"], cond["reason"]) == ("False", reasons.METRICS_STALE)
    assert "decaying toward 0" in cond["message"] and "600s old" in cond["message"]
    assert "p95" not in c.annotation("n1")["cpu"]
    assert len(await c.events(reasons.EVENT_STALE)) == 1  # once per transition
    assert metric("pilotfish_reclaim_stale_nodes") == 1.0
    await c.cycle()  # memory's 1 % is reached one halving later
    assert c.figure("n1") == ("0", "0")
    writes = c.status_writes("n1")
    await c.cycle()
    assert c.status_writes("n1") == writes  # at 0 nothing moves
    c.prom.ages["n1"] = 5.0
    await c.cycle()
    assert c.figure("n1")[0] == "4000"  # recomputed at once
    assert c.condition("n1")["reason"] == reasons.MEASURED
    assert len(await c.events(reasons.EVENT_RECOVERED)) == 1
    assert metric("pilotfish_reclaim_stale_nodes") == 0.0


async def test_a_node_never_measured_is_not_judged(c: Cluster) -> None:
    """No figure, no condition and no Event on a node without any sample yet: a 0 written
    before its first scrape would read as a full node."""
    c.add_node("n2")
    await c.cycle()
    assert c.figure("n2") == (None, None)
    with pytest.raises(AssertionError, match="no BatchCapacity condition"):
        c.condition("n2")
    assert await c.events(reasons.EVENT_STALE) == []


async def test_prometheus_down_decays_and_says_why(c: Cluster) -> None:
    production(c)
    await c.cycle()
    errors = metric("pilotfish_reclaim_prometheus_errors_total") or 0.0
    c.prom.down = unreachable()
    await c.cycle()
    cond = c.condition("n1")
    assert (cond["status"], cond["reason"]) == ("False", reasons.PROMETHEUS_UNAVAILABLE)
    assert "connection refused" in cond["message"] and "decaying toward 0" in cond["message"]
    assert c.figure("n1")[0] == "2000"
    assert c.annotation("n1")["state"] == reasons.PROMETHEUS_UNAVAILABLE
    assert metric("pilotfish_reclaim_prometheus_errors_total") == errors + 1
    [event] = await c.events(reasons.EVENT_STALE)
    assert event["type"] == "Warning" and event["regarding"]["name"] == "n1"
    c.prom.down = None
    await c.cycle()
    assert c.figure("n1")[0] == "4000"
    assert len(await c.events(reasons.EVENT_RECOVERED)) == 1


async def test_give_back_evicts_newest_lowest_band_first_never_production(c: Cluster) -> None:
    production(c)
    await c.cycle()  # 4 cores of batch
    for name, band, created, cpu in [
        ("old-batch", "batch", "2026-01-01T00:01:00Z", "1000"),
        ("new-batch", "batch", "2026-01-01T00:03:00Z", "1000"),
        ("best-effort", "best-effort", "2026-01-01T00:00:30Z", "1000"),
        ("mid-batch", "batch", "2026-01-01T00:02:00Z", "1000"),
    ]:
        c.add_pod(name, "n1", band=band, created=created, batch_cpu=cpu, batch_memory="1Gi")
    await c.cycle()
    assert {"old-batch", "new-batch", "mid-batch", "best-effort"} <= {
        k.split("/")[1] for k in c.pods()
    }  # 4 cores asked, 4 carried: nothing to give back
    c.prom.use("n1", "web", cpu=3.0)  # production rises: p95 4.2, batch 3 cores
    c.prom.use("n1", "api", cpu=2.2)  # 5.2 used: batch 8 - 5.2 - 0.8 = 2 cores
    await c.cycle()
    assert c.figure("n1")[0] == "2000"
    left = {k.split("/")[1] for k in c.pods()}
    assert left == {"web", "api", "old-batch", "mid-batch"}  # best-effort, then the newest
    evicted = await c.events(reasons.EVENT_EVICTED)
    assert {e["regarding"]["name"] for e in evicted} == {"best-effort", "new-batch"}
    assert all(e["type"] == "Warning" and "node n1" in e["note"] for e in evicted)
    assert metric("pilotfish_reclaim_evictions_total", result="evicted") is not None


async def test_a_pod_without_batch_requests_is_never_evicted(c: Cluster) -> None:
    production(c)
    c.add_pod("untranslated", "n1", band="batch", cpu="500m")  # reserved, not batch
    c.prom.use("n1", "web", cpu=7.0)  # production over everything: batch 0
    await c.cycle()
    assert c.figure("n1")[0] == "0"
    assert {k.split("/")[1] for k in c.pods()} == {"web", "api", "untranslated"}
    assert c.api.writes("/eviction") == []


async def test_a_refused_eviction_is_tried_again_next_cycle(c: Cluster) -> None:
    production(c)
    await c.cycle()
    c.add_pod("task", "n1", band="batch", batch_cpu="3000", batch_memory="1Gi")
    c.prom.use("n1", "web", cpu=4.0)  # batch 8 - 5.2 - 0.8 = 2 cores < 3 asked
    c.api.fail_next("POST", "/eviction", 429, body=eviction_refused("task-budget"))
    refused = metric("pilotfish_reclaim_evictions_total", result="refused") or 0.0
    await c.cycle()
    assert "ns/task" in c.pods()
    assert metric("pilotfish_reclaim_evictions_total", result="refused") == refused + 1
    await c.cycle()
    assert "ns/task" not in c.pods()


async def test_a_node_changed_under_the_write_is_decided_again(c: Cluster) -> None:
    production(c)

    def kubelet_writes() -> None:
        changed = c.node("n1")
        changed["metadata"]["labels"]["other"] = "x"
        c.api.put(NODES.path(name="n1"), changed)

    c.api.before("PATCH", "/nodes/n1/status", kubelet_writes)
    await c.cycle()
    assert c.figure("n1")[0] == "4000"
    assert c.node("n1")["metadata"]["labels"]["other"] == "x"
    assert c.status_writes("n1") == 2  # refused once (409), then written from a fresh copy


async def test_a_failed_write_holds_back_no_other_node_and_no_cycle(c: Cluster) -> None:
    production(c, "n1")
    production(c, "n2", prefix="n2-")
    c.api.fail_next("PATCH", "/nodes/n1/status", 500)
    await c.cycle()
    assert c.figure("n1") == (None, None) and c.figure("n2")[0] == "4000"

    async def broken() -> None:
        raise RuntimeError("a bug")

    c.ctrl.cycle = broken  # type: ignore[method-assign]
    result = await c.ctrl.reconcile("cycle")  # even a cycle that fails waits its turn
    assert result.after == SETTINGS.interval and not result.retry


async def test_production_over_request_on_nodes_hosting_batch(c: Cluster) -> None:
    production(c)
    c.add_pod("task", "n1", band="batch", batch_cpu="500", batch_memory="1Gi")
    c.prom.use("n1", "web", cpu=3.5)  # over its 3-core request
    await c.cycle()
    assert metric("pilotfish_reclaim_production_over_request_pods") == 1.0


async def test_deleted_nodes_lose_their_gauges(c: Cluster) -> None:
    production(c)
    await c.cycle()
    assert metric("pilotfish_reclaim_batch_allocatable_cores", node="n1") == 4.0
    c.api.remove(NODES.path(name="n1"))
    await c.cycle()
    assert metric("pilotfish_reclaim_batch_allocatable_cores", node="n1") is None


async def test_one_cycle_is_three_queries() -> None:
    cluster = await start()
    try:
        for i in range(5):
            production(cluster, f"n{i}", prefix=f"n{i}-")
        await cluster.cycle()
        assert len(cluster.prom.queries) == 3
        assert all(cluster.figure(f"n{i}")[0] == "4000" for i in range(5))
        assert all("[1h:60s]" in q for q in cluster.prom.queries[:2])
    finally:
        await cluster.stop()


async def test_without_a_prometheus_url_reclaim_is_off(caplog: pytest.LogCaptureFixture) -> None:
    cluster = await start()
    try:
        off = ReclaimController(cluster.rt, settings=ReclaimSettings())
        assert not off.enabled
        caplog.set_level(logging.INFO, "pilotfish.reclaim")
        task = asyncio.ensure_future(off.run())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not task.done()  # a guarded task that ends would stop the operator
        task.cancel()
        assert [r.message for r in caplog.records if "reclaim is off" in r.message]
        assert cluster.api.writes() == []
    finally:
        await cluster.stop()


async def test_the_queue_runs_a_cycle_each_interval() -> None:
    settings = ReclaimSettings("http://prometheus.test", interval=0.05, stale_after=180)
    cluster = await start(settings)
    try:
        production(cluster)
        task = asyncio.ensure_future(cluster.ctrl.run())
        await wait_for("two cycles", lambda: len(cluster.prom.queries) >= 6)
        assert cluster.figure("n1")[0] == "4000"
        task.cancel()
    finally:
        await cluster.stop()


def test_a_bad_query_answer_is_an_error_not_a_figure() -> None:
    e = PromQLError("q", "bad_data", "parse error")
    assert (e.error_type, str(e)) == ("bad_data", "bad_data: parse error")
    assert SETTINGS.enabled and not ReclaimSettings().enabled
    assert node("x")["status"]["allocatable"]["cpu"] == "8"
