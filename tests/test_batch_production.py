"""Production first: while a production pod waits for placement no BatchWorkload creates
pods (gangs included), every held job goes on the moment the last one binds, and one that
never binds stops holding after a bounded time."""

from __future__ import annotations

from typing import Any

import pytest

from pilotfish import metrics, names
from pilotfish.cli.whybatch import explain_batch
from pilotfish.kube.rest import PODS
from pilotfish.operators.batchworkload.production import (
    ARRIVAL_WINDOW_SECONDS,
    MAX_WAIT_SECONDS,
    MIN_YIELD_RATE,
    YIELD_SHARE,
    ProductionWaiting,
    arriving_pod,
    fresh_sighting,
    waiting_for_placement,
    yield_rate,
)
from pilotfish.timeutil import FakeClock
from tests.batch_harness import NS, Cluster, World, batch, production_pod, start

Obj = dict[str, Any]


async def world(spec: Obj, **kw: float) -> World:
    return await start(Cluster(), FakeClock(), create=spec, **kw)


def test_which_pods_wait_for_placement() -> None:
    assert waiting_for_placement(production_pod())
    by_class = production_pod(priorityClassName=names.PRIORITY_CLASS["production"])
    by_class["metadata"]["labels"] = {}
    assert waiting_for_placement(by_class)
    assert not waiting_for_placement(production_pod(nodeName="kwok-1"))
    assert not waiting_for_placement(production_pod(schedulingGates=[{"name": "x"}]))
    ended = production_pod()
    ended["status"]["phase"] = "Failed"
    assert not waiting_for_placement(ended)
    batch_pod = production_pod()
    batch_pod["metadata"]["labels"] = {names.LABEL_BAND: "batch"}
    assert not waiting_for_placement(batch_pod)


def test_a_waiting_pod_counts_for_a_bounded_time_from_its_first_sighting() -> None:
    waiting = ProductionWaiting()
    assert not waiting.observe("ns/a", production_pod("a"), 0.0)
    assert not waiting.observe("ns/a", production_pod("a"), 20.0)  # an update: same start
    assert waiting.count(20.0) == 1 and waiting.until_aged_out(20.0) == pytest.approx(10.0)
    assert waiting.count(MAX_WAIT_SECONDS) == 0 and waiting.until_aged_out(30.0) is None
    assert not waiting.observe("ns/b", production_pod("b"), 1.0)
    assert not waiting.observe("ns/a", None, 2.0)  # deleted; b still waits
    assert waiting.observe("ns/b", production_pod("b", nodeName="n"), 3.0)  # the last binds


async def test_a_waiting_production_pod_holds_creation_until_it_binds() -> None:
    w = await world(batch(completions=20, parallelism=20), sync_interval=100.0)
    try:
        w.api.put(PODS.path(NS, "web-1"), production_pod())
        result = await w.step()
        assert w.api.creates() == []
        pacing = w.api.status()["pacing"]
        assert pacing["heldForProduction"] == 1
        assert result.after is not None and 29 < result.after < 31  # its ageing out
        assert metrics.BATCH_HELD_FOR_PRODUCTION._value.get() == 1
        says = " ".join(explain_batch(w.api.bw(), w.clock.now()))
        assert "holding creation: 1 production pods waiting for placement" in says

        w.api.bind("web-1")
        await w.step()  # at once: the coalescing interval (100 s) does not apply
        assert len(w.api.creates()) > 0
        assert w.api.status()["pacing"]["heldForProduction"] == 0
        assert metrics.BATCH_HELD_FOR_PRODUCTION._value.get() == 0
    finally:
        await w.stop()


def test_arrivals_are_remembered_for_a_window_from_the_first_sighting() -> None:
    waiting = ProductionWaiting()
    assert not waiting.arriving(0.0)
    waiting.observe("ns/a", production_pod("a"), 1.0)
    waiting.observe("ns/a", production_pod("a", nodeName="n"), 1.5)  # bound at once
    assert waiting.arriving(1.0 + ARRIVAL_WINDOW_SECONDS - 0.1)
    assert not waiting.arriving(1.0 + ARRIVAL_WINDOW_SECONDS)
    waiting.observe("ns/a", production_pod("a", nodeName="n"), 20.0)  # an update: no arrival
    assert not waiting.arriving(20.0)


def test_a_new_production_pod_is_an_arrival_even_when_already_bound() -> None:
    waiting = ProductionWaiting()
    bound = production_pod("a", nodeName="n")  # the scheduler was faster than the operator
    waiting.observe("ns/a", bound, 1.0, fresh=fresh_sighting("ADDED", bound, None))
    assert waiting.arriving(1.0 + ARRIVAL_WINDOW_SECONDS - 0.1)
    assert waiting.count(1.0) == 0  # it arrived, but nothing waits


