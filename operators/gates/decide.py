"""Decide: from what was observed and `now`, the writes that move gated pods forward.

Pure (docs/ARCHITECTURE.md, "the controller shape"): no I/O, no clock, no globals. The
controller calls it with the informers' current view and the round's instant, and `apply`
writes the plan with conditional writes; a conflict means the view was stale, and the next
round decides again from a fresher one. This module is the release phase; `expiry` and
`status` are the phases after it (`plan.Progress` carries what each settled).

The rules, in the order a round applies them:

0. Each gate's terms are re-derived from its GatePolicy (`terms`): only a gate whose record
   its policy (or the quota rule) confirms is evaluated, on the policy's condition; a gate
   whose record does not match is held and its pod flagged, whatever the record says.
1. Each gate whose condition is local to the pod (GateSignal, Image) is evaluated alone.
   A satisfied one is removed at once when the pod keeps another Pilotfish gate (the pod
   still cannot reach the scheduler, so nothing is paced).
2. The last gates of a pod are its *release*: the pod goes to the scheduler. Quota and
   Gang are only decided here, because they are about the moment of release: quota is
   re-checked against current usage right before it, and a gang goes all together.
   Release units (one pod, or every still-gated pod of a ready gang) are taken in order:
   priority (higher first), then the team with fewest released-not-yet-bound pods (fair
   share), then age (older first). Within one round every release is added to usage before
   the next unit is checked, so quota is never over-released; a unit the quota refuses
   holds back the later units of the same team and band, so a big pod is not starved by
   smaller ones behind it.
3. Pacing per tenant (namespace): a token bucket (releasesPerSecond, on the monotonic
   clock) and a cap on pods released but not yet bound (maxInFlight). A held tenant holds
   all its later units.
4. Expiry: a gate still unmet at its deadline is never removed silently: Fail marks the
   pod Expired and deletes it, Retry extends the deadline with exponential backoff, Review
   flags the pod for a person. A gate whose condition holds and that only waits for
   pacing does not expire: the wait is this controller's own throttling.
5. The State condition of each pod still holding a Pilotfish gate is derived from the pod
   after the round's writes; it is only written when it differs from what the pod already
   shows. A released pod gets none: its release is the gate patch alone (`status`).
6. The next wake-up is the earliest future deadline or pacing token, so the controller
   asks its queue for one visit instead of polling.
"""

from __future__ import annotations

import datetime
from collections import Counter, deque
from dataclasses import dataclass

from pilotfish import gates
from pilotfish import quota as q
from pilotfish.operators.gates import conditions, expiry, gangs, status, terms
from pilotfish.operators.gates.conditions import Verdict
from pilotfish.operators.gates.model import PodView
from pilotfish.operators.gates.pacing import Bucket, bucket_for, in_flight_allows
from pilotfish.operators.gates.plan import (
    JOINT,
    Plan,
    Progress,
    RemoveGate,
    World,
    kind,
    team_of,
)
from pilotfish.quota import Resources


@dataclass(frozen=True)
class Unit:
    """Pods released together: one pod, or all still-gated pods of a ready gang."""

    members: tuple[PodView, ...]
    team: str
    gang: gangs.GangId | None = None

    @property
    def namespace(self) -> str:
        return self.members[0].namespace

    @property
    def key(self) -> str:
        return self.members[0].key

    @property
    def priority(self) -> int:
        return max(m.priority for m in self.members)

    @property
    def created(self) -> datetime.datetime:
        return min(m.created for m in self.members)

    def order(self) -> tuple[int, datetime.datetime, str]:
        return (-self.priority, self.created, self.key)


# --- the round ---------------------------------------------------------------------------


def decide(world: World, now: datetime.datetime, mono: float) -> Plan:
    """One round: `now` is wall time (record deadlines, condition timestamps), `mono` the
    same instant on the monotonic clock (pacing)."""
    return _Round(world, Progress(now, mono)).run()


