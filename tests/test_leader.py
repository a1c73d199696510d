"""Leader election: the pure decision, and the elector driven by a fake clock and lease store.

The store plays the API server: it keeps one Lease with a resourceVersion, refuses stale
writes with 409, and can be "down" (connection refused) or hung for windows of fake time.
Time only moves when the elector sleeps, so every scenario is exact and instant. The fake
clock's monotonic reading is the world's time; its wall time starts at T0.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
from collections.abc import Mapping
from typing import Any

import aiohttp
import pytest

from pilotfish.kube.leader import (
    ANNOTATION_CLOCK,
    LeaderElector,
    LeaseRecord,
    Outcome,
    Verdict,
    clock_stamp,
    decide,
    record_of,
    stamp_age,
)
from pilotfish.kube.rest import ApiError
from pilotfish.timeutil import SYSTEM_CLOCK, FakeClock
from pilotfish.timeutil import format_micro_time as micro_time

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
BOOT = "5f0c1d2e-boot"  # the boot id the elector under test runs on


class Horizon(Exception):
    """The scenario's end: raised by the fake sleep so a loop that never returns stops."""


class World:
    """Fake time plus a one-Lease API server with outage windows."""

    def __init__(self, horizon: float = 120.0) -> None:
        self.clock = FakeClock(T0, monotonic_start=0.0)
        self.horizon = horizon
        self.obj: dict[str, Any] | None = None
        self.rv = 0
        self.down: list[tuple[float, float]] = []
        self.hang = False
        self.writes: list[tuple[float, str]] = []
        self.conflicts = 0

    # time

    @property
    def now(self) -> float:
        return self.clock.monotonic()

    def wall(self) -> datetime.datetime:
        return self.clock.now()

    def advance_to(self, t: float) -> None:
        self.clock.advance(t - self.now)

    async def sleep(self, seconds: float) -> None:
        self.clock.advance(seconds)
        if self.now > self.horizon:
            raise Horizon
        await asyncio.sleep(0)

    # the API

    async def _call(self) -> None:
        if self.hang:
            await asyncio.Event().wait()
        if any(start <= self.now < end for start, end in self.down):
            raise aiohttp.ClientConnectionError("connection refused")

    def put(
        self, spec: dict[str, Any], annotations: dict[str, str] | None = None
    ) -> dict[str, Any]:
        self.rv += 1
        meta = {"resourceVersion": str(self.rv), "annotations": dict(annotations or {})}
        self.obj = {"metadata": meta, "spec": copy.deepcopy(spec)}
        self.writes.append((self.now, str(spec.get("holderIdentity"))))
        return copy.deepcopy(self.obj)

    async def get(self) -> dict[str, Any] | None:
        await self._call()
        return copy.deepcopy(self.obj)

    async def create(self, spec: dict[str, Any], annotations: Mapping[str, str]) -> dict[str, Any]:
        await self._call()
        if self.obj is not None:
            raise ApiError(409, "AlreadyExists", "leases exists")
        return self.put(spec, dict(annotations))

    async def replace(
        self, spec: dict[str, Any], annotations: Mapping[str, str], resource_version: str
    ) -> dict[str, Any]:
        await self._call()
        assert self.obj is not None
        if self.conflicts:  # someone else wrote in between
            self.conflicts -= 1
            self.rv += 1
            self.obj["metadata"]["resourceVersion"] = str(self.rv)
        if resource_version != self.obj["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified")
        return self.put(spec, dict(annotations))

    def holder(self) -> str | None:
        return None if self.obj is None else self.obj["spec"].get("holderIdentity")

    def elector(self, identity: str = "me", **kw: Any) -> LeaderElector:
        kw.setdefault("boot", BOOT)
        return LeaderElector(
            self,
            identity,
            clock=self.clock,
            sleep=self.sleep,
            jitter=lambda: 0.0,
            **kw,
        )


def held_by(holder: str, renewed: datetime.datetime, duration: int = 15) -> dict[str, Any]:
    return {
        "holderIdentity": holder,
        "leaseDurationSeconds": duration,
        "acquireTime": micro_time(renewed),
        "renewTime": micro_time(renewed),
        "leaseTransitions": 4,
    }


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- the pure decision --------------------------------------------------------------------


