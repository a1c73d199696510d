"""The rollout planner: its budget invariant, proven over random worlds, and its rules.

The invariant (operators/serviceworkload/rolling.py), checked after every planner step:
A. counting every pod that is not terminated (draining and terminating ones included) plus
   the ones the planner asks to create, never more than replicas + maxSurge;
B. never a drain or delete that takes the available pods below replicas - maxUnavailable.
The simulations interleave planner steps with random steps of the world: pods becoming
ready, failing, being deleted by someone else, going unready, drains being confirmed, time
passing, the template changing, pause and resume.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pilotfish.operators.serviceworkload.rolling import (
    DELETE_DRAIN_TIMEOUT,
    DELETE_DRAINED,
    DELETE_FAILED,
    DELETE_NOT_SERVING,
    Budget,
    Create,
    Delete,
    Desired,
    Drain,
    Plan,
    PodState,
    plan,
    resolve_budget,
    scaled,
)
from pilotfish.workloads import DRAIN_TIMEOUT_SECONDS, PROPAGATION_SECONDS

NOW = 1_000_000.0


def ready_pod(name: str, revision: str, since: float = NOW - 100) -> PodState:
    return PodState(
        name=name,
        revision=revision,
        created_at=since - 1,
        scheduled=True,
        running=True,
        ready_since=since,
        has_address=True,
    )


def desired(
    replicas: int = 3,
    surge: int | str = 1,
    unavailable: int | str = 0,
    update: str = "new",
    *,
    min_ready: float = 0,
    paused: bool = False,
    stable: str | None = "old",
    drain: bool = True,
) -> Desired:
    return Desired(
        resolve_budget(replicas, surge, unavailable, min_ready),
        update_revision=update,
        stable_revision=stable,
        paused=paused,
        drain=drain,
    )


# -- the world ------------------------------------------------------------------------------


@dataclasses.dataclass
class World:
    """Pods as the API would hold them; the planner's writes applied the way they land."""

    pods: dict[str, PodState]
    now: float = NOW
    names: itertools.count[int] = dataclasses.field(default_factory=itertools.count)

    def states(self) -> list[PodState]:
        return sorted(self.pods.values(), key=lambda p: p.name)

    def apply(self, result: Plan) -> None:
        for action in result.actions:
            if isinstance(action, Create):
                for _ in range(action.count):
                    name = f"p{next(self.names)}"
                    self.pods[name] = PodState(name, action.revision, created_at=self.now)
            elif isinstance(action, Drain):
                self.pods[action.pod] = dataclasses.replace(
                    self.pods[action.pod], drain_requested_at=self.now
                )
            else:
                pod = self.pods[action.pod]
                if pod.terminated:
                    del self.pods[action.pod]
                else:
                    self.pods[action.pod] = dataclasses.replace(pod, terminating=True)


def counted(pods: Iterable[PodState]) -> int:
    return sum(1 for p in pods if p.counted)


def available_names(pods: Iterable[PodState], budget: Budget, now: float) -> set[str]:
    return {p.name for p in pods if p.available(budget.min_ready_seconds, now)}


def check_step(pods: list[PodState], want: Desired, now: float) -> Plan:
    """Plan once and assert both halves of the invariant for this step."""
    b = want.budget
    result = plan(pods, want, now)
    before = counted(pods)
    creates = result.creates
    if creates:
        assert before + creates <= b.max_pods, (before, creates, b)
    assert before + creates <= max(before, b.max_pods)
    available = available_names(pods, b, now)
    taken = [a.pod for a in result.actions if isinstance(a, Drain | Delete)]
    taken_available = [name for name in taken if name in available]
    assert len(taken_available) <= max(0, len(available) - b.min_available), (
        taken_available,
        len(available),
        b,
    )
    assert len(taken) == len(set(taken)), "a pod is taken down twice in one plan"
    by_name = {p.name: p for p in pods}
    for action in result.actions:
        if isinstance(action, Delete):
            pod = by_name[action.pod]
            assert not pod.terminating
            if action.reason == DELETE_FAILED:
                assert pod.terminated
        if isinstance(action, Drain):
            assert by_name[action.pod].active
    return result


