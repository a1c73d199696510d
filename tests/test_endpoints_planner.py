"""The slice planner: every desired endpoint in exactly one slice of at most 100, endpoints
stay where they are, and a single readiness flip costs exactly one slice write."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from pilotfish.operators.endpoints.model import Endpoint, Port, PortSet, Slice
from pilotfish.operators.endpoints.planner import SlicePlan, SliceUpdate, plan_slices

MAX = 100
HTTP: PortSet = (Port("http", 8080, "TCP"),)
ALT: PortSet = (Port("http", 9090, "TCP"),)
OLD: PortSet = (Port("web", 80, "TCP"),)  # a port set nothing wants any more

Desired = dict[PortSet, dict[str, Endpoint]]


def ep(i: int, ready: bool = True, terminating: bool = False) -> Endpoint:
    return Endpoint(
        key=f"uid-{i:04d}",
        address=f"10.0.{i // 250}.{i % 250 + 1}",
        ready=ready and not terminating,
        serving=ready,
        terminating=terminating,
        node_name=f"node-{i % 7}",
        zone=f"zone-{i % 3}",
        pod=f"pod-{i}",
        namespace="ns",
    )


def desired_of(*groups: tuple[PortSet, Sequence[Endpoint]]) -> Desired:
    return {ports: {e.key: e for e in eps} for ports, eps in groups}


def apply(existing: Sequence[Slice], plan: SlicePlan) -> list[Slice]:
    """The slices after the plan's writes, as the API server would hold them."""
    names = {s.name for s in existing}
    touched = [u.name for u in plan.updates] + [d.name for d in plan.deletes]
    assert len(touched) == len(set(touched)), "a slice written twice in one plan"
    assert set(touched) <= names, "a write to a slice that does not exist"
    by_name = {s.name: s for s in existing}
    for u in plan.updates:
        assert u.resource_version == by_name[u.name].resource_version
        by_name[u.name] = Slice(u.name, u.resource_version + "+", u.ports, u.endpoints)
    for d in plan.deletes:
        assert d.resource_version == by_name[d.name].resource_version
        del by_name[d.name]
    for i, c in enumerate(plan.creates):
        name = f"new-{len(existing)}-{i}"
        by_name[name] = Slice(name, "1", c.ports, c.endpoints)
    return sorted(by_name.values(), key=lambda s: s.name)


def check_holds_exactly(slices: Sequence[Slice], desired: Desired) -> None:
    seen: dict[str, Endpoint] = {}
    for s in slices:
        assert 0 < len(s.endpoints) <= MAX, (s.name, len(s.endpoints))
        for e in s.endpoints:
            assert e.key not in seen, f"{e.key} in two slices"
            assert desired[s.ports].get(e.key) == e, f"{e.key} is stale or in the wrong slice"
            seen[e.key] = e
    want = {k for group in desired.values() for k in group}
    assert set(seen) == want


def converge(desired: Desired, existing: Sequence[Slice] = ()) -> list[Slice]:
    return apply(existing, plan_slices(desired, existing))


def test_new_service_gets_full_slices_and_one_remainder() -> None:
    desired = desired_of((HTTP, [ep(i) for i in range(250)]))
    plan = plan_slices(desired, [])
    assert [len(c.endpoints) for c in plan.creates] == [100, 100, 50]
    assert not plan.updates and not plan.deletes
    check_holds_exactly(apply([], plan), desired)


def test_converged_slices_need_no_write() -> None:
    desired = desired_of((HTTP, [ep(i) for i in range(250)]))
    assert plan_slices(desired, converge(desired)).empty


def test_one_flip_rewrites_only_its_slice() -> None:
    pods = [ep(i) for i in range(250)]
    slices = converge(desired_of((HTTP, pods)))
    pods[137] = ep(137, ready=False)
    plan = plan_slices(desired_of((HTTP, pods)), slices)
    assert plan.writes == 1 and len(plan.updates) == 1
    holder = next(s for s in slices if any(e.key == pods[137].key for e in s.endpoints))
    assert plan.updates[0].name == holder.name
    assert [e for e in plan.updates[0].endpoints if e not in holder.endpoints] == [pods[137]]


def test_draining_pod_is_updated_in_place() -> None:
    pods = [ep(i) for i in range(30)]
    slices = converge(desired_of((HTTP, pods)))
    pods[3] = ep(3, terminating=True)
    (update,) = plan_slices(desired_of((HTTP, pods)), slices).updates
    shown = next(e for e in update.endpoints if e.key == pods[3].key)
    assert (shown.ready, shown.serving, shown.terminating) == (False, True, True)