class _Round:
    def __init__(self, world: World, prog: Progress) -> None:
        self.w = world
        self.prog = prog
        self.alive = sorted(
            (terms.verified(p, world.policies) for p in world.pods if p.alive),
            key=lambda p: p.key,
        )
        self.team = {p.key: team_of(p, world.namespace_labels) for p in self.alive}
        # What this round released; the rest is in the quota ledger (`pilotfish.ledger`).
        self.usage: dict[tuple[str, str], Resources] = {}
        self.in_flight_ns: Counter[str] = Counter()
        self.in_flight_team: Counter[str] = Counter()
        for p in self.alive:
            if p.released and not p.node_name:
                self.in_flight_ns[p.namespace] += 1
                self.in_flight_team[self.team[p.key]] += 1
        self.buckets: dict[str, Bucket] = {}
        for ns, pacing in world.pacing.items():
            b = bucket_for(pacing, world.buckets.get(ns), prog.mono)
            if b is not None:
                self.buckets[ns] = b
        self.gang_verdict: dict[gangs.GangId, Verdict] = {}
        self.released: dict[str, str] = {}  # pod key -> team, for the pods released now

    # evaluation

    def _evaluate(self, p: PodView) -> dict[str, Verdict]:
        out: dict[str, Verdict] = {}
        for g in p.pilotfish_gates:
            if g in p.untrusted:
                out[g] = Verdict(
                    False,
                    f"{g} is held: its record cannot be trusted ({p.untrusted[g]})",
                    "record does not match its GatePolicy",
                )
                continue
            if not p.managed(g):
                rec = p.record.get(g)
                why = p.record_error or (
                    f"record owner is {rec.owner}"
                    if rec
                    else f"no entry in {gates.ANNOTATION_RECORD}"
                )
                out[g] = Verdict(
                    False,
                    f"{g} is not managed by this controller ({why})",
                    "not managed by the gate controller",
                )
                continue
            cond = p.terms[g]
            k = kind(p, g)
            if k == "GateSignal":
                out[g] = conditions.gate_signal(p.namespace, cond, self.w.signals)
            elif k == "Image":
                out[g] = conditions.image(p.images, cond, self.w.nodes)
            elif k not in JOINT:
                out[g] = Verdict(False, f"unknown condition type {k!r}", f"unknown condition {k!r}")
        return out

    def _ready_but_joint(self, p: PodView) -> bool:
        return all(v.satisfied for v in self.prog.verdicts[p.key].values())

    # gangs and units

    def _units(self) -> list[Unit]:
        members = gangs.groups(self.alive)
        begun = gangs.begun(self.w.pods)
        for gid, ms in members.items():
            verdict = gangs.verdict(
                gid, ms, self.w.batches, begun[gid], self._ready_but_joint, self.prog.first_unmet
            )
            if verdict is not None:
                self.gang_verdict[gid] = verdict
        units: list[Unit] = []
        for p in self.alive:
            if p.released:
                continue
            mine = gangs.gang_id(p)
            if mine is not None and mine in self.gang_verdict:
                verdict = self.gang_verdict[mine]
                for g in p.pilotfish_gates:
                    if kind(p, g) == "Gang":
                        self.prog.joint.setdefault(p.key, {})[g] = verdict
                todo = tuple(m for m in members[mine] if not m.released)
                if verdict.satisfied and p.key == todo[0].key:
                    # The gang is one unit, built once, from its first still-gated member.
                    units.append(Unit(todo, self.team[todo[0].key], mine))
                continue
            for g in p.pilotfish_gates:
                if kind(p, g) == "Gang":
                    self.prog.joint.setdefault(p.key, {})[g] = Verdict(
                        False,
                        f"pod has a Gang gate but no {gates.LABEL_GANG} label",
                        gangs.NO_LABEL,
                    )
            if self._ready_but_joint(p) and not any(
                kind(p, g) == "Gang" for g in p.pilotfish_gates
            ):
                units.append(Unit((p,), self.team[p.key]))
        return units

    # selection: order, pacing, quota

    def _select(self, units: list[Unit]) -> None:
        queues: dict[str, deque[Unit]] = {}
        for u in sorted(units, key=Unit.order):
            queues.setdefault(u.team, deque()).append(u)
        held_ns: dict[str, str] = {}
        held_quota: dict[tuple[str, str], tuple[str, Verdict]] = {}
        while queues:
            team = min(
                queues,
                key=lambda t: (
                    -queues[t][0].priority,
                    self.in_flight_team[t],
                    queues[t][0].created,
                    queues[t][0].key,
                ),
            )
            unit = queues[team].popleft()
            if not queues[team]:
                del queues[team]
            self._consider(unit, held_ns, held_quota)

    def _consider(
        self,
        unit: Unit,
        held_ns: dict[str, str],
        held_quota: dict[tuple[str, str], tuple[str, Verdict]],
    ) -> None:
        ns, n = unit.namespace, len(unit.members)
        pacing = self.w.pacing.get(ns)
        if ns not in held_ns and not in_flight_allows(pacing, self.in_flight_ns[ns], n):
            assert pacing is not None
            held_ns[ns] = (
                f"namespace {ns}: {self.in_flight_ns[ns]} released pods not yet bound, "
                f"maxInFlight {pacing.max_in_flight}"
            )
        bucket = self.buckets.get(ns)
        mono = self.prog.mono
        if ns not in held_ns and bucket is not None and not bucket.available(mono):
            wait = bucket.ready_at(mono) - mono
            self.prog.wake.append(wait)
            held_ns[ns] = (
                f"namespace {ns}: releasesPerSecond {bucket.rate:g}, next release in {wait:.2f}s"
            )
        if ns in held_ns:
            for m in unit.members:
                self.prog.paced[m.key] = held_ns[ns]
                self.prog.waiting[m.key] = held_ns[ns]
            return
        groups: dict[tuple[str, str], list[PodView]] = {}
        for m in unit.members:
            if any(kind(m, g) == "Quota" for g in m.pilotfish_gates):
                groups.setdefault((self.team[m.key], m.band), []).append(m)
        admitted: dict[tuple[str, str], Verdict] = {}
        for tb, ms in sorted(groups.items()):
            if tb in held_quota:
                first, head = held_quota[tb]
                verdict = Verdict(
                    False,
                    f"queued behind {first} for the quota of team {tb[0]}, band {tb[1]} "
                    f"({head.evidence})",
                    f"queued for the quota of team {tb[0]}, band {tb[1]}",
                )
            else:
                ask = conditions.total([m.requests for m in ms])
                verdict = conditions.quota(
                    *tb, ask, self.w.quotas, self.usage.get(tb, {}), {m.uid for m in ms}
                )
            if not verdict.satisfied:
                held_quota.setdefault(tb, (unit.key, verdict))
                self._hold(unit, verdict)
                return
            admitted[tb] = verdict
        # Released: account for it before the next unit is looked at.
        if bucket is not None:
            self.buckets[ns] = bucket.take(n, mono)
        self.in_flight_ns[ns] += n
        self.in_flight_team[unit.team] += n
        for m in unit.members:
            tb = (self.team[m.key], m.band)
            self.usage[tb] = q.add(self.usage.get(tb, {}), m.requests)
            gone = self.prog.removed.setdefault(m.key, {})
            for g in m.pilotfish_gates:
                k = kind(m, g)
                if k == "Quota":
                    ev = admitted[tb].evidence
                elif k == "Gang":
                    assert unit.gang is not None, "a Gang gate only goes with its gang"
                    ev = self.gang_verdict[unit.gang].evidence
                else:
                    ev = self.prog.verdicts[m.key][g].evidence
                gone[g] = ev
                self.prog.actions.append(RemoveGate(m, g, ev, final=True))
            self.prog.final.add(m.key)
            self.released[m.key] = self.team[m.key]

    def _hold(self, unit: Unit, verdict: Verdict) -> None:
        for m in unit.members:
            self.prog.waiting[m.key] = verdict.evidence
            for g in m.pilotfish_gates:
                if kind(m, g) in JOINT:
                    self.prog.joint.setdefault(m.key, {})[g] = verdict

    # intermediate removals, then the later phases

    def _intermediate(self) -> dict[str, list[RemoveGate]]:
        out: dict[str, list[RemoveGate]] = {}
        for p in self.alive:
            if p.released or p.key in self.prog.final:
                continue
            met = [g for g, v in self.prog.verdicts[p.key].items() if v.satisfied]
            if met and len(met) < len(p.pilotfish_gates):
                out[p.key] = [
                    RemoveGate(p, g, self.prog.verdicts[p.key][g].evidence, final=False)
                    for g in met
                ]
        return out

    def run(self) -> Plan:
        prog = self.prog
        for p in self.alive:
            prog.verdicts[p.key] = self._evaluate(p)
        self._select(self._units())
        intermediate = self._intermediate()
        for p in self.alive:
            if p.released or p.key in prog.final:
                continue
            removing = {r.gate for r in intermediate.get(p.key, [])}
            expiry.expire(prog, p, removing)
            if p.key in prog.failing:
                continue  # the pod is deleted: releasing some of its gates first means nothing
            for r in intermediate.get(p.key, []):
                prog.removed.setdefault(p.key, {})[r.gate] = r.evidence
                prog.actions.append(r)
            if p.key not in prog.waiting and p.pilotfish_gates:
                unmet = [
                    f"{g}: {expiry.why(prog, p, g)}"
                    for g in p.pilotfish_gates
                    if g not in prog.removed.get(p.key, {})
                ]
                prog.waiting[p.key] = "; ".join(unmet)
            status.flag(prog, p)
        status.conditions(prog, self.alive)
        future = [t for t in prog.wake if t > 0]
        return Plan(
            actions=tuple(prog.actions),
            buckets=self.buckets,
            wake_after=min(future) if future else None,
            waiting=prog.waiting,
            released=self.released,
        )
