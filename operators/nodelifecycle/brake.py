"""The zone brake: many machines of one zone going quiet together is a partition, not a
wave of machine failures. Pure.

Evicting the pods of a partitioned zone moves its whole load onto the other zones while the
cut-off copies keep running, and upstream's controller, which marks every pod of such nodes
not ready, empties their endpoints (kubernetes/kubernetes#77864: 100 % of a zone's traffic
failing). So, when the nodes of one zone whose silence began within one `window` are more
than `fraction` of the zone and at least `min_nodes`, the zone is braked: its silent nodes'
pods keep Ready (and their endpoints), nothing in it is evicted for `hold`, then at most one
node per `interval`. When every zone is braked (this process is the one cut off), nothing is
evicted anywhere. A single silent node is a machine failure, never a partition.

A node counts once it has been silent for `suspect_after` (half the unreachable timeout: a
live agent renews several times in that span), so the nodes of one partition, whose last
renewals are spread over a renewal interval, are all counted by the time the first of them
becomes unreachable, and the first one's pods are not marked not ready alone. A brake only
engages once one node of the zone is unreachable. The window is over the times silence
began (now - silent_for on this process's clock), which stay put while the nodes stay silent,
so the verdict is stable and is re-derived after a restart (where every silence restarts
together: it then errs towards braking, i.e. late).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

WINDOW: Final = 60.0
FRACTION: Final = 0.10
MIN_NODES: Final = 2
HOLD: Final = 300.0
INTERVAL: Final = 60.0


@dataclass(frozen=True)
class BrakeRule:
    window: float = WINDOW
    fraction: float = FRACTION
    min_nodes: int = MIN_NODES
    hold: float = HOLD
    interval: float = INTERVAL


def most_within(onsets: Iterable[float], window: float) -> int:
    """The largest number of `onsets` inside one closed span of `window` seconds."""
    s = sorted(onsets)
    best, lo = 0, 0
    for hi, t in enumerate(s):
        while t - s[lo] > window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def partitioned(onsets: Sequence[float], zone_size: int, rule: BrakeRule = BrakeRule()) -> bool:
    """Whether the silences that began at `onsets`, in a zone of `zone_size` nodes, look
    like a partition: more than `fraction` of the zone, and `min_nodes`, within a window."""
    n = most_within(onsets, rule.window)
    return n >= rule.min_nodes and n > rule.fraction * zone_size


def silent_together(
    silences: Iterable[float | None],
    zone_size: int,
    unreachable_after: float,
    now: float,
    rule: BrakeRule = BrakeRule(),
) -> int:
    """How many of one zone's nodes went silent within one window, when that brakes the
    zone; else 0. From its nodes' silences (None: lease never seen)."""
    suspect_after = unreachable_after / 2
    heard = [s for s in silences if s is not None and s >= suspect_after]
    if not any(s >= unreachable_after for s in heard):
        return 0
    starts = [now - s for s in heard]
    return most_within(starts, rule.window) if partitioned(starts, zone_size, rule) else 0


def zone_braked(
    silences: Iterable[float | None],
    zone_size: int,
    unreachable_after: float,
    now: float,
    rule: BrakeRule = BrakeRule(),
) -> bool:
    """The brake rule for one zone."""
    return silent_together(silences, zone_size, unreachable_after, now, rule) > 0


@dataclass
class ZoneBrake:
    """One zone's brake, kept in memory (re-derived after a restart, with a fresh hold)."""

    since: float | None = None  # monotonic time the brake engaged; None: not braked
    last_release: float | None = None
    released: set[str] = field(default_factory=set)  # nodes let go for eviction
    noted: set[str] = field(default_factory=set)  # nodes whose ZoneBrake Event was posted
    together: int = 0  # nodes that went silent within one window, at the last look

    @property
    def engaged(self) -> bool:
        return self.since is not None

    def update(self, braked: bool, now: float) -> bool:
        """Follow the rule's verdict; True when the brake just engaged."""
        if not braked:
            self.since, self.last_release = None, None
            self.released.clear()
            self.noted.clear()
            return False
        if self.since is None:
            self.since = now
            return True
        return False


def next_release(state: ZoneBrake, rule: BrakeRule = BrakeRule()) -> float | None:
    """The monotonic time from which the braked zone may let one more node go."""
    if state.since is None:
        return None
    due = state.since + rule.hold
    if state.last_release is not None:
        due = max(due, state.last_release + rule.interval)
    return due


def may_evict(
    state: ZoneBrake,
    node: str,
    now: float,
    every_zone_braked: bool,
    rule: BrakeRule = BrakeRule(),
) -> bool:
    """Whether `node`'s pods may be evicted now; a node already let go stays let go."""
    if node in state.released:
        return True
    if every_zone_braked:
        return False
    due = next_release(state, rule)
    return due is None or now >= due


def release(state: ZoneBrake, node: str, now: float) -> bool:
    """Record that `node` of a braked zone was let go (its evictions began); True the first
    time."""
    if state.since is None or node in state.released:
        return False
    state.released.add(node)
    state.last_release = now
    return True