def test_new_pods_join_a_slice_being_written_anyway() -> None:
    pods = [ep(i) for i in range(150)]  # slices of 100 and 50
    slices = converge(desired_of((HTTP, pods)))
    half = next(s for s in slices if len(s.endpoints) == 50)
    flipped = half.endpoints[0]
    pods[int(flipped.key.removeprefix("uid-"))] = dataclasses.replace(flipped, ready=False)
    pods.append(ep(500))
    plan = plan_slices(desired_of((HTTP, pods)), slices)
    assert plan.writes == 1 and plan.updates[0].name == half.name
    assert ep(500) in plan.updates[0].endpoints


def test_removed_pods_leave_and_empty_slices_go() -> None:
    pods = [ep(i) for i in range(200)]
    slices = converge(desired_of((HTTP, pods)))
    first = {e.key for e in slices[0].endpoints}
    remaining = [p for p in pods if p.key not in first][:-1]
    plan = plan_slices(desired_of((HTTP, remaining)), slices)
    assert [d.name for d in plan.deletes] == [slices[0].name]
    assert [u.name for u in plan.updates] == [slices[1].name]
    check_holds_exactly(apply(slices, plan), desired_of((HTTP, remaining)))


def test_overfull_slice_is_split_keeping_its_first_hundred() -> None:
    big = Slice("big", "7", HTTP, tuple(ep(i) for i in range(130)))
    desired = desired_of((HTTP, big.endpoints))
    plan = plan_slices(desired, [big])
    (update,) = plan.updates
    assert update.endpoints == big.endpoints[:100]
    assert [c.endpoints for c in plan.creates] == [big.endpoints[100:]]


def test_endpoint_in_two_slices_stays_in_the_first() -> None:
    a = Slice("a", "1", HTTP, (ep(1), ep(2)))
    b = Slice("b", "1", HTTP, (ep(2), ep(3)))
    plan = plan_slices(desired_of((HTTP, [ep(1), ep(2), ep(3)])), [a, b])
    assert not plan.creates and not plan.deletes
    assert [(u.name, u.endpoints) for u in plan.updates] == [("b", (ep(3),))]


def test_port_change_creates_before_it_deletes() -> None:
    slices = converge(desired_of((OLD, [ep(i) for i in range(10)])))
    desired = desired_of((HTTP, [ep(i) for i in range(10)]))
    plan = plan_slices(desired, slices)
    assert len(plan.creates) == 1 and [d.name for d in plan.deletes] == [slices[0].name]
    check_holds_exactly(apply(slices, plan), desired)


def test_stale_metadata_or_address_type_is_repaired() -> None:
    pods = [ep(i) for i in range(5)]
    foreign_owner = Slice("a", "1", HTTP, tuple(pods), meta_current=False)
    (update,) = plan_slices(desired_of((HTTP, pods)), [foreign_owner]).updates
    assert update.endpoints == tuple(pods)
    ipv6 = Slice("b", "1", HTTP, tuple(pods), address_type="IPv6")
    plan = plan_slices(desired_of((HTTP, pods)), [ipv6])
    assert [d.name for d in plan.deletes] == ["b"] and len(plan.creates) == 1


def test_remainder_goes_into_the_fullest_untouched_slice_that_fits() -> None:
    a = Slice("a", "1", HTTP, tuple(ep(i) for i in range(60)))
    b = Slice("b", "1", HTTP, tuple(ep(i) for i in range(100, 190)))
    new = [ep(i) for i in range(300, 305)]
    desired = desired_of((HTTP, [*a.endpoints, *b.endpoints, *new]))
    plan = plan_slices(desired, [a, b])
    assert not plan.creates
    assert [u.name for u in plan.updates] == ["b"]
    forty = [ep(i) for i in range(300, 340)]  # fits a (60) but not b (90)
    plan = plan_slices(desired_of((HTTP, [*a.endpoints, *b.endpoints, *forty])), [a, b])
    assert [u.name for u in plan.updates] == ["a"] and not plan.creates


def test_unknown_readiness_written_by_someone_else_is_rewritten() -> None:
    unknown = dataclasses.replace(ep(1), ready=None)
    (update,) = plan_slices(
        desired_of((HTTP, [ep(1)])), [Slice("a", "1", HTTP, (unknown,))]
    ).updates
    assert update.endpoints == (ep(1),)


# --- properties --------------------------------------------------------------------------

