"""The reclaim figure and the give-back choice, per node. Pure.

Per resource r (cpu in millicores, memory in bytes), with A the node's allocatable, R the
summed requests of its reserved pods (every bound, unfinished pod that does not ask for
`batch.pilotfish.io/*`) and U the sum of their usage: each pod's p95 over the window, or
its usage now where that is higher (`ReclaimSettings.cpu_p95`: a rise gives capacity back
at the next cycle); a pod with no sample counts as its request (unknown is not free):

    batch[r]     = max(0, A - U - margin),  margin = `settings.margin` x A
    reclaimed[r] = max(0, batch[r] - max(0, A - R))   (the part production reserved)

floored to whole units. Written only when it moves by more than `THRESHOLD` of A, a
resource is absent, or the state changes, so usage noise does not rewrite every node every
cycle. When the node's data is stale or Prometheus does not answer, the figure is not
recomputed from old numbers: each cycle halves it (0 below `FLOOR` of A), and each halving
is written (a threshold would stall the decay short of 0; halving reaches 0 in a few
cycles).

Give back: while a node's allocated batch exceeds the figure it carries, its batch pods are
evicted lowest band first (best-effort before batch), most recently started, largest
request; only pods that ask for a resource still over, and never a pod without batch
requests.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from pilotfish import names
from pilotfish.conditions import set_condition
from pilotfish.operators.reclaim import reasons
from pilotfish.operators.reclaim.model import (
    RESOURCES,
    SCALE,
    Amounts,
    BatchPod,
    NodeInputs,
)
from pilotfish.operators.reclaim.settings import ReclaimSettings
from pilotfish.quota import format_quantity

THRESHOLD: Final = Fraction(2, 100)  # of A: a smaller move is not written
FLOOR: Final = Fraction(1, 100)  # of A: a decaying figure below it is 0
# Lowest band first; a batch pod of no known band ranks as batch.
BAND_RANK: Final = {"best-effort": 0, "batch": 1, "production": 2}


@dataclass(frozen=True)
class Figure:
    """One resource of one node, in millicores or bytes."""

    allocatable: Fraction
    reserved: Fraction
    p95: Fraction | None  # None: not measured this cycle
    margin: Fraction
    batch: int
    reclaimed: int


@dataclass(frozen=True)
class Decision:
    node: str
    state: str
    figures: dict[str, Figure]
    write: bool  # patch the node's status (figure, condition, annotation)
    condition: dict[str, Any]
    annotation: str
    event: tuple[str, str] | None  # (reason, note) to post once the write is in
    effective: dict[str, int]  # the figure the node carries after this round


def usage(node: NodeInputs, r: str) -> Fraction:
    total = Fraction(0)
    for p in node.reserved:
        sample = p.p95[r]
        total += p.requests[r] if sample is None else sample
    return total


def reserved(node: NodeInputs, r: str) -> Fraction:
    return sum((p.requests[r] for p in node.reserved), Fraction(0))


def measured(a: Fraction, r: Fraction, u: Fraction, margin: Fraction) -> tuple[int, int]:
    """(batch, reclaimed) for allocatable `a`, reserved `r`, p95 `u` and `margin` (an
    amount), floored."""
    batch = math.floor(max(Fraction(0), a - u - margin))
    return batch, reclaimed(a, r, batch)


def reclaimed(a: Fraction, r: Fraction, batch: int) -> int:
    return math.floor(max(Fraction(0), batch - max(Fraction(0), a - r)))


def decayed(current: int | None, a: Fraction, margin: Fraction = Fraction(0)) -> int:
    """Half of the figure the node carries (never above A - margin: the node may have
    shrunk); 0 once that is below `FLOOR` of A."""
    if not current or current <= 0:
        return 0
    half = min(current // 2, math.floor(max(Fraction(0), a - margin)))
    return 0 if half < a * FLOOR else half


def state_of(node: NodeInputs, failure: str | None, stale_after: float) -> str:
    if failure is not None:
        return reasons.PROMETHEUS_UNAVAILABLE
    if node.age is None or node.age > stale_after:
        return reasons.METRICS_STALE
    return reasons.MEASURED


def figures(node: NodeInputs, state: str, margin_fraction: Fraction) -> dict[str, Figure]:
    out = {}
    for r in RESOURCES:
        a, held = node.allocatable[r], reserved(node, r)
        margin = a * margin_fraction
        if state == reasons.MEASURED:
            u: Fraction | None = usage(node, r)
            assert u is not None
            batch, gained = measured(a, held, u, margin)
        else:
            u = None
            batch = decayed(node.current[r], a, margin)
            gained = reclaimed(a, held, batch)
        out[r] = Figure(a, held, u, margin, batch, gained)
    return out


def amount(r: str, units: Fraction | int) -> str:
    """Millicores or bytes, floored to whole ones as the figure is, as the API server prints
    the plain quantity: 3200m, 4, 16Gi (not a margin of 13743895347200m bytes)."""
    return format_quantity(r, Fraction(math.floor(units)) / SCALE[r])


def annotation(figs: Mapping[str, Figure], window: str, state: str) -> str:
    body: dict[str, Any] = {}
    for r, f in figs.items():
        entry = {
            "allocatable": amount(r, f.allocatable),
            "reserved": amount(r, f.reserved),
            "margin": amount(r, f.margin),
            "batch": amount(r, f.batch),
            "reclaimed": amount(r, f.reclaimed),
        }
        if f.p95 is not None:
            entry["p95"] = amount(r, f.p95)
        body[r] = entry
    body["window"] = window
    body["state"] = state
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def message(
    node: NodeInputs,
    state: str,
    figs: Mapping[str, Figure],
    failure: str | None,
    s: ReclaimSettings,
) -> str:
    if state == reasons.MEASURED:
        parts = []
        for r, f in figs.items():
            parts.append(
                f"{r} {amount(r, f.batch)} = allocatable {amount(r, f.allocatable)} - p95 "
                f"{amount(r, f.p95 or 0)} of reserved pods (requests {amount(r, f.reserved)}) - "
                f"margin {amount(r, f.margin)}, reclaimed {amount(r, f.reclaimed)}"
            )
        return f"batch allocatable: {'; '.join(parts)} (p95 over {s.window})"
    left = ", ".join(f"{r} {amount(r, f.batch)}" for r, f in figs.items())
    if state == reasons.PROMETHEUS_UNAVAILABLE:
        why = f"Prometheus query failed ({failure})"
    elif node.age is None:
        why = "no usage sample for this node"
    else:
        why = f"newest usage sample {node.age:.0f}s old (stale after {s.stale_after:g}s)"
    return f"{why}: batch allocatable decaying toward 0 ({left})"


def moved(node: NodeInputs, state: str, figs: Mapping[str, Figure]) -> bool:
    """Whether the figure must be written: a resource absent, or a measured figure that
    moved by more than `THRESHOLD` of A, or a decaying one that changed at all."""
    for r, f in figs.items():
        current = node.current[r]
        if current is None:
            return True
        if state != reasons.MEASURED:
            if f.batch != current:
                return True
        elif abs(f.batch - current) > f.allocatable * THRESHOLD:
            return True
    return False


def transition(prev: str | None, state: str, note: str) -> tuple[str, str] | None:
    """The Event for a change of state; none for a node's first judgement (a new node is
    stale until its first scrape: its condition says so, an Event would be noise)."""
    if prev is None:
        return None
    if state == reasons.MEASURED:
        return (reasons.EVENT_RECOVERED, note) if prev in reasons.DECAYING else None
    return (reasons.EVENT_STALE, note) if prev != state else None


def decide(node: NodeInputs, failure: str | None, settings: ReclaimSettings, now: str) -> Decision:
    """`failure`: why this cycle's queries gave nothing (None: they answered)."""
    state = state_of(node, failure, settings.stale_after)
    figs = figures(node, state, Fraction(repr(settings.margin)))
    note = message(node, state, figs, failure, settings)
    old = node.condition
    prev = None if old is None else str(old.get("reason") or "")
    status = "True" if state == reasons.MEASURED else "False"
    cond = set_condition(
        node.conditions, names.CONDITION_BATCH_CAPACITY, status, state, note, None, now
    )
    cond["lastHeartbeatTime"] = now  # as node conditions have: when it was last written
    # A node never measured is not judged: it carries no figure until it is (a 0 written
    # on a new node before its first scrape would read as "full" to the extender).
    unjudged = (
        state != reasons.MEASURED
        and old is None
        and all(node.current[r] is None for r in RESOURCES)
    )
    write = not unjudged and (prev != state or node.annotation is None or moved(node, state, figs))
    effective = {r: figs[r].batch if write else int(node.current[r] or 0) for r in RESOURCES}
    return Decision(
        node=node.name,
        state=state,
        figures=figs,
        write=write,
        condition=cond,
        annotation=annotation(figs, settings.window, state),
        event=transition(prev, state, note),
        effective=effective,
    )