def world_step(world: World, data: st.DataObject, ready_revisions: set[str] | None) -> None:
    """One random thing happening to the pods, or to the clock."""
    pods = world.states()
    event = data.draw(
        st.sampled_from(
            ["ready", "ready", "ready", "fail", "evict", "vanish", "unready", "drained", "tick"]
        )
    )
    if event == "tick":
        world.now += data.draw(st.sampled_from([0.5, 1.0, 3.0, 10.0, 31.0]))
        return
    if not pods:
        return
    pod = data.draw(st.sampled_from(pods))
    if event == "ready" and pod.ready_since is None and not pod.terminated:
        if ready_revisions is None or pod.revision in ready_revisions:
            world.pods[pod.name] = dataclasses.replace(
                pod, scheduled=True, running=True, ready_since=world.now, has_address=True
            )
    elif event == "fail" and not pod.terminated:
        world.pods[pod.name] = dataclasses.replace(
            pod, terminated=True, running=False, ready_since=None
        )
    elif event == "evict" and pod.counted:
        world.pods[pod.name] = dataclasses.replace(pod, terminating=True)
    elif event == "vanish" and (pod.terminating or pod.terminated):
        del world.pods[pod.name]
    elif event == "unready" and pod.ready_since is not None:
        world.pods[pod.name] = dataclasses.replace(pod, ready_since=None)
    elif event == "drained" and pod.drain_requested_at is not None and pod.drained_at is None:
        world.pods[pod.name] = dataclasses.replace(pod, drained_at=world.now)


budgets = st.tuples(
    st.integers(0, 12),  # replicas
    st.one_of(st.integers(0, 4), st.sampled_from(["0%", "10%", "25%", "50%", "100%"])),
    st.one_of(st.integers(0, 4), st.sampled_from(["0%", "10%", "25%", "50%"])),
    st.sampled_from([0, 0, 5]),  # minReadySeconds
)


def initial_world(replicas: int, revision: str, ready: bool = True) -> World:
    pods = {
        f"o{i}": ready_pod(f"o{i}", revision)
        if ready
        else PodState(f"o{i}", revision, created_at=NOW - 10)
        for i in range(replicas)
    }
    return World(pods)


# -- the invariant, proven over random worlds --------------------------------------------------


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(budget=budgets, drain=st.booleans(), data=st.data())
def test_invariant_holds_through_random_rollouts(
    budget: tuple[int, int | str, int | str, int], drain: bool, data: st.DataObject
) -> None:
    replicas, surge, unavailable, min_ready = budget
    world = initial_world(replicas, "r0")
    revision, paused = "r1", False
    for _ in range(data.draw(st.integers(5, 60))):
        if data.draw(st.integers(0, 15)) == 0:  # a new template mid-rollout
            revision = data.draw(st.sampled_from(["r0", "r1", "r2", "r3"]))
        if data.draw(st.integers(0, 15)) == 0:
            paused = not paused
        want = Desired(
            resolve_budget(replicas, surge, unavailable, min_ready),
            update_revision=revision,
            stable_revision="r0",
            paused=paused,
            drain=drain,
        )
        result = check_step(world.states(), want, world.now)
        world.apply(result)
        assert counted(world.pods.values()) <= want.budget.max_pods
        for _ in range(data.draw(st.integers(0, 4))):
            world_step(world, data, None)
            assert counted(world.pods.values()) <= want.budget.max_pods


@settings(max_examples=200, deadline=None)
@given(
    pods=st.lists(
        st.builds(
            PodState,
            name=st.uuids().map(str),
            revision=st.sampled_from(["a", "b", "c"]),
            created_at=st.floats(NOW - 1000, NOW),
            scheduled=st.booleans(),
            running=st.booleans(),
            ready_since=st.one_of(st.none(), st.floats(NOW - 1000, NOW + 10)),
            terminated=st.booleans(),
            terminating=st.booleans(),
            drain_requested_at=st.one_of(st.none(), st.floats(NOW - 100, NOW)),
            drained_at=st.one_of(st.none(), st.floats(NOW - 100, NOW)),
            has_address=st.booleans(),
        ),
        max_size=25,
        unique_by=lambda p: p.name,
    ),
    budget=budgets,
    paused=st.booleans(),
    drain=st.booleans(),
)
def test_invariant_holds_from_any_observed_state(
    pods: list[PodState],
    budget: tuple[int, int | str, int | str, int],
    paused: bool,
    drain: bool,
) -> None:
    """Whatever the watch shows (even states above the bound, after a scale-down), the plan
    never adds pods beyond the bound and never spends availability it does not have."""
    replicas, surge, unavailable, min_ready = budget
    want = Desired(
        resolve_budget(replicas, surge, unavailable, min_ready),
        update_revision="a",
        stable_revision="b",
        paused=paused,
        drain=drain,
    )
    check_step(pods, want, NOW)


