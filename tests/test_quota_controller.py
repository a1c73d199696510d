"""TeamQuota status: usage from pods, reservations settled or returned; the real controller on
the real factory and informers, against the fake API server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from fractions import Fraction
from typing import Any

import pytest

from pilotfish import ledger, tasks
from pilotfish.api.teamquota import SUMMARY_MAX_LENGTH, TeamQuotaStatus
from pilotfish.kube.rest import NAMESPACES, PODS, TEAMQUOTAS
from pilotfish.kube.runtime import Runtime
from pilotfish.ledger import RESERVATION_TTL_SECONDS
from pilotfish.operators.quota import QuotaController
from pilotfish.operators.quota.decide import band_summary, decide, desired_status, next_expiry
from pilotfish.quota import band_resources
from pilotfish.timeutil import FakeClock
from tests.fakeapi import FakeApi, wait_for

QUOTA_GATE = "gates.pilotfish.io/quota-available"
Obj = dict[str, Any]


def pod(
    uid: str,
    cpu: str,
    band: str = "production",
    phase: str = "Running",
    ns: str = "ns",
    gated: bool = False,
    name: str | None = None,
    memory: str | None = None,
) -> Obj:
    requests = {"cpu": cpu} | ({"memory": memory} if memory else {})
    spec: Obj = {"containers": [{"name": "c", "resources": {"requests": requests}}]}
    if gated:
        spec["schedulingGates"] = [{"name": QUOTA_GATE}]
    return {
        "metadata": {
            "name": name or uid,
            "namespace": ns,
            "uid": uid,
            "labels": {"pilotfish.io/band": band},
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def reservation(uid: str, cpu: str, time: str = "2026-01-01T00:00:00Z") -> Obj:
    return {
        "pod": f"ns/{uid}",
        "uid": uid,
        "band": "production",
        "resources": {"cpu": cpu, "pods": 1},
        "time": time,
    }


def tq(*reservations: Obj, team: str = "t", name: str = "t") -> Obj:
    return {
        "metadata": {"name": name, "generation": 3, "resourceVersion": "9"},
        "spec": {"team": team, "bands": {"production": {"cpu": "10"}}},
        "status": {"reservations": list(reservations)},
    }


def charges(*pods: Obj) -> ledger.TeamCharges:
    return ledger.TeamCharges.of(ledger.charge_of(p) for p in pods)


# --- decide (pure) -------------------------------------------------------------------------


def test_used_counts_running_pods_per_band() -> None:
    status = desired_status(
        tq(),
        charges(
            pod("a", "2"),
            pod("b", "500m"),
            pod("c", "1", "batch"),
            pod("d", "4", phase="Succeeded"),
            pod("g", "4", gated=True),
        ),
        {},
    )
    assert status["used"] == {
        "batch": {"cpu": "1", "pods": 1},
        "production": {"cpu": "2500m", "pods": 2},
    }
    assert status["observedGeneration"] == 3


def test_reservation_of_a_counted_pod_is_dropped_in_the_same_write() -> None:
    status = desired_status(
        tq(reservation("a", "2"), reservation("x", "1")), charges(pod("a", "2")), {}
    )
    assert [r["uid"] for r in status["reservations"]] == ["x"]
    assert status["reserved"] == {"production": {"cpu": "1", "pods": 1}}
    assert status["used"]["production"]["cpu"] == "2"


def test_a_gated_pod_keeps_its_reservation_and_a_finished_one_returns_it() -> None:
    """The gate controller reserves before it removes the last gate: dropping the
    reservation of a pod seen but still gated would free room the release is about to use."""
    old = {"g": RESERVATION_TTL_SECONDS * 10, "f": 1.0}
    status = desired_status(
        tq(reservation("g", "2"), reservation("f", "2")),
        charges(pod("g", "2", gated=True), pod("f", "2", phase="Failed")),
        old,
    )
    assert [r["uid"] for r in status["reservations"]] == ["g"]
    assert "production" not in status["used"]


def test_reservation_of_a_pod_never_seen_is_returned_ttl_after_it_was_first_seen() -> None:
    # The stamp written by admission is never compared with this machine's clock.
    stamped_long_ago = reservation("soon", "1", "2020-01-01T00:00:00Z")
    ages = {"gone": RESERVATION_TTL_SECONDS + 1, "soon": 5.0}
    status = desired_status(tq(reservation("gone", "1"), stamped_long_ago), charges(), ages)
    assert [r["uid"] for r in status["reservations"]] == ["soon"]
    assert next_expiry({"status": status}, charges(), ages) == RESERVATION_TTL_SECONDS - 5
    assert next_expiry({"status": status}, charges(pod("soon", "1", gated=True)), ages) is None


def test_quantities_are_exact_canonical_strings_in_status() -> None:
    assert band_resources(
        {
            "cpu": Fraction(3, 2),
            "example.com/fpga": Fraction(2),
            "gpus": Fraction(1),
            "memory": Fraction(3 * 2**29),
            "pods": Fraction(0),
        }
    ) == {"cpu": "1500m", "memory": "1536Mi", "gpus": 1, "extended": {"example.com/fpga": "2"}}
    # Below the nano-unit the API server rounds up; so does Pilotfish.
    assert band_resources({"cpu": Fraction(1, 3)}) == {"cpu": "333333334n"}


def test_absurd_usage_is_written_saturated_and_never_as_a_json_number() -> None:
    beyond = Fraction(10) ** 400  # what a sum of bombs could reach without saturation
    written = band_resources({"cpu": beyond, "memory": beyond, "gpus": beyond, "pods": beyond})
    assert written == {
        "cpu": "9223372036854775808",
        "memory": "8Ei",
        "gpus": 2**63 - 1,
        "pods": 2**63 - 1,
    }


def test_summary_per_band_is_held_against_the_limit_in_canonical_quantities() -> None:
    quota = tq(reservation("x", "500m"))
    quota["spec"]["bands"] = {
        "production": {"cpu": "2", "memory": "166429982720", "pods": 10},
        "batch": {},
    }
    running = pod("a", "1")
    running["spec"]["containers"][0]["resources"]["requests"]["memory"] = "1073741824"
    status = desired_status(quota, charges(running, pod("b", "3750m", "batch")), {})
    assert status["summary"] == {
        # used (1 CPU, 1Gi, 1 pod) plus the reservation not counted yet (500m, 1 pod)
        "production": "cpu 1500m/2, memory 1Gi/155Gi, pods 2/10",
        "batch": "cpu 3750m/unlimited, memory 0/unlimited, pods 1/unlimited",
        "best-effort": "not granted",
    }
    # It is a valid status for the CRD's schema, column by column.
    parsed = TeamQuotaStatus.model_validate(status)
    assert parsed.summary.best_effort == "not granted"


def test_summary_of_a_band_not_granted_says_what_it_still_holds() -> None:
    # A band taken out of the spec while its pods run: they are not evicted, and say so.
    held = {"cpu": Fraction(1), "memory": Fraction(2**30), "pods": Fraction(1)}
    assert band_summary(None, held) == "not granted (holds cpu 1, memory 1Gi, pods 1)"


def test_summary_shows_gpus_and_extended_resources_only_when_limited_or_held() -> None:
    limits = {"cpu": Fraction(8), "gpus": Fraction(4), "example.com/fpga": Fraction(2)}
    held = {"cpu": Fraction(1, 2), "pods": Fraction(1), "example.com/nic": Fraction(1)}
    assert band_summary(limits, held) == (
        "cpu 500m/8, memory 0/unlimited, gpus 0/4, pods 1/unlimited, "
        "example.com/fpga 0/2, example.com/nic 1/unlimited"
    )
    assert "gpus" not in band_summary({"cpu": Fraction(1)}, {})


def test_summary_is_cut_short_within_the_schema_limit() -> None:
    limits = {f"example.com/{'r' * 50}{i:02}": Fraction(10**15) for i in range(32)}
    text = band_summary(limits, {})
    assert len(text) <= SUMMARY_MAX_LENGTH
    assert text.endswith(" ...")


def test_no_plan_when_nothing_changed_so_no_write_happens() -> None:
    quota = tq()
    first = decide(quota, charges(pod("a", "2")), {})
    assert first is not None and first.from_version == "9"
    assert decide({**quota, "status": first.status}, charges(pod("a", "2")), {}) is None


# --- the controller ------------------------------------------------------------------------


class Running:
    def __init__(self, api: FakeApi, controller: QuotaController, clock: FakeClock) -> None:
        self.api, self.controller, self.clock = api, controller, clock

    def status(self, name: str = "t") -> Obj:
        obj = self.api.obj(TEAMQUOTAS.path(name=name))
        assert obj is not None
        return dict(obj.get("status") or {})

    def used_cpu(self, name: str = "t") -> str | None:
        used: str | None = ((self.status(name).get("used") or {}).get("production") or {}).get(
            "cpu"
        )
        return used

    def held(self, band: str, name: str = "t") -> dict[str, Any]:
        """`used` of `band` as written (empty before anything is)."""
        return dict((self.status(name).get("used") or {}).get(band) or {})

    def reserved_uids(self, name: str = "t") -> list[str]:
        return [r["uid"] for r in self.status(name).get("reservations") or []]

    def put_pod(self, p: Obj) -> None:
        self.api.put(PODS.path(p["metadata"]["namespace"], p["metadata"]["name"]), p)

    def put_tq(self, obj: Obj) -> None:
        """Written as admission or the gate controller would: a reservation added."""
        obj = dict(obj)
        obj["metadata"] = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
        self.api.put(TEAMQUOTAS.path(name=obj["metadata"]["name"]), obj)

    def add_reservation(self, r: Obj, name: str = "t") -> None:
        current = self.api.obj(TEAMQUOTAS.path(name=name))
        assert current is not None
        status = current.setdefault("status", {})
        status["reservations"] = [*(status.get("reservations") or []), r]
        self.put_tq(current)


def namespace(name: str, team: str) -> Obj:
    return {"metadata": {"name": name, "labels": {"pilotfish.io/team": team}}}


@contextlib.asynccontextmanager
async def started(min_write_interval: float) -> AsyncIterator[Running]:
    api = FakeApi()
    clock = FakeClock()
    api.put(NAMESPACES.path(name="ns"), namespace("ns", "t"))
    api.put(NAMESPACES.path(name="other"), namespace("other", "u"))
    api.put(TEAMQUOTAS.path(name="t"), tq())
    api.put(TEAMQUOTAS.path(name="u"), tq(team="u", name="u"))
    rt = Runtime.build(api, identity="quota-test", clock=clock, resync_seconds=None)
    controller = QuotaController(rt, min_write_interval=min_write_interval)
    guarded = tasks.run_guarded({"informers": rt.factory.run(), "quota": controller.run()})
    task = asyncio.ensure_future(guarded)
    try:
        await rt.factory.wait_synced()
        yield Running(api, controller, clock)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, tasks.TaskDied):
            await task


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    async with started(min_write_interval=0.0) as run:
        yield run


@pytest.fixture
async def coalescing() -> AsyncIterator[Running]:
    """Writes that only lower `used` coalesced to one a second, as in production."""
    async with started(min_write_interval=1.0) as run:
        await wait_for("the first status written", lambda: "summary" in run.status())
        yield run


async def test_pods_are_counted_and_their_reservations_settled(running: Running) -> None:
    running.add_reservation(reservation("a", "2"))
    await running.api.settle()
    assert running.reserved_uids() == ["a"], "its pod not seen yet: still owed"
    running.put_pod(pod("a", "2"))
    running.put_pod(pod("b", "1"))
    await wait_for("both pods counted", lambda: running.used_cpu() == "3")
    assert running.reserved_uids() == [], "counted and settled in one write"
    summary = running.status()["summary"]["production"]
    assert summary == "cpu 3/10, memory 0/unlimited, pods 2/unlimited"


async def test_a_released_pod_holds_its_reservation_until_it_runs(running: Running) -> None:
    running.put_pod(pod("g", "4", gated=True))
    running.add_reservation(reservation("g", "4"))  # the gate controller's release
    await running.api.settle()
    await wait_for("a settled status", lambda: "summary" in running.status())
    assert running.reserved_uids() == ["g"]
    assert running.used_cpu() is None
    running.put_pod(pod("g", "4"))  # the gate removed
    await wait_for("the released pod counted", lambda: running.used_cpu() == "4")
    assert running.reserved_uids() == []
    running.put_pod(pod("g", "4", phase="Succeeded"))
    await wait_for(
        "the finished pod's room returned", lambda: running.used_cpu() is None, within=5.0
    )


async def test_a_reservation_whose_pod_never_appears_expires_on_this_clock(
    running: Running,
) -> None:
    running.add_reservation(reservation("lost", "1", "2020-01-01T00:00:00Z"))
    await running.api.settle()
    await wait_for("a settled status", lambda: "summary" in running.status())
    assert running.reserved_uids() == ["lost"], "an old stamp from another clock means nothing"
    scheduled = running.controller.queue.scheduled("t")
    assert scheduled is not None and scheduled <= RESERVATION_TTL_SECONDS + 1
    running.clock.advance(RESERVATION_TTL_SECONDS - 1)
    running.controller.queue.add("t")
    await running.api.settle()
    assert running.reserved_uids() == ["lost"]
    running.clock.advance(2)
    running.controller.queue.add("t")  # what the wake-up timer does when it fires
    await wait_for("the reservation returned", lambda: running.reserved_uids() == [])


async def test_a_conflict_is_retried_by_the_queue_from_the_newer_copy(running: Running) -> None:
    running.api.fail_next("PUT", "teamquotas/t/status", 409)
    running.put_pod(pod("a", "2"))
    await wait_for(
        "the pod counted after the conflict", lambda: running.used_cpu() == "2", within=5.0
    )
    puts = [c for c in running.api.writes("teamquotas/t/status") if c.method == "PUT"]
    assert len(puts) >= 2
    assert all(c.body["metadata"]["resourceVersion"] for c in puts), "every write conditional"


async def test_moving_a_namespace_to_another_team_moves_its_pods_charge(running: Running) -> None:
    running.put_pod(pod("a", "2"))
    await wait_for("team t charged", lambda: running.used_cpu("t") == "2")
    running.api.put(NAMESPACES.path(name="ns"), namespace("ns", "u"))
    await wait_for("team u charged", lambda: running.used_cpu("u") == "2")
    await wait_for("team t released", lambda: running.used_cpu("t") is None)


async def test_a_quiet_team_costs_no_writes_and_an_unsettled_write_is_waited_for(
    running: Running,
) -> None:
    running.put_pod(pod("a", "2"))
    await wait_for("the pod counted", lambda: running.used_cpu() == "2")
    await running.api.settle()
    before = len(running.api.writes("teamquotas"))
    assert (await running.controller.reconcile("t")).after is None
    assert len(running.api.writes("teamquotas")) == before
    # While a write of ours is not in the cache, its copy is older than it: wait, never
    # decide (the event that shows the write re-enqueues the TeamQuota).
    running.controller.writes.wrote("t", {"metadata": {"resourceVersion": "not-seen-yet"}})
    running.put_pod(pod("b", "1"))
    await running.api.settle()
    result = await running.controller.reconcile("t")
    assert result.after is not None and not result.retry
    assert len(running.api.writes("teamquotas")) == before
    assert running.used_cpu() == "2"


async def test_returned_room_is_written_once_per_interval_and_new_usage_at_once(
    coalescing: Running,
) -> None:
    run, api, clock = coalescing, coalescing.api, coalescing.clock
    clock.advance(1.0)
    run.put_pod(pod("a", "1"))
    await wait_for("a pod after a quiet interval counted at once", lambda: run.used_cpu() == "1")
    # A pod starting within the interval raises what is held: counted at once, or its
    # room could be handed out twice.
    run.put_pod(pod("b", "1"))
    await wait_for("a started pod counted at once", lambda: run.used_cpu() == "2")
    clock.advance(1.0)
    for i in range(4):
        run.put_pod(pod(f"c{i}", "1"))
    await wait_for("more pods counted", lambda: run.used_cpu() == "6")
    writes = len(api.writes("teamquotas/t/status"))
    for i in range(4):  # ending within the interval: room returned, not yet written
        run.put_pod(pod(f"c{i}", "1", phase="Succeeded"))
    await api.settle()
    assert run.used_cpu() == "6"
    assert len(api.writes("teamquotas/t/status")) == writes
    scheduled = run.controller.queue.scheduled("t")
    assert scheduled is not None and scheduled <= 1.0
    clock.advance(1.0)
    await wait_for("the room returned in one write", lambda: run.used_cpu() == "2")
    await api.settle()
    assert len(api.writes("teamquotas/t/status")) == writes + 1


async def test_usage_no_limit_bounds_is_written_once_per_interval(coalescing: Running) -> None:
    """Batch is not granted here and production limits cpu only: pods of the batch band
    and production's memory change no decision, so a team creating them by the dozen costs
    one TeamQuota write a second, not one per pod."""
    run, api, clock = coalescing, coalescing.api, coalescing.clock
    clock.advance(1.0)
    run.put_pod(pod("first", "0", band="batch"))
    await wait_for("a pod after a quiet interval counted at once", lambda: run.held("batch"))
    writes = len(api.writes("teamquotas/t/status"))
    for i in range(6):
        run.put_pod(pod(f"b{i}", "0", band="batch"))
    run.put_pod(pod("m", "0", memory="1Gi"))
    await api.settle()
    assert len(api.writes("teamquotas/t/status")) == writes, "nothing written within the interval"
    clock.advance(1.0)
    await wait_for("all of them in one write", lambda: run.held("batch").get("pods") == 7)
    await api.settle()
    assert len(api.writes("teamquotas/t/status")) == writes + 1
    assert run.status()["used"]["production"]["memory"] == "1Gi"


async def test_a_reservation_is_settled_at_once_while_its_pod_is_there(
    coalescing: Running,
) -> None:
    run = coalescing
    run.put_pod(pod("g", "4", gated=True))
    run.add_reservation(reservation("g", "4"))  # the gate controller's release
    await run.api.settle()
    run.put_pod(pod("g", "4"))  # runs within the interval: counted, reservation settled
    await wait_for("counted and settled at once", lambda: run.reserved_uids() == [])
    assert run.used_cpu() == "4"