POOL = 320


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Desired, list[Slice]]:
    """A desired state and an arbitrary existing state: stale contents, duplicates, strays,
    over-full slices, outdated ports, foreign metadata."""
    keys = draw(st.sets(st.integers(0, POOL - 1), max_size=POOL))
    desired: Desired = {}
    for i in sorted(keys):
        ports = draw(st.sampled_from([HTTP, HTTP, HTTP, ALT]))
        desired.setdefault(ports, {})[ep(i).key] = ep(
            i, ready=draw(st.booleans()), terminating=draw(st.booleans())
        )
    n_slices = draw(st.integers(0, 6))
    existing = []
    for n in range(n_slices):
        members = draw(st.lists(st.integers(0, POOL - 1), max_size=160))
        existing.append(
            Slice(
                name=f"s{n}",
                resource_version=str(draw(st.integers(1, 99))),
                ports=draw(st.sampled_from([HTTP, HTTP, ALT, OLD])),
                endpoints=tuple(ep(i, ready=draw(st.booleans())) for i in members),
                address_type=draw(st.sampled_from(["IPv4"] * 5 + ["IPv6"])),
                meta_current=draw(st.booleans() | st.just(True)),
            )
        )
    return desired, existing


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_plan_reaches_exactly_the_desired_state(scenario: tuple[Desired, list[Slice]]) -> None:
    desired, existing = scenario
    after = apply(existing, plan_slices(desired, existing))
    check_holds_exactly(after, desired)
    assert plan_slices(desired, after).empty, "planning again must find nothing to do"


def _first_homes(existing: Sequence[Slice]) -> dict[str, str]:
    homes: dict[str, str] = {}
    for s in sorted(existing, key=lambda s: s.name):
        for e in s.endpoints:
            homes.setdefault(e.key, s.name)
    return homes


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_endpoints_stay_in_their_slice_unless_it_is_split(
    scenario: tuple[Desired, list[Slice]],
) -> None:
    desired, existing = scenario
    plan = plan_slices(desired, existing)
    after = {s.name: {e.key for e in s.endpoints} for s in apply(existing, plan)}
    by_name = {s.name: s for s in existing}
    wanted = {k: ports for ports, group in desired.items() for k in group}
    homes = _first_homes(existing)
    for key, home in homes.items():
        s = by_name[home]
        if wanted.get(key) != s.ports or s.address_type != "IPv4":
            continue  # gone, or its slice no longer matches: it has to move
        position = [e.key for e in s.endpoints if wanted.get(e.key) == s.ports]
        kept_before = list(dict.fromkeys(k for k in position if homes[k] == home))
        if kept_before.index(key) >= MAX:
            continue  # beyond the split point
        assert key in after.get(home, set()), f"{key} moved out of {home}"


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_untouched_slices_are_not_written(scenario: tuple[Desired, list[Slice]]) -> None:
    """A slice already right is written at most to take new endpoints (at most one such slice
    per port set), and then keeps everything it had."""
    desired, existing = scenario
    converged = converge(desired, existing)
    # Some pods go, some change, some arrive; slices they are not in must stay untouched.
    flat = {k: e for g in desired.values() for k, e in g.items()}
    changed: Desired = {p: dict(g) for p, g in desired.items()}
    touched: set[str] = set()
    for i, key in enumerate(sorted(flat)):
        ports = next(p for p, g in desired.items() if key in g)
        if i % 7 == 0:
            del changed[ports][key]
            touched.add(key)
        elif i % 5 == 0:
            changed[ports][key] = dataclasses.replace(flat[key], ready=not flat[key].ready)
            touched.add(key)
    changed.setdefault(HTTP, {})["uid-new"] = dataclasses.replace(ep(999), key="uid-new")
    plan = plan_slices(changed, converged)
    written = {u.name: u for u in plan.updates} | {d.name: d for d in plan.deletes}
    clean = [s for s in converged if not {e.key for e in s.endpoints} & touched]
    gained_only = [s for s in clean if s.name in written]
    assert len(gained_only) <= 1, "more than one untouched slice written for one new pod"
    for s in gained_only:
        update = written[s.name]
        assert isinstance(update, SliceUpdate), f"untouched slice {s.name} deleted"
        assert set(s.endpoints) < set(update.endpoints)


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.data())
def test_a_single_flip_is_a_single_write(
    scenario: tuple[Desired, list[Slice]], data: st.DataObject
) -> None:
    desired, existing = scenario
    flat = [(p, k) for p, g in desired.items() for k in g]
    if not flat:
        return
    converged = converge(desired, existing)
    ports, key = data.draw(st.sampled_from(sorted(flat)))
    flipped: Desired = {p: dict(g) for p, g in desired.items()}
    old = flipped[ports][key]
    flipped[ports][key] = dataclasses.replace(old, ready=not old.ready, serving=not old.serving)
    plan = plan_slices(flipped, converged)
    assert not plan.creates and not plan.deletes
    (update,) = plan.updates
    holder = next(s for s in converged if old in s.endpoints)
    assert update.name == holder.name
    assert [e.key for e in update.endpoints] == [e.key for e in holder.endpoints]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 1000))
def test_a_fresh_service_uses_the_fewest_slices(n: int) -> None:
    desired = desired_of((HTTP, [ep(i) for i in range(n)]))
    plan = plan_slices(desired, [])
    assert len(plan.creates) == math.ceil(n / MAX)
