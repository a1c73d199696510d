"""Which nodes are in which zone, which are lost, and each zone's brake: the controller's
in-memory bookkeeping, kept from the node informer and from its own reconciles.

Nothing here is persisted: after a restart the informer refills the zones, the reconciles
refill `lost`, and the brakes are re-derived from the silences (counted afresh, so late).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from pilotfish import metrics
from pilotfish.operators.nodelifecycle.brake import (
    BrakeRule,
    ZoneBrake,
    may_evict,
    next_release,
    silent_together,
)
from pilotfish.operators.nodelifecycle.silence import Verdict

log = logging.getLogger("pilotfish.nodelifecycle")

# A zone's silences are scanned at most this often (a partition of thousands of nodes would
# otherwise scan the zone once per node); a renewal or a membership change of the zone
# forgets the scan at once.
SCAN_TTL: Final = 1.0


@dataclass
class Zones:
    rule: BrakeRule = field(default_factory=BrakeRule)
    members: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    zone_of: dict[str, str] = field(default_factory=dict)
    lost: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    brakes: dict[str, ZoneBrake] = field(default_factory=dict)
    # zone -> (at, together, any node quiet): the last scan of the zone's silences
    scans: dict[str, tuple[float, int, bool]] = field(default_factory=dict)

    def forget_scan(self, node: str) -> None:
        zone = self.zone_of.get(node)
        if zone is not None:
            self.scans.pop(zone, None)

    def place(self, node: str, zone: str | None) -> None:
        """`node` is in `zone` now (None: deleted)."""
        was = self.zone_of.pop(node, None)
        if was != zone:
            for z in (was, zone):
                if z is not None:
                    self.scans.pop(z, None)
        if was is not None and was != zone:
            self.members[was].discard(node)
            if not self.members[was]:
                del self.members[was]
            if node in self.lost.get(was, ()):
                self.set_lost(node, was, False)
        if zone is not None:
            self.zone_of[node] = zone
            self.members[zone].add(node)

    def set_lost(self, node: str, zone: str, lost: bool) -> bool:
        """Record whether `node` is lost; True when that changed."""
        nodes = self.lost[zone]
        if (node in nodes) == lost:
            return False
        if lost:
            nodes.add(node)
        else:
            nodes.discard(node)
        metrics.NODELIFECYCLE_SILENT_NODES.labels(zone).set(len(nodes))
        metrics.NODELIFECYCLE_UNREACHABLE_NODES.set(sum(len(n) for n in self.lost.values()))
        return True

    def is_lost(self, node: str) -> bool:
        zone = self.zone_of.get(node)
        return zone is not None and node in self.lost.get(zone, ())

    def lost_peers(self, node: str) -> list[str]:
        zone = self.zone_of.get(node)
        return [] if zone is None else sorted(self.lost.get(zone, set()) - {node})

    def every_zone_braked(self) -> bool:
        """Every zone that has nodes is braked: this process, not the machines, is cut off."""
        return bool(self.members) and all(
            (b := self.brakes.get(z)) is not None and b.engaged for z in self.members
        )

    def verdict(
        self,
        node: str,
        zone: str,
        silent_for: float | None,
        silent_for_of: Callable[[str], float | None],
        unreachable_after: float,
        now: float,
    ) -> tuple[Verdict, ZoneBrake, bool]:
        """The brake's verdict for `node`, its zone's state, and whether it just engaged.
        The zone is evaluated only for a node that is quiet (or a zone already braked)."""
        state = self.brakes.setdefault(zone, ZoneBrake())
        quiet = silent_for is not None and silent_for >= unreachable_after / 2
        if not quiet and not state.engaged:
            return Verdict(), state, False
        peers = self.members.get(zone, set())
        scan = self.scans.get(zone)
        if scan is not None and 0 <= now - scan[0] < SCAN_TTL:
            _, together, any_quiet = scan
        else:
            silences = [silent_for_of(n) for n in peers]
            together = silent_together(silences, len(peers), unreachable_after, now, self.rule)
            any_quiet = any(s is not None and s >= unreachable_after / 2 for s in silences)
            self.scans[zone] = (now, together, any_quiet)
        was = state.engaged
        # Once braked, the zone stays braked until every one of its quiet nodes is back: a
        # partition heals node by node, and the first lease to resume must not turn the
        # rest into machine failures to evict at once.
        engaged = state.update(together > 0 or (was and any_quiet), now)
        state.together = together
        if was != state.engaged:
            metrics.NODELIFECYCLE_ZONE_BRAKE.labels(zone).set(1 if state.engaged else 0)
            log.warning(
                "zone brake engaged" if state.engaged else "zone brake released",
                extra={"zone": zone, "nodes": len(peers), "lost": sorted(self.lost[zone])},
            )
        if not state.engaged:
            return Verdict(), state, False
        ok = may_evict(state, node, now, self.every_zone_braked(), self.rule)
        return Verdict(True, ok, next_release(state, self.rule)), state, engaged
