"""Pure evaluation of each gate condition type: (satisfied, evidence).

Each function reads only its arguments, so every rule is a table-driven unit test and the
same inputs always give the same answer (a restarted controller re-derives the same verdicts
from the API). Two texts come back: `evidence` is precise and may change on every call ("cpu
6/10 used, pod asks 2"), for Events and the audit log; `summary` only changes when the
reason changes, for the pod condition message, so a moving quota does not rewrite the
status of every waiting pod (no write storms).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from pilotfish import ledger
from pilotfish import quota as q
from pilotfish.operators.gates.model import NodeView, QuotaView, SignalView, normalize_image
from pilotfish.quota import Resources


@dataclass(frozen=True)
class Verdict:
    """Whether a condition holds, and why. Unpacks as (satisfied, evidence)."""

    satisfied: bool
    evidence: str
    summary: str = ""

    @property
    def brief(self) -> str:
        return self.summary or self.evidence

    def __iter__(self) -> Iterator[Any]:
        return iter((self.satisfied, self.evidence))


def gate_signal(
    namespace: str,
    condition: Mapping[str, Any],
    signals: Mapping[tuple[str, str], SignalView] | None,
) -> Verdict:
    """The named GateSignal in the pod's own namespace has Ready=True (a tenant cannot
    release its gates with another namespace's signal)."""
    name = str(condition.get("signalName") or "")
    if not name:
        return Verdict(False, "GateSignal condition without signalName", "no signalName")
    if signals is None:
        return Verdict(
            False,
            f"GateSignal {name}: signals not observed yet (is the GateSignal CRD installed?)",
            f"GateSignal {name} not observed yet",
        )
    sig = signals.get((namespace, name))
    if sig is None:
        return Verdict(
            False, f"GateSignal {namespace}/{name} not found", f"GateSignal {name} not found"
        )
    detail = f"resourceVersion {sig.resource_version}"
    if sig.transition_time:
        detail += f", Ready={sig.ready} since {sig.transition_time}"
    if sig.ready == "True":
        return Verdict(True, f"GateSignal {namespace}/{name} Ready ({detail})")
    return Verdict(
        False,
        f"GateSignal {namespace}/{name} not Ready (Ready={sig.ready}, {detail})",
        f"GateSignal {name} not Ready",
    )


def image(
    images: Sequence[str], condition: Mapping[str, Any], nodes: Sequence[NodeView]
) -> Verdict:
    """Every image of the pod is present on at least `minNodes` Ready nodes (default 1)."""
    need = int(condition.get("minNodes") or 1)
    if not images:
        return Verdict(True, "pod has no container images")
    ready = [n for n in nodes if n.ready]
    short: list[str] = []
    counts: list[str] = []
    for img in dict.fromkeys(images):
        want = normalize_image(img)
        have = sum(1 for n in ready if want in n.images)
        counts.append(f"{img} on {have}/{need} Ready nodes")
        if have < need:
            short.append(img)
    if short:
        return Verdict(
            False,
            "; ".join(counts),
            f"image {', '.join(short)} not yet on {need} Ready node(s)",
        )
    return Verdict(True, "; ".join(counts))


def quota(
    team: str | None,
    band: str,
    ask: Mapping[str, Fraction],
    quotas: Sequence[QuotaView],
    used: Mapping[str, Fraction],
    uids: Collection[str] = (),
) -> Verdict:
    """The team's quota ledger admits `ask` for the pods `uids`, on top of what it holds
    and `used` (what this round released already): `pilotfish.ledger.gate_condition`, the
    check admission makes. The release reserves before it removes the gate."""
    v = ledger.gate_condition(
        team, band, ask, [view.ledger for view in quotas], spent=used, excluding=uids
    )
    return Verdict(v.satisfied, v.evidence, v.summary)


@dataclass(frozen=True)
class GangMember:
    """One pod of a gang: ready when it has no Pilotfish gate left, or when every gate it
    holds other than Gang (and Quota, which is checked for the gang as a whole) holds."""

    key: str
    ready: bool
    waiting_for: str = ""


def gang(name: str, size: int, members: Sequence[GangMember]) -> Verdict:
    """All `size` pods of the gang exist and are ready: then all go together, else none."""
    ready = [m for m in members if m.ready]
    head = f"gang {name}: {len(members)}/{size} pods present, {len(ready)} ready"
    if len(members) < size:
        return Verdict(False, head, f"gang {name}: {len(members)}/{size} pods present")
    waiting = [m for m in members if not m.ready]
    if waiting:
        first = waiting[0]
        return Verdict(
            False,
            f"{head}; {first.key} waits for {first.waiting_for or 'its other gates'}",
            f"gang {name}: {len(ready)}/{len(members)} pods ready",
        )
    return Verdict(True, head)


def total(asks: Sequence[Resources]) -> Resources:
    out: Resources = {}
    for a in asks:
        out = q.add(out, a)
    return out
