"""GateReleased Events: one per gate and namespace per round, not one per pod.

A burst (a signal raised over two thousand waiting pods) is released in a round or a few,
and the API server's write rate is the release rate's ceiling: an Event per pod would spend
a third of it on notes nobody reads one by one. Each pod's own release is kept where it is
durable and exact: the release mark its gate patch carries (`gates.pilotfish.io/released`)
and its audit line. The Event is the human summary: how many pods of the namespace lost
which gate in the round, a few of their names, on what evidence.

An Event regards one object. It regards the first pod of the group (in the round's release
order: priority, fair share, age), so it stays in the namespace the tenant can read, a lone
release reads as before, and no policy's per-object Event budget (`pilotfish.kube.events`)
runs dry on a controller that releases a few pods every round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pilotfish.operators.gates.model import PodView
from pilotfish.operators.gates.plan import RemoveGate

NAMED: Final = 5  # pod names an Event spells out; the rest are counted
EVIDENCE_MAX: Final = 400


@dataclass(frozen=True)
class _One:
    order: int
    pod: PodView
    rv: str  # the version the gate patch returned
    evidence: str
    final: bool


@dataclass(frozen=True)
class Summary:
    """One Event to post: regarding `pod` at version `rv`."""

    pod: PodView
    rv: str
    gate: str
    note: str


def _names(group: Sequence[_One]) -> str:
    shown = ", ".join(o.pod.name for o in group[:NAMED])
    more = len(group) - NAMED
    return f"{shown} and {more} more" if more > 0 else shown


def note(gate: str, group: Sequence[_One]) -> str:
    first = group[0]
    evidence = first.evidence[:EVIDENCE_MAX]
    if len(group) == 1:
        out = f"released {gate} from pod {first.pod.name}: {evidence}"
        if first.final:
            out += "; no Pilotfish gate left, the pod goes to the scheduler"
        return out
    differ = sum(1 for o in group[1:] if o.evidence != first.evidence)
    out = f"released {gate} from {len(group)} pods in one round: {_names(group)}; {evidence}"
    if differ:
        out += f" (for {first.pod.name}; it differs for {differ} of the others: audit log)"
    finals = sum(1 for o in group if o.final)
    if finals:
        out += f"; {finals} go to the scheduler now (no Pilotfish gate left)"
    return out


@dataclass
class RoundReleases:
    """The gate removals one round's writes committed, for its Events."""

    order: Mapping[str, int]  # pod key -> position in the round's plan
    _by_gate: dict[tuple[str, str], list[_One]] = field(default_factory=dict)

    @classmethod
    def of(cls, actions: Sequence[Any]) -> RoundReleases:
        order: dict[str, int] = {}
        for a in actions:
            order.setdefault(a.pod.key, len(order))
        return cls(order)

    def add(self, pod: PodView, rv: str, removes: Sequence[RemoveGate]) -> None:
        """`removes` committed on `pod` in one patch that returned version `rv`."""
        n = self.order.get(pod.key, len(self.order))
        for r in removes:
            one = _One(n, pod, rv, r.evidence, r.final)
            self._by_gate.setdefault((pod.namespace, r.gate), []).append(one)

    def summaries(self) -> list[Summary]:
        out = []
        for (_, gate), found in sorted(self._by_gate.items()):
            group = sorted(found, key=lambda o: o.order)
            out.append(Summary(group[0].pod, group[0].rv, gate, note(gate, group)))
        return out