def rec(holder: str, duration: int = 15) -> LeaseRecord:
    return LeaseRecord(holder, duration, None, None, 0)


@pytest.mark.parametrize(
    ("record", "ours", "silent_for", "verdict"),
    [
        (None, False, 0, Verdict.CREATE),
        (rec("me"), True, 100, Verdict.RENEW),
        (rec("other"), False, 0, Verdict.WAIT),
        (rec("other"), False, 14.9, Verdict.WAIT),
        (rec("other"), False, 15, Verdict.TAKE_OVER),
        (rec("other", duration=60), False, 59, Verdict.WAIT),
        (rec(""), False, 0, Verdict.TAKE_OVER),
        # Our identity, written by an earlier run: treated like anyone else's lease.
        (rec("me"), False, 3, Verdict.WAIT),
        (rec("me"), False, 15, Verdict.TAKE_OVER),
    ],
)
def test_decide(
    record: LeaseRecord | None, ours: bool, silent_for: float, verdict: Verdict
) -> None:
    assert decide(record, "me", ours=ours, silent_for=silent_for) is verdict


def test_record_of_reads_the_spec_and_tolerates_garbage() -> None:
    spec = held_by("a", T0)
    assert record_of({"spec": spec}) == LeaseRecord("a", 15, micro_time(T0), micro_time(T0), 4)
    assert record_of({"spec": {"leaseDurationSeconds": "15", "renewTime": 7}}) == LeaseRecord(
        "", 0, None, None, 0
    )
    assert record_of({}) == LeaseRecord("", 0, None, None, 0)


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"renew_deadline": 13.5}, "renew deadline 13.5s, lease duration 15s"),
        ({"retry_period": 10.0}, "retry period 10s, renew deadline 10s"),
        ({"retry_period": 0.0}, "retry period 0s"),
    ],
)
def test_timings_must_leave_the_safety_margin(kw: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline and") as e:
        World().elector("me", **kw)
    assert named in str(e.value)


# --- the holder ---------------------------------------------------------------------------


async def lead(world: World, elector: LeaderElector) -> str | None:
    """Acquire, then hold until leadership ends (its reason) or the horizon (None)."""
    await elector.acquire()
    try:
        return await elector.hold()
    except Horizon:
        return None


def test_first_candidate_creates_the_lease_and_renews_it_every_retry_period() -> None:
    world = World(horizon=30)
    assert run(lead(world, world.elector())) is None
    assert world.holder() == "me"
    times = [t for t, _ in world.writes]
    assert times[0] == 0 and all(b - a == pytest.approx(2.0) for a, b in itertools.pairwise(times))
    spec = world.obj["spec"] if world.obj else {}
    assert spec["leaseDurationSeconds"] == 15 and spec["leaseTransitions"] == 0
    assert spec["acquireTime"] == micro_time(T0), "renewals keep the acquire time"


@pytest.mark.parametrize("start", [2.1, 3.0, 3.9])
@pytest.mark.parametrize("length", [3.0, 7.9, 9.4])
def test_an_outage_shorter_than_the_renew_deadline_keeps_the_lease(
    start: float, length: float
) -> None:
    """Renewals fail through the blip and succeed after it; the holder never steps down."""
    world = World(horizon=60)
    world.down = [(start, start + length)]
    assert run(lead(world, world.elector())) is None
    assert world.holder() == "me"
    assert any(t >= start + length for t, _ in world.writes), "renewed again after the blip"


def test_a_long_outage_loses_the_lease_by_the_renew_deadline() -> None:
    world = World(horizon=200)
    world.down = [(5.0, 65.0)]
    elector = world.elector()
    why = run(lead(world, elector))
    assert why is not None and "no renewal succeeded for 10s" in why
    last_renewal = max(t for t, _ in world.writes)
    assert last_renewal == 4.0
    # Stopped a retry period plus the renew deadline after the last renewal began, and so
    # before any candidate may take over (a full lease after it last saw the record change).
    assert world.now == pytest.approx(last_renewal + 12.0)


def test_holder_steps_down_at_once_when_another_holds_the_lease() -> None:
    world = World(horizon=60)
    elector = world.elector()

    async def scenario() -> str:
        await elector.acquire()
        world.put(held_by("other", world.wall()))
        return await elector.hold()

    why = run(scenario())
    assert "held by other" in why
    assert world.now <= 2.0


def test_a_hung_api_counts_as_a_failed_renewal() -> None:
    """Requests that neither answer nor fail (a frozen API server) cannot keep a holder
    leading past its renew deadline: each round is bounded by the time left."""
    world = World()

    async def scenario() -> str:
        elector = LeaderElector(
            world,
            "me",
            lease_duration=1.0,
            renew_deadline=0.3,
            retry_period=0.05,
            clock=SYSTEM_CLOCK,
        )
        await elector.acquire()
        world.hang = True
        return await asyncio.wait_for(elector.hold(), timeout=5)

    assert "no renewal succeeded" in run(scenario())


def test_a_lost_race_is_retried_not_fatal() -> None:
    world = World(horizon=20)
    elector = world.elector()

    async def scenario() -> tuple[Outcome, Outcome]:
        await elector.acquire()
        world.conflicts = 1
        return await elector.try_acquire_or_renew(), await elector.try_acquire_or_renew()

    assert run(scenario()) == (Outcome.LOST_RACE, Outcome.LEADING)


# --- candidates ---------------------------------------------------------------------------


async def acquire_time(world: World, elector: LeaderElector) -> float | None:
    try:
        await elector.acquire()
    except Horizon:
        return None
    return world.now


@pytest.mark.parametrize("skew", [-3600.0, 0.0, 3600.0])
def test_a_candidate_waits_a_full_lease_from_its_own_observation(skew: float) -> None:
    """The holder died; its renewTime says an hour ago, now, or an hour ahead (its clock
    was off). None of that matters: the candidate takes over 15 s after it first saw the
    record, by its own clock, and counts a transition."""
    world = World(horizon=160)
    world.advance_to(100.0)
    world.put(held_by("other", world.wall() + datetime.timedelta(seconds=skew)))
    took = run(acquire_time(world, world.elector()))
    assert took is not None
    assert 115.0 <= took <= 115.0 + 2.0
    assert world.holder() == "me"
    assert world.obj is not None and world.obj["spec"]["leaseTransitions"] == 5


def stamped(boot: str, at: float) -> dict[str, str]:
    return {ANNOTATION_CLOCK: clock_stamp(boot, at)}


def keep_renewing(world: World, holder: str, skew: float, boot: str | None) -> None:
    """Make `holder` a live holder whose wall clock is `skew` seconds off this one's: every
    2 s of world time it writes a new record (renewTime by its own clock, and, with `boot`,
    its clock stamp on that boot), until someone else holds the lease."""
    off = datetime.timedelta(seconds=skew)
    real_get = world.get

    async def get_with_live_holder() -> dict[str, Any] | None:
        renewed_at = 2 * (world.now // 2)
        stamp = world.clock.now() - datetime.timedelta(seconds=world.now - renewed_at) + off
        spec = world.obj["spec"] if world.obj is not None else None
        if spec is None or (
            spec["holderIdentity"] == holder and spec["renewTime"] != micro_time(stamp)
        ):
            world.put(held_by(holder, stamp), stamped(boot, renewed_at) if boot else None)
        return await real_get()

    world.get = get_with_live_holder  # type: ignore[method-assign]


@pytest.mark.parametrize("skew", [-3600.0, 3600.0])
@pytest.mark.parametrize(
    ("holder", "boot"),
    [
        ("other", None),
        # Our own identity on another machine (a pod name reused elsewhere): its renewTime
        # is no more comparable with this clock than anyone else's.
        ("me", None),
        ("me", "another-machine-boot"),
    ],
)
def test_a_candidate_never_takes_a_lease_whose_record_keeps_changing(
    holder: str, boot: str | None, skew: float
) -> None:
    """A live holder whose clock is an hour behind or ahead: each renewTime it writes looks
    an hour old (or an hour in the future) here, yet the record changes every 2 s, so the
    lease is live and stays its holder's for as long as it renews."""
    world = World(horizon=300)
    keep_renewing(world, holder, skew, boot)
    elector = world.elector()
    assert run(acquire_time(world, elector)) is None
    assert world.writes and all(who == holder for _, who in world.writes)
    assert elector.observed is not None and elector.observed.holder == holder


@pytest.mark.parametrize("skew", [-3600.0, 3600.0])
@pytest.mark.parametrize(
    "annotations", [None, stamped("another-machine-boot", -3600.0), stamped("", -3600.0)]
)
def test_a_silent_holder_of_our_identity_elsewhere_is_waited_out_a_full_lease(
    skew: float, annotations: dict[str, str] | None
) -> None:
    """Our identity, renewTime an hour off, stamped on another boot or not at all: nothing
    says how old the record is but this process's own look at it, so it waits a full lease
    from that look, not a moment less."""
    world = World(horizon=200)
    world.advance_to(100.0)
    world.put(held_by("me", world.wall() + datetime.timedelta(seconds=skew)), annotations)
    took = run(acquire_time(world, world.elector()))
    assert took is not None and 115.0 <= took <= 117.0


def test_a_released_lease_is_taken_at_once() -> None:
    world = World(horizon=60)
    world.put({**held_by("", T0), "holderIdentity": ""})
    assert run(acquire_time(world, world.elector())) == 0.0


def test_a_restart_after_an_outage_resumes_its_own_lease_at_once() -> None:
    """Same identity on the same boot (the same pod or host), record written a minute ago by
    the run that exited when it lost the lease: this run leads on its first round, keeping
    the acquire time and the transition count."""
    world = World(horizon=560)
    world.advance_to(500.0)
    before = world.wall() - datetime.timedelta(seconds=60)
    world.put(held_by("me", before), stamped(BOOT, 440.0))
    assert run(acquire_time(world, world.elector())) == 500.0
    assert world.obj is not None
    spec = world.obj["spec"]
    assert spec["acquireTime"] == micro_time(before) and spec["leaseTransitions"] == 4
    assert world.obj["metadata"]["annotations"] == stamped(BOOT, 500.0)


@pytest.mark.parametrize("wall_step", [0.0, -3600.0, 3600.0])
def test_a_restart_right_after_a_crash_waits_out_the_crashed_runs_lease(
    wall_step: float,
) -> None:
    """The crashed run renewed 2 s ago by the machine's monotonic clock and may still have
    writes in flight: the new run of the same identity waits until that renewal is a lease
    old (13 s more). The wall clock may have been stepped since (NTP): renewTime an hour
    old or an hour ahead changes nothing."""
    world = World(horizon=560)
    world.advance_to(500.0)
    renewed = world.wall() - datetime.timedelta(seconds=2 - wall_step)
    world.put(held_by("me", renewed), stamped(BOOT, 498.0))
    took = run(acquire_time(world, world.elector()))
    assert took is not None and 513.0 <= took <= 515.0


def test_every_write_stamps_the_writers_boot_and_monotonic_time() -> None:
    world = World(horizon=5)
    assert run(lead(world, world.elector())) is None
    assert world.obj is not None
    assert world.obj["metadata"]["annotations"] == stamped(BOOT, 4.0)


@pytest.mark.parametrize(
    ("value", "age"),
    [
        (f"{BOOT} 90.5", 9.5),
        ("another-boot 90.5", None),
        (f"{BOOT}", None),
        (f"{BOOT} soon", None),
        (f"{BOOT} nan", None),
        (f"{BOOT} inf", None),
        (7, None),
    ],
)
def test_stamp_age_trusts_only_a_well_formed_stamp_of_this_boot(value: Any, age: float) -> None:
    obj = {"metadata": {"annotations": {ANNOTATION_CLOCK: value}}}
    assert stamp_age(obj, BOOT, 100.0) == age
    assert stamp_age(obj, "", 100.0) is None, "no boot id: no shortcut"
    assert stamp_age({}, BOOT, 100.0) is None


def test_a_candidate_rides_out_an_outage() -> None:
    world = World(horizon=120)
    world.down = [(0.0, 30.0)]
    took = run(acquire_time(world, world.elector()))
    assert took is not None and 30.0 <= took <= 32.0