def test_running_gated_or_batch_pods_are_not_arrivals() -> None:
    running = production_pod("a", nodeName="n")
    running["status"]["phase"] = "Running"  # listed after a restart: not new
    assert not arriving_pod(running)
    assert not arriving_pod(production_pod("b", schedulingGates=[{"name": "g"}]))
    batch_pod = production_pod("c")
    batch_pod["metadata"]["labels"] = {names.LABEL_BAND: "batch"}
    assert not arriving_pod(batch_pod)
    deleting = production_pod("d")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not arriving_pod(deleting)


def test_a_pod_arrives_when_its_last_gate_goes_not_on_other_updates() -> None:
    gated = production_pod("a", schedulingGates=[{"name": "g"}])
    released = production_pod("a", nodeName="n")
    assert fresh_sighting("MODIFIED", released, gated)
    assert not fresh_sighting("MODIFIED", released, released)
    waiting = ProductionWaiting()
    waiting.observe("ns/a", released, 5.0, fresh=fresh_sighting("MODIFIED", released, released))
    assert not waiting.arriving(5.0)


def test_the_yield_is_a_share_of_the_rate_before_yielding_with_a_floor() -> None:
    assert yield_rate(100.0) == pytest.approx(100.0 * YIELD_SHARE)
    assert yield_rate(0.0) == MIN_YIELD_RATE


async def test_arriving_production_slows_creation_to_the_yield_rate_then_it_resumes() -> None:
    w = await world(batch(completions=200, parallelism=200), sync_interval=0.0)
    try:
        w.api.put(PODS.path(NS, "web-1"), production_pod())
        await w.converge()
        w.api.bind("web-1")  # placed at once: nothing waits, but production is arriving
        await w.converge()
        first = len(w.api.creates())
        assert 0 < first <= MIN_YIELD_RATE  # the bucket's burst: one second's worth
        assert w.api.status()["pacing"]["yieldRate"] == MIN_YIELD_RATE
        says = " ".join(explain_batch(w.api.bw(), w.clock.now()))
        assert f"yielding to production pods arriving: at most {MIN_YIELD_RATE:g}" in says
        for n in w.api.creates():
            w.api.bind(n)
        w.clock.advance(1.0)
        await w.converge()
        assert len(w.api.creates()) <= first + MIN_YIELD_RATE
        for n in w.api.creates():
            w.api.bind(n)
        w.clock.advance(ARRIVAL_WINDOW_SECONDS)
        await w.converge()
        assert len(w.api.creates()) > first + 2 * MIN_YIELD_RATE  # paced by binds again
        assert w.api.status()["pacing"]["yieldRate"] == 0
    finally:
        await w.stop()


async def test_a_production_pod_that_never_binds_stops_holding_after_a_while() -> None:
    w = await world(batch(completions=5, parallelism=5))
    try:
        w.api.put(PODS.path(NS, "web-1"), production_pod())
        await w.converge()
        assert w.api.creates() == []
        w.clock.advance(MAX_WAIT_SECONDS + 0.1)
        await w.converge()
        assert len(w.api.creates()) == 5
    finally:
        await w.stop()


async def test_a_production_pod_bound_before_the_operator_sees_it_still_slows_batch() -> None:
    w = await world(batch(completions=200, parallelism=200), sync_interval=0.0)
    try:
        w.api.put(PODS.path(NS, "web-1"), production_pod(nodeName="kwok-1"))
        await w.converge()
        assert 0 < len(w.api.creates()) <= MIN_YIELD_RATE
        assert w.api.status()["pacing"]["yieldRate"] == MIN_YIELD_RATE
    finally:
        await w.stop()


async def test_bound_or_gated_production_pods_do_not_hold() -> None:
    w = await world(batch(completions=3, parallelism=3))
    try:
        w.api.put(PODS.path(NS, "web-1"), production_pod(nodeName="kwok-1"))
        w.api.put(PODS.path(NS, "web-2"), production_pod("web-2", schedulingGates=[{"name": "g"}]))
        await w.converge()
        assert len(w.api.creates()) == 3
    finally:
        await w.stop()


async def test_the_gang_is_held_too_and_deletes_and_status_go_on() -> None:
    w = await world(batch(completions=6, parallelism=6, gang=4))
    try:
        w.api.put(PODS.path(NS, "web-1"), production_pod())
        await w.converge()
        assert w.api.creates() == []
        assert w.api.status()["waiting"] == 6
        w.api.bind("web-1")
        await w.converge()
        assert len(w.api.creates()) == 6
        w.api.run_all()
        w.api.put(PODS.path(NS, "web-2"), production_pod("web-2"))
        await w.converge()
        assert w.api.status()["succeeded"] == 6  # recorded while held
        names_left = {p["metadata"]["name"] for p in w.api.pods_of()}
        assert names_left == {"web-1", "web-2"}  # and the tasks deleted
    finally:
        await w.stop()
