"""Compact index sets: one text per set, and the operations agree with a plain set."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pilotfish.indexranges import IndexRangeError, IndexSet

indexes = st.sets(st.integers(min_value=0, max_value=300), max_size=80)


@given(indexes)
def test_format_then_parse_is_the_same_set(members: set[int]) -> None:
    s = IndexSet.of(members)
    assert set(s) == members
    assert IndexSet.parse(s.format()) == s
    assert s.count() == len(members)


@given(indexes, indexes)
def test_union_and_add_agree_with_sets(a: set[int], b: set[int]) -> None:
    sa, sb = IndexSet.of(a), IndexSet.of(b)
    assert set(sa.union(sb)) == a | b
    grown = sa
    for i in sorted(b, reverse=True):  # any order of adds gives the one canonical form
        grown = grown.add(i)
    assert grown == sa.union(sb)


@given(indexes, st.integers(min_value=0, max_value=400))
def test_contains_missing_and_count_below(members: set[int], n: int) -> None:
    s = IndexSet.of(members)
    for i in range(310):
        assert (i in s) == (i in members)
    assert list(s.missing_below(n)) == [i for i in range(n) if i not in members]
    assert s.count_below(n) == sum(1 for i in members if i < n)


@pytest.mark.parametrize(
    ("text", "position", "what"),
    [
        ("0-4,x", 4, "expected an index"),
        ("5-3", 0, "ends before it starts"),
        ("0-4,3", 4, "overlaps"),
        ("0-4,5", 4, "touches"),
        ("1,,2", 2, "found 'nothing'"),
        ("01", 0, "leading zero"),
        ("0-", 2, "expected an index"),
        ("-3", 0, "expected an index"),
    ],
)
def test_bad_text_names_the_position(text: str, position: int, what: str) -> None:
    with pytest.raises(IndexRangeError, match=f"position {position}: .*{what}"):
        IndexSet.parse(text)


def test_a_hundred_thousand_indexes_stay_small() -> None:
    """Tasks finish roughly in order: 100,000 done with a scatter of stragglers missing
    is a short text, and a whole job is one range."""
    rng = random.Random(3)
    stragglers = set(rng.sample(range(100_000), 50))
    done = IndexSet()
    for i in range(100_000):
        if i not in stragglers:
            done = done.add(i)
    assert done.count() == 100_000 - 50
    assert len(done.format()) < 1_000
    assert sorted(done.missing_below(100_000)) == sorted(stragglers)
    for i in sorted(stragglers):
        done = done.add(i)
    assert done.format() == "0-99999"