@settings(max_examples=150, deadline=None)
@given(budget=budgets, scale_to=st.integers(0, 12), data=st.data())
def test_scaling_mid_rollout_never_creates_above_the_new_bound(
    budget: tuple[int, int | str, int | str, int], scale_to: int, data: st.DataObject
) -> None:
    replicas, surge, unavailable, min_ready = budget
    world = initial_world(replicas, "r0")
    for step in range(30):
        count = scale_to if step >= 5 else replicas
        want = desired(count, surge, unavailable, "r1", min_ready=min_ready, stable="r0")
        world.apply(check_step(world.states(), want, world.now))
        world_step(world, data, None)


# -- liveness: a healthy world converges; a never-ready template stalls after its surge -----


def settle(world: World) -> None:
    """The world at its most helpful: everything becomes ready, every drain is confirmed,
    terminating pods go, and enough time passes for timeouts and minReadySeconds."""
    for name, pod in list(world.pods.items()):
        if pod.terminating:
            del world.pods[name]
        elif pod.ready_since is None and not pod.terminated:
            world.pods[name] = dataclasses.replace(
                pod, scheduled=True, running=True, ready_since=world.now, has_address=True
            )
        elif pod.drain_requested_at is not None and pod.drained_at is None:
            world.pods[name] = dataclasses.replace(pod, drained_at=world.now)
    world.now += PROPAGATION_SECONDS + 6


@settings(max_examples=150, deadline=None)
@given(budget=budgets, drain=st.booleans())
def test_a_healthy_rollout_completes(
    budget: tuple[int, int | str, int | str, int], drain: bool
) -> None:
    replicas, surge, unavailable, min_ready = budget
    world = initial_world(replicas, "r0")
    want = desired(
        replicas, surge, unavailable, "r1", min_ready=min_ready, drain=drain, stable="r0"
    )
    for _ in range(4 * replicas + 8):
        world.apply(check_step(world.states(), want, world.now))
        settle(world)
    pods = world.states()
    assert [p.revision for p in pods] == ["r1"] * replicas
    assert all(p.available(min_ready, world.now) for p in pods)
    assert plan(pods, want, world.now).actions == ()


@settings(max_examples=150, deadline=None)
@given(budget=budgets, data=st.data())
def test_a_never_ready_template_stops_after_its_surge_with_old_pods_serving(
    budget: tuple[int, int | str, int | str, int], data: st.DataObject
) -> None:
    """Whatever else happens (old pods failing, evicted, drains confirmed, time passing),
    never more unproven new pods than surge + unavailable, and lost old pods are refilled
    with the stable revision rather than with pods that will never serve."""
    replicas, surge, unavailable, min_ready = budget
    world = initial_world(replicas, "r0")
    want = desired(replicas, surge, unavailable, "r1", min_ready=min_ready, stable="r0")
    b = want.budget
    for _ in range(40):
        world.apply(check_step(world.states(), want, world.now))
        new = [p for p in world.states() if p.revision == "r1" and p.active]
        assert len(new) <= b.max_surge + b.max_unavailable
        for _ in range(data.draw(st.integers(0, 3))):
            world_step(world, data, {"r0"})  # only pods of the old template become ready


