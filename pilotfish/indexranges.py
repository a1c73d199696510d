"""Compact sets of task indexes: "0-4,7,9-12", as indexed Jobs write `completedIndexes`.

A BatchWorkload of 100,000 tasks records which indexes succeeded in its status; as a plain
list that is ~600 KB and grows past etcd's object limit with the rest of the status, while
as ranges it is a few bytes for a job that completes mostly in order and stays small for one
that does not (tasks finish roughly in creation order). An `IndexSet` is immutable: sorted,
disjoint, non-adjacent inclusive ranges, so one set has exactly one text form.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

# No task index is larger (the API server bounds completions far below this anyway); it
# keeps a hostile status from making the operator build a huge set.
MAX_INDEX: Final = 10**9


class IndexRangeError(ValueError):
    """A range text that does not parse, naming the position and what was wrong there."""


@dataclass(frozen=True)
class IndexSet:
    ranges: tuple[tuple[int, int], ...] = ()

    @classmethod
    def parse(cls, text: str) -> IndexSet:
        """Read "0-4,7"; an empty text is the empty set."""
        if text == "":
            return cls()
        pairs: list[tuple[int, int]] = []
        pos = 0
        for part in text.split(","):
            lo_text, sep, hi_text = part.partition("-")
            lo = _number(lo_text, pos, text)
            hi = _number(hi_text, pos + len(lo_text) + 1, text) if sep else lo
            if hi < lo:
                raise IndexRangeError(
                    f"position {pos}: range {part!r} ends before it starts in {text!r}"
                )
            if pairs and lo <= pairs[-1][1] + 1:
                raise IndexRangeError(
                    f"position {pos}: range {part!r} overlaps or touches the one before it "
                    f"in {text!r} (ranges must be sorted and merged)"
                )
            pairs.append((lo, hi))
            pos += len(part) + 1
        return cls(tuple(pairs))

    @classmethod
    def of(cls, indexes: Iterable[int]) -> IndexSet:
        out = cls()
        for i in sorted(set(indexes)):
            out = out.add(i)
        return out

    def format(self) -> str:
        return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in self.ranges)

    def __str__(self) -> str:
        return self.format()

    def _find(self, index: int) -> int:
        """Position of the last range starting at or before `index`, or -1."""
        return bisect.bisect_right(self.ranges, (index, MAX_INDEX + 1)) - 1

    def __contains__(self, index: object) -> bool:
        if not isinstance(index, int):
            return False
        at = self._find(index)
        return at >= 0 and self.ranges[at][1] >= index

    def add(self, index: int) -> IndexSet:
        if index < 0 or index > MAX_INDEX:
            raise IndexRangeError(f"index {index} is outside 0..{MAX_INDEX}")
        if index in self:
            return self
        ranges = list(self.ranges)
        at = self._find(index)
        lo, hi = index, index
        joins_left = at >= 0 and ranges[at][1] == index - 1
        joins_right = at + 1 < len(ranges) and ranges[at + 1][0] == index + 1
        if joins_left:
            lo = ranges[at][0]
        if joins_right:
            hi = ranges[at + 1][1]
        start = at if joins_left else at + 1
        end = at + 2 if joins_right else at + 1
        ranges[start:end] = [(lo, hi)]
        return IndexSet(tuple(ranges))

    def union(self, other: IndexSet) -> IndexSet:
        merged: list[tuple[int, int]] = []
        for lo, hi in sorted(self.ranges + other.ranges):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
            else:
                merged.append((lo, hi))
        return IndexSet(tuple(merged))

    def count(self) -> int:
        return sum(hi - lo + 1 for lo, hi in self.ranges)

    def __len__(self) -> int:
        return self.count()

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def __iter__(self) -> Iterator[int]:
        for lo, hi in self.ranges:
            yield from range(lo, hi + 1)

    def count_below(self, n: int) -> int:
        """How many members are < n."""
        return sum(max(0, min(hi, n - 1) - lo + 1) for lo, hi in self.ranges if lo < n)

    def missing_below(self, n: int) -> Iterator[int]:
        """The indexes 0..n-1 not in the set, in order, lazily: a caller taking the first
        few of a 100,000-task job's missing indexes pays for those few and the ranges."""
        nxt = 0
        for lo, hi in self.ranges:
            if lo >= n:
                break
            yield from range(nxt, lo)
            nxt = hi + 1
        yield from range(nxt, n)


def _number(digits: str, pos: int, text: str) -> int:
    if not digits.isascii() or not digits.isdigit():
        shown = digits or "nothing"
        raise IndexRangeError(
            f"position {pos}: expected an index (digits) but found {shown!r} in {text!r}"
        )
    if len(digits) > 1 and digits[0] == "0":
        raise IndexRangeError(f"position {pos}: index {digits!r} has a leading zero in {text!r}")
    value = int(digits)
    if value > MAX_INDEX:
        raise IndexRangeError(f"position {pos}: index {value} exceeds {MAX_INDEX} in {text!r}")
    return value