def allocated(pods: Iterable[BatchPod]) -> Amounts:
    total = {r: Fraction(0) for r in RESOURCES}
    for p in pods:
        for r in RESOURCES:
            total[r] += p.requests.get(r, Fraction(0))
    return total


def over(alloc: Mapping[str, Fraction], figure: Mapping[str, int]) -> list[str]:
    return [r for r in RESOURCES if alloc[r] > figure[r]]


def eviction_order(pods: Iterable[BatchPod], allocatable: Mapping[str, Fraction]) -> list[BatchPod]:
    """Lowest band first, most recently started, largest request (as shares of the node)."""

    def size(p: BatchPod) -> Fraction:
        return sum(
            (p.requests.get(r, Fraction(0)) / allocatable[r] for r in RESOURCES if allocatable[r]),
            Fraction(0),
        )

    return sorted(
        pods, key=lambda p: (BAND_RANK.get(p.band, 1), -p.started, -size(p), p.key, p.uid)
    )


def give_back(
    pods: Collection[BatchPod],
    figure: Mapping[str, int],
    allocatable: Mapping[str, Fraction],
    skip: Collection[str] = (),
) -> tuple[BatchPod, ...]:
    """The batch pods to evict, in order, so the rest fit `figure`; pods whose uid is in
    `skip` (refused this cycle) are passed over. Only pods that ask for a resource still
    over are chosen, so the choice always fits unless `skip` holds what it needed."""
    alloc = allocated(pods)
    chosen: list[BatchPod] = []
    for p in eviction_order(pods, allocatable):
        excess = over(alloc, figure)
        if not excess:
            break
        if p.uid in skip or not any(p.requests.get(r, Fraction(0)) > 0 for r in excess):
            continue
        chosen.append(p)
        for r in RESOURCES:
            alloc[r] -= p.requests.get(r, Fraction(0))
    return tuple(chosen)