@pytest.mark.parametrize(("replicas", "surge", "unavailable"), [(3, 1, 0), (5, 2, 0), (6, 1, 2)])
def test_a_stalled_rollout_refills_lost_old_pods_with_the_stable_revision(
    replicas: int, surge: int, unavailable: int
) -> None:
    world = initial_world(replicas, "r0")
    want = desired(replicas, surge, unavailable, "r1", stable="r0")
    b = want.budget

    def settle_old() -> None:
        for name, pod in list(world.pods.items()):
            if pod.terminating:
                del world.pods[name]
            elif pod.revision == "r0" and pod.ready_since is None and not pod.terminated:
                world.pods[name] = dataclasses.replace(
                    pod, scheduled=True, running=True, ready_since=world.now, has_address=True
                )
        world.now += DRAIN_TIMEOUT_SECONDS + 1

    for _ in range(10):
        world.apply(check_step(world.states(), want, world.now))
        settle_old()
    stalled = world.states()
    assert sum(1 for p in stalled if p.revision == "r1") == surge + unavailable
    assert len(available_names(stalled, b, world.now)) == b.min_available
    assert plan(stalled, want, world.now).actions == (), "stalled: nothing left to do"
    victim = next(p for p in stalled if p.revision == "r0")
    world.pods[victim.name] = dataclasses.replace(victim, terminated=True, ready_since=None)
    for _ in range(10):
        world.apply(check_step(world.states(), want, world.now))
        settle_old()
    after = world.states()
    assert sum(1 for p in after if p.revision == "r1") == surge + unavailable
    assert len(available_names(after, b, world.now)) == b.min_available, "availability restored"


# -- the rules, case by case --------------------------------------------------------------------


def test_percentages_round_surge_up_and_unavailability_down() -> None:
    assert scaled("25%", 10, round_up=True) == 3
    assert scaled("25%", 10, round_up=False) == 2
    assert scaled(4, 10, round_up=True) == 4
    assert resolve_budget(10, "25%", "25%") == Budget(10, 3, 2)
    assert resolve_budget(3, "0%", "10%") == Budget(3, 0, 1), "both zero: unavailability 1"
    assert resolve_budget(0, "25%", "25%") == Budget(0, 0, 1)


def test_a_new_workload_creates_all_replicas_at_once() -> None:
    result = plan([], desired(5, 1, 0, "new", stable=None), NOW)
    assert result.actions == (Create("new", 5),)


def test_rollout_surges_first_and_drains_only_what_availability_allows() -> None:
    old = [ready_pod(f"o{i}", "old") for i in range(3)]
    first = plan(old, desired(), NOW)
    assert first.actions == (Create("new", 1),), "maxUnavailable 0: surge, no drain yet"
    pending = PodState("n0", "new", created_at=NOW)
    assert plan([*old, pending], desired(), NOW).actions == (), "wait for the new pod"
    ready = ready_pod("n0", "new", since=NOW - 1)
    result = plan([*old, ready], desired(), NOW)
    assert len(result.drains) == 1 and result.creates == 0
    assert result.drains[0].startswith("o")


def test_max_unavailable_lets_old_pods_go_before_new_ones_are_ready() -> None:
    old = [ready_pod(f"o{i}", "old") for i in range(4)]
    result = plan(old, desired(4, 1, 1), NOW)
    assert result.creates == 1
    assert len(result.drains) == 1


def test_draining_pods_count_toward_the_surge_until_gone() -> None:
    old = [ready_pod(f"o{i}", "old") for i in range(2)]
    draining = dataclasses.replace(ready_pod("o2", "old"), drain_requested_at=NOW - 1)
    new = ready_pod("n0", "new", since=NOW - 10)
    result = plan([*old, draining, new], desired(), NOW)
    assert result.creates == 0, "3 + 1 pods exist: no room"
    assert len(result.drains) == 0, "only 3 available with one draining: none spare"


def test_a_drained_pod_is_deleted_after_propagation_and_woken_up_for_it() -> None:
    pod = dataclasses.replace(
        ready_pod("o0", "old"), drain_requested_at=NOW - 5, drained_at=NOW - 1
    )
    early = plan([pod], desired(0, 1, 0), NOW)
    assert early.deletes == ()
    assert early.wake_at == NOW - 1 + PROPAGATION_SECONDS
    late = plan([pod], desired(0, 1, 0), NOW - 1 + PROPAGATION_SECONDS)
    assert late.actions == (Delete("o0", DELETE_DRAINED),)


def test_a_drain_nobody_confirms_times_out() -> None:
    pod = dataclasses.replace(ready_pod("o0", "old"), drain_requested_at=NOW)
    assert plan([pod], desired(0, 1, 0), NOW).wake_at == NOW + DRAIN_TIMEOUT_SECONDS
    late = plan([pod], desired(0, 1, 0), NOW + DRAIN_TIMEOUT_SECONDS)
    assert late.actions == (Delete("o0", DELETE_DRAIN_TIMEOUT),)


