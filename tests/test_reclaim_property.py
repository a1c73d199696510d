"""Properties of the pure reclaim figure and give-back choice, over generated nodes:

- the figure is never negative and never above A - margin;
- it equals unreserved + requests - p95 - margin whenever that is positive;
- a decaying figure only shrinks and reaches 0;
- the eviction choice always fits, chooses only batch pods that help, in the contract's
  order, and nothing when the pods already fit.
"""

from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from pilotfish.operators.reclaim import reasons
from pilotfish.operators.reclaim.decide import (
    BAND_RANK,
    allocated,
    decayed,
    decide,
    eviction_order,
    give_back,
    over,
)
from pilotfish.operators.reclaim.model import RESOURCES, BatchPod, NodeInputs, Reserved
from pilotfish.operators.reclaim.settings import ReclaimSettings

NOW = "2026-01-01T00:00:00Z"
S = ReclaimSettings("http://p", margin=0.1)
amounts = st.integers(min_value=0, max_value=64_000)
maybe = st.one_of(st.none(), amounts)


@st.composite
def reserved_pods(draw: st.DrawFn) -> Reserved:
    req = {r: Fraction(draw(amounts)) for r in RESOURCES}
    p95 = {r: None if (v := draw(maybe)) is None else Fraction(v) for r in RESOURCES}
    return Reserved(f"ns/p{draw(st.integers(0, 10**6))}", "production", req, p95)


@st.composite
def batch_pods(draw: st.DrawFn) -> BatchPod:
    i = draw(st.integers(0, 10**6))
    req = {r: Fraction(draw(st.integers(0, 8000))) for r in RESOURCES}
    band = draw(st.sampled_from(["batch", "best-effort"]))
    return BatchPod("ns", f"b{i}", f"uid-{i}", band, float(draw(st.integers(0, 1000))), req)


@st.composite
def nodes(draw: st.DrawFn) -> NodeInputs:
    alloc = {r: Fraction(draw(st.integers(1, 64_000))) for r in RESOURCES}
    current = {r: draw(st.one_of(st.none(), st.integers(0, 64_000))) for r in RESOURCES}
    pods = draw(st.lists(batch_pods(), max_size=8, unique_by=lambda p: p.uid))
    return NodeInputs(
        name="n",
        uid="u",
        resource_version="1",
        allocatable=alloc,
        current=current,
        reserved=tuple(draw(st.lists(reserved_pods(), max_size=6))),
        batch_pods=tuple(pods),
        age=draw(st.one_of(st.none(), st.floats(0, 1000))),
    )


@settings(max_examples=300, deadline=None)
@given(nodes(), st.booleans())
def test_the_figure_is_between_zero_and_allocatable_minus_margin(
    node: NodeInputs, down: bool
) -> None:
    d = decide(node, "connection: refused" if down else None, S, NOW)
    for r in RESOURCES:
        f = d.figures[r]
        a = node.allocatable[r]
        assert 0 <= f.batch <= a - a * Fraction(1, 10)
        assert 0 <= f.reclaimed <= f.batch
        if d.state == reasons.MEASURED:
            req = sum((p.requests[r] for p in node.reserved), Fraction(0))
            p95 = Fraction(0)
            for p in node.reserved:
                sample = p.p95[r]
                p95 += p.requests[r] if sample is None else sample
            assert f.batch == max(0, math.floor((a - req) + req - p95 - a / 10))
        else:
            assert f.batch <= (node.current[r] or 0)


@given(st.integers(0, 10**9), st.integers(1, 10**9))
def test_decay_only_shrinks_and_reaches_zero(current: int, a: int) -> None:
    seen = current
    for _ in range(64):
        nxt = decayed(seen, Fraction(a))
        assert nxt <= seen and (nxt == 0 or nxt >= a / 100)
        seen = nxt
    assert seen == 0


@settings(max_examples=300, deadline=None)
@given(nodes(), st.lists(st.integers(0, 64_000), min_size=2, max_size=2))
def test_the_eviction_choice_always_fits(node: NodeInputs, figure_values: list[int]) -> None:
    figure = dict(zip(RESOURCES, figure_values, strict=True))
    pods = node.batch_pods
    chosen = give_back(pods, figure, node.allocatable)
    left = [p for p in pods if p not in chosen]
    assert over(allocated(left), figure) == []
    if not over(allocated(pods), figure):
        assert chosen == ()
    order = eviction_order(pods, node.allocatable)
    assert list(chosen) == [p for p in order if p in chosen]  # in the contract's order
    ranks = [BAND_RANK[p.band] for p in order]
    assert ranks == sorted(ranks)  # lowest band first
    assert all(any(p.requests[r] > 0 for r in RESOURCES) for p in chosen)


@settings(max_examples=200, deadline=None)
@given(nodes(), st.lists(st.integers(0, 64_000), min_size=2, max_size=2), st.data())
def test_refused_pods_are_passed_over(
    node: NodeInputs, figure_values: list[int], data: st.DataObject
) -> None:
    figure = dict(zip(RESOURCES, figure_values, strict=True))
    pods = node.batch_pods
    skip = {p.uid for p in pods if data.draw(st.booleans())}
    chosen = give_back(pods, figure, node.allocatable, skip)
    assert not any(p.uid in skip for p in chosen)