def test_pods_nothing_routes_to_are_deleted_without_a_drain() -> None:
    old = [ready_pod(f"o{i}", "old") for i in range(2)]
    no_service = plan(old, desired(1, 1, 0, "old", drain=False), NOW)
    assert no_service.actions == (Delete(no_service.deletes[0], DELETE_NOT_SERVING),)
    unaddressed = PodState("p", "old", created_at=NOW)
    result = plan([*old, unaddressed], desired(2, 1, 0, "old"), NOW)
    assert result.actions == (Delete("p", DELETE_NOT_SERVING),)


def test_failed_pods_are_replaced_and_deleted() -> None:
    pods = [ready_pod("o0", "new"), ready_pod("o1", "new")]
    failed = dataclasses.replace(ready_pod("o2", "new"), terminated=True, ready_since=None)
    result = plan([*pods, failed], desired(3, 1, 0, "new", stable="new"), NOW)
    assert Delete("o2", DELETE_FAILED) in result.actions
    assert result.actions[-1] == Create("new", 1)


def test_an_evicted_pod_is_replaced_within_the_surge() -> None:
    pods = [ready_pod("o0", "new"), ready_pod("o1", "new")]
    evicted = dataclasses.replace(ready_pod("o2", "new"), terminating=True)
    assert plan([*pods, evicted], desired(3, 1, 0, "new", stable="new"), NOW).creates == 1
    assert plan([*pods, evicted], desired(3, 0, 1, "new", stable="new"), NOW).creates == 0


def test_scale_down_takes_the_least_useful_pods_first() -> None:
    ready = [ready_pod(f"r{i}", "new", since=NOW - 100 + i) for i in range(3)]
    pending = PodState("p", "new", created_at=NOW)
    result = plan([*ready, pending], desired(2, 1, 0, "new"), NOW)
    assert set(result.deletes + result.drains) == {"p", "r2"}, "unready, then newest ready"


def test_min_ready_seconds_delays_availability_with_a_wake_up() -> None:
    old = [ready_pod(f"o{i}", "old") for i in range(2)]
    new = ready_pod("n0", "new", since=NOW - 2)
    want = desired(2, 1, 0, min_ready=10)
    result = plan([*old, new], want, NOW)
    assert result.drains == ()
    assert result.wake_at == NOW + 8
    assert len(plan([*old, new], want, NOW + 8).drains) == 1


def test_paused_keeps_the_count_with_the_stable_revision() -> None:
    pods = [ready_pod("o0", "old"), ready_pod("n0", "new")]
    want = desired(3, 1, 0, "new", paused=True, stable="old")
    assert plan(pods, want, NOW).actions == (Create("old", 1),)
    full = [*pods, ready_pod("o1", "old")]
    assert plan(full, want, NOW).actions == (), "paused: no rollout step"
    down = plan(full, desired(2, 1, 0, "new", paused=True, stable="old"), NOW)
    assert down.drains == ("n0",), "paused scale-down takes the unstable revision first"


def test_plan_is_deterministic() -> None:
    pods = [ready_pod(f"o{i}", "old") for i in range(5)]
    assert plan(pods, desired(5, 2, 1), NOW) == plan(list(reversed(pods)), desired(5, 2, 1), NOW)


@pytest.mark.parametrize("replicas", [1, 3, 10])
def test_zero_surge_rolls_by_unavailability_alone(replicas: int) -> None:
    world = initial_world(replicas, "old")
    want = desired(replicas, 0, 1, "new")
    for _ in range(4 * replicas + 4):
        result = check_step(world.states(), want, world.now)
        world.apply(result)
        assert counted(world.pods.values()) <= replicas
        settle(world)
    assert {p.revision for p in world.states()} == {"new"}


def test_unready_old_pods_are_kept_until_new_ones_can_take_over() -> None:
    """Old pods that are not ready yet (a cluster starting, a slow start) may still become
    available: with nothing new available, none is taken down (Deployment's
    maxScaledDown); once new pods are available, unready old ones go first."""
    old = [PodState(f"o{i}", "old", created_at=NOW, scheduled=True) for i in range(3)]
    first = plan(old, desired(3, 1, 0), NOW)
    assert first.actions == (Create("new", 1),)
    new = ready_pod("n0", "new", since=NOW - 1)
    second = plan([*old, new], desired(3, 1, 0), NOW)
    assert len(second.deletes) == 1 and second.deletes[0].startswith("o")
