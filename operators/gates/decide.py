"""Decide: from what was observed and `now`, the writes that move gated pods forward.

Pure (ARCHITECTURE section 3): no I/O, no clock, no globals. The controller calls it with the
informers' current view and applies the actions with conditional writes; a conflict means
the view was stale, and the next round decides again from a fresher one.

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
3. Pacing per tenant (namespace): a token bucket (releasesPerSecond) and a cap on pods
   released but not yet bound (maxInFlight). A held tenant holds all its later units.
4. Expiry: a gate still unmet at its deadline is never removed silently: Fail marks the
   pod Expired and deletes it, Retry extends the deadline with exponential backoff, Review
   flags the pod for a person. A gate whose condition holds and that only waits for
   pacing does not expire: the wait is this controller's own throttling.
5. The pod's State condition is derived from the pod after the round's writes; it is only
   written when it differs from what the pod already shows.
6. The next wake-up is the earliest future deadline or pacing token, so the controller
   schedules one timer instead of polling.
"""

from __future__ import annotations

import datetime
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from pilotfish import gates, names, timeutil
from pilotfish import quota as q
from pilotfish.gates import GateRecord, OnExpiry, PodGates
from pilotfish.operators.gates import conditions, terms
from pilotfish.operators.gates.conditions import GangMember, Verdict
from pilotfish.operators.gates.model import (
    NodeView,
    Pacing,
    PodView,
    QuotaView,
    SignalView,
)
from pilotfish.operators.gates.pacing import Bucket, bucket_for, in_flight_allows
from pilotfish.operators.gates.terms import REASON_UNTRUSTED, PolicyGates
from pilotfish.quota import Resources

INDEPENDENT: Final = frozenset({"GateSignal", "Image"})
JOINT: Final = frozenset({"Quota", "Gang"})
MESSAGE_MAX: Final = 2000

UsageKey = tuple[str, str, str]  # (namespace, team label or "", band)


# --- actions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoveGate:
    """Remove `gate` from `pod` (strategic-merge delete, conditional on its resourceVersion).
    `final`: after this round the pod holds no Pilotfish gate, i.e. it is released."""

    pod: PodView
    gate: str
    evidence: str
    final: bool


@dataclass(frozen=True)
class SetCondition:
    """Write the pod's gates.pilotfish.io/State condition (pods/status)."""

    pod: PodView
    status: str
    reason: str
    message: str
    last_transition_time: str


@dataclass(frozen=True)
class Expire:
    """`gate` passed its deadline unmet; `action` is what the record says expiry does."""

    pod: PodView
    gate: str
    action: OnExpiry
    evidence: str
    deadline: str
    next_deadline: str = ""  # Retry: the extended deadline
    attempts: int = 0  # Retry: expiries retried so far, this one included


@dataclass(frozen=True)
class UpdateRecord:
    """Rewrite the pod's gate record annotation (Retry: new deadlines and attempts)."""

    pod: PodView
    record: str
    gates: tuple[str, ...]


@dataclass(frozen=True)
class Flag:
    """`gate`'s record does not match its GatePolicy: the gate is held; a person decides
    (review label and a Warning Event, once per pod until its condition says so)."""

    pod: PodView
    gate: str
    why: str


Action = RemoveGate | SetCondition | Expire | UpdateRecord | Flag


# --- input and output --------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    """Everything one round reads, already reduced to views."""

    pods: Sequence[PodView]  # pods labelled gates.pilotfish.io/gated=true
    # Requests of the pods *without* the gated label that hold quota, summed per key.
    usage: Mapping[UsageKey, Resources] = field(default_factory=dict)
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    signals: Mapping[tuple[str, str], SignalView] | None = None  # None: not observed yet
    quotas: Sequence[QuotaView] = ()
    nodes: Sequence[NodeView] = ()
    pacing: Mapping[str, Pacing] = field(default_factory=dict)
    buckets: Mapping[str, Bucket] = field(default_factory=dict)
    # Every GatePolicy, by (namespace, name): where each gate's terms come from (`terms`).
    policies: Mapping[tuple[str, str], PolicyGates] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...]
    buckets: Mapping[str, Bucket]
    wake_at: datetime.datetime | None
    waiting: Mapping[str, str]  # pod key -> why it was not released this round


# --- helpers -----------------------------------------------------------------------------


def team_of(pod: PodView, namespace_labels: Mapping[str, Mapping[str, str]]) -> str:
    """The pod's team: its own label, else its namespace's ("" when neither has one)."""
    return (
        pod.labels.get(names.LABEL_TEAM)
        or (namespace_labels.get(pod.namespace) or {}).get(names.LABEL_TEAM)
        or ""
    )


def untrusted_message(p: PodView, held: Sequence[str]) -> str:
    parts = [f"{g} ({p.untrusted[g]})" for g in held]
    return (
        f"held, record does not match its GatePolicy: {'; '.join(parts)}; nothing releases "
        "it on the record's terms: release or cancel it with `kubectl pilotfish gates` "
        f"(label {gates.LABEL_REVIEW}=required)"
    )


def retry_backoff(rec: GateRecord) -> int:
    """Seconds added to the deadline by the next Retry: initial * 2**attempts, capped."""
    return int(min(rec.initial_backoff_seconds * 2**rec.attempts, rec.max_backoff_seconds))


def retried(rec: GateRecord, now: datetime.datetime) -> GateRecord:
    deadline = now + datetime.timedelta(seconds=retry_backoff(rec))
    return replace(rec, deadline=timeutil.format_time(deadline), attempts=rec.attempts + 1)


def kind(pod: PodView, gate: str) -> str:
    """The condition type of a gate the controller manages (its policy's, not the record's)."""
    return str((pod.terms.get(gate) or {}).get("type") or "")


@dataclass(frozen=True)
class Unit:
    """Pods released together: one pod, or all still-gated pods of a ready gang."""

    members: tuple[PodView, ...]
    team: str
    gang: str = ""

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


def decide(world: World, now: datetime.datetime) -> Decision:
    return _Round(world, now).run()


class _Round:
    def __init__(self, world: World, now: datetime.datetime) -> None:
        self.w = world
        self.now = now
        self.alive = sorted(
            (terms.verified(p, world.policies) for p in world.pods if p.alive),
            key=lambda p: p.key,
        )
        self.team = {p.key: team_of(p, world.namespace_labels) for p in self.alive}
        self.usage = self._usage()
        self.in_flight_ns: Counter[str] = Counter()
        self.in_flight_team: Counter[str] = Counter()
        for p in self.alive:
            if p.released and not p.node_name:
                self.in_flight_ns[p.namespace] += 1
                self.in_flight_team[self.team[p.key]] += 1
        self.buckets: dict[str, Bucket] = {}
        for ns, pacing in world.pacing.items():
            b = bucket_for(pacing, world.buckets.get(ns), now)
            if b is not None:
                self.buckets[ns] = b
        self.verdicts: dict[str, dict[str, Verdict]] = {}  # independent gates, by pod
        self.joint: dict[str, dict[str, Verdict]] = {}  # Quota/Gang verdicts, by pod
        self.gang_verdict: dict[tuple[str, str], Verdict] = {}
        self.removed: dict[str, dict[str, str]] = {}  # pod -> gate -> evidence
        self.final: set[str] = set()
        self.paced: dict[str, str] = {}  # pod -> pacing that holds it (conditions all met)
        self.waiting: dict[str, str] = {}
        self.failing: dict[str, Expire] = {}
        self.reviewing: dict[str, list[str]] = {}
        self.wake: list[datetime.datetime] = []
        self.actions: list[Action] = []

    # usage and evaluation

    def _usage(self) -> dict[tuple[str, str], Resources]:
        out: dict[tuple[str, str], Resources] = {}
        for (ns, label, band), res in self.w.usage.items():
            team = label or (self.w.namespace_labels.get(ns) or {}).get(names.LABEL_TEAM) or ""
            out[(team, band)] = q.add(out.get((team, band), {}), res)
        for p in self.alive:
            if p.released:
                tb = (self.team[p.key], p.band)
                out[tb] = q.add(out.get(tb, {}), p.requests)
        return out

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
        return all(v.satisfied for v in self.verdicts[p.key].values())

    def _first_unmet(self, p: PodView) -> str:
        for g, v in self.verdicts[p.key].items():
            if not v.satisfied:
                return f"{g} ({v.brief})"
        return ""

    # gangs and units

    def _gangs(self) -> dict[tuple[str, str], list[PodView]]:
        groups: dict[tuple[str, str], list[PodView]] = {}
        for p in self.alive:
            if p.gang:
                groups.setdefault((p.namespace, p.gang), []).append(p)
        return groups

    def _gang_size(self, members: list[PodView]) -> int | None:
        # From each member's GatePolicy, never from the pod: no pod makes itself a gang of one.
        sizes = [
            int(m.terms[g].get("size") or 0)
            for m in members
            for g in m.pilotfish_gates
            if kind(m, g) == "Gang" and m.managed(g)
        ]
        return max(sizes) if sizes else None

    def _units(self) -> list[Unit]:
        gangs = self._gangs()
        sizes = {gid: self._gang_size(ms) for gid, ms in gangs.items()}
        for gid, ms in gangs.items():
            size = sizes[gid]
            if size is None:
                continue
            members = [
                GangMember(
                    m.key,
                    m.released or self._ready_but_joint(m),
                    "" if m.released else self._first_unmet(m),
                )
                for m in ms
            ]
            self.gang_verdict[gid] = conditions.gang(gid[1], size, members)
        units: list[Unit] = []
        for p in self.alive:
            if p.released:
                continue
            gid = (p.namespace, p.gang or "")
            if p.gang and sizes.get(gid) is not None:
                verdict = self.gang_verdict[gid]
                for g in p.pilotfish_gates:
                    if kind(p, g) == "Gang":
                        self.joint.setdefault(p.key, {})[g] = verdict
                todo = tuple(m for m in gangs[gid] if not m.released)
                if verdict.satisfied and p.key == todo[0].key:
                    # The gang is one unit, built once, from its first still-gated member.
                    units.append(Unit(todo, self.team[todo[0].key], gid[1]))
                continue
            for g in p.pilotfish_gates:
                if kind(p, g) == "Gang":
                    self.joint.setdefault(p.key, {})[g] = Verdict(
                        False,
                        f"pod has a Gang gate but no {gates.LABEL_GANG} label",
                        f"no {gates.LABEL_GANG} label",
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
        if ns not in held_ns and bucket is not None and not bucket.available(self.now):
            ready = bucket.ready_at(self.now)
            self.wake.append(ready)
            held_ns[ns] = (
                f"namespace {ns}: releasesPerSecond {bucket.rate:g}, next release at "
                f"{ready.isoformat()}"
            )
        if ns in held_ns:
            for m in unit.members:
                self.paced[m.key] = held_ns[ns]
                self.waiting[m.key] = held_ns[ns]
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
                verdict = conditions.quota(tb[0], tb[1], ask, self.w.quotas, self.usage.get(tb, {}))
            if not verdict.satisfied:
                held_quota.setdefault(tb, (unit.key, verdict))
                self._hold(unit, verdict)
                return
            admitted[tb] = verdict
        # Released: account for it before the next unit is looked at.
        if bucket is not None:
            self.buckets[ns] = bucket.take(n, self.now)
        self.in_flight_ns[ns] += n
        self.in_flight_team[unit.team] += n
        for m in unit.members:
            tb = (self.team[m.key], m.band)
            self.usage[tb] = q.add(self.usage.get(tb, {}), m.requests)
            gone = self.removed.setdefault(m.key, {})
            for g in m.pilotfish_gates:
                k = kind(m, g)
                if k == "Quota":
                    ev = admitted[tb].evidence
                elif k == "Gang":
                    ev = self.gang_verdict[(m.namespace, unit.gang)].evidence
                else:
                    ev = self.verdicts[m.key][g].evidence
                gone[g] = ev
                self.actions.append(RemoveGate(m, g, ev, final=True))
            self.final.add(m.key)

    def _hold(self, unit: Unit, verdict: Verdict) -> None:
        for m in unit.members:
            self.waiting[m.key] = verdict.evidence
            for g in m.pilotfish_gates:
                if kind(m, g) in JOINT:
                    self.joint.setdefault(m.key, {})[g] = verdict

    # intermediate removals and expiry

    def _intermediate(self) -> dict[str, list[RemoveGate]]:
        out: dict[str, list[RemoveGate]] = {}
        for p in self.alive:
            if p.released or p.key in self.final:
                continue
            met = [g for g, v in self.verdicts[p.key].items() if v.satisfied]
            if met and len(met) < len(p.pilotfish_gates):
                out[p.key] = [
                    RemoveGate(p, g, self.verdicts[p.key][g].evidence, final=False) for g in met
                ]
        return out

    def _why(self, p: PodView, g: str) -> str:
        if g in self.verdicts[p.key]:
            return self.verdicts[p.key][g].evidence
        if g in self.joint.get(p.key, {}):
            return self.joint[p.key][g].evidence
        if kind(p, g) == "Quota":
            return f"quota not checked: waiting for {self._first_unmet(p) or 'its other gates'}"
        return self.waiting.get(p.key, "condition not met")

    def _expire(self, p: PodView, removing: set[str]) -> None:
        fails: list[str] = []
        retries: list[str] = []
        reviews: list[str] = []
        for g in p.pilotfish_gates:
            if g in removing or not p.managed(g):
                continue
            deadline = p.deadline(g)
            if deadline is None:
                continue
            if deadline > self.now:
                self.wake.append(deadline)
                continue
            if p.key in self.paced:
                continue  # conditions met; only our own pacing holds it
            action = p.record[g].on_expiry
            if action == "Fail":
                fails.append(g)
            elif action == "Retry":
                retries.append(g)
            elif not p.review_flagged:
                reviews.append(g)
        if fails:
            g = fails[0]
            exp = Expire(p, g, "Fail", self._why(p, g), p.record[g].deadline)
            self.failing[p.key] = exp
            self.actions.append(exp)
            return
        if retries:
            new = dict(p.record)
            for g in retries:
                new[g] = retried(p.record[g], self.now)
                self.wake.append(timeutil.parse_time(new[g].deadline))
            encoded = PodGates(created=p.record_created, gates=new).encode()
            self.actions.append(UpdateRecord(p, encoded, tuple(retries)))
            for g in retries:
                self.actions.append(
                    Expire(
                        p,
                        g,
                        "Retry",
                        self._why(p, g),
                        p.record[g].deadline,
                        next_deadline=new[g].deadline,
                        attempts=new[g].attempts,
                    )
                )
        for g in reviews:
            self.actions.append(Expire(p, g, "Review", self._why(p, g), p.record[g].deadline))
        if reviews:
            self.reviewing[p.key] = reviews

    # the State condition

    def _state(self, p: PodView) -> tuple[str, str, str]:
        if p.key in self.failing:
            e = self.failing[p.key]
            rec = p.record[e.gate]
            return (
                "False",
                gates.STATE_EXPIRED,
                f"{e.gate} expired at {e.deadline} (timeout {rec.timeout_seconds}s, onExpiry "
                f"Fail): {e.evidence}; the pod is deleted",
            )
        gone = self.removed.get(p.key, {})
        remaining = [g for g in p.pilotfish_gates if g not in gone]
        others = [g for g in p.scheduling_gates if not gates.is_pilotfish_gate(g)]
        if not remaining:
            base = "all Pilotfish gates removed"
            if others:
                base += f"; still gated by {', '.join(others)}"
            if p.key in self.final:
                return ("True", gates.STATE_READY, base)
            if p.node_name and p.phase == "Running":
                return ("True", gates.STATE_RUNNING, f"running on node {p.node_name}")
            s = p.scheduled
            if not p.node_name and s and s.status == "False" and s.reason == "Unschedulable":
                return ("True", gates.STATE_UNSCHEDULABLE, s.message or "no node fits")
            return ("True", gates.STATE_READY, base)
        held = [g for g in remaining if g in p.untrusted]
        if held:
            return ("False", REASON_UNTRUSTED, untrusted_message(p, held))
        review = [
            g
            for g in remaining
            if p.managed(g)
            and p.record[g].on_expiry == "Review"
            and (p.deadline(g) or self.now) <= self.now
            and (p.review_flagged or g in self.reviewing.get(p.key, []))
        ]
        if review:
            g = review[0]
            return (
                "False",
                gates.STATE_EXPIRED,
                f"{g} expired at {p.record[g].deadline} (onExpiry Review): waiting for a "
                f"person to review (label {gates.LABEL_REVIEW}=required)",
            )
        if p.key in self.paced:
            return (
                "False",
                gates.STATE_GATED,
                f"conditions met; queued by the release pacing of namespace {p.namespace}",
            )
        parts = []
        for g in remaining:
            v = self.verdicts[p.key].get(g) or self.joint.get(p.key, {}).get(g)
            if v is not None:
                brief = v.brief
            elif kind(p, g) == "Quota":
                brief = "quota checked once the other gates are met"
            else:
                brief = "waiting"
            parts.append(f"{g} ({brief})")
        return ("False", gates.STATE_GATED, "waiting for " + "; ".join(parts))

    def _flag(self, p: PodView) -> None:
        """Flag a pod holding an untrusted gate, until its condition shows it was."""
        held = [g for g in p.pilotfish_gates if g in p.untrusted]
        if not held or p.key in self.failing:
            return
        shown = p.state is not None and p.state.reason == REASON_UNTRUSTED
        if p.review_flagged and shown:
            return
        for g in held:
            self.actions.append(Flag(p, g, p.untrusted[g]))

    def _conditions(self) -> None:
        for p in self.alive:
            status, reason, message = self._state(p)
            message = message[:MESSAGE_MAX]
            cur = p.state
            if cur and (cur.status, cur.reason, cur.message) == (status, reason, message):
                continue
            ltt = (
                cur.last_transition_time
                if cur and cur.status == status and cur.last_transition_time
                else timeutil.format_time(self.now)
            )
            self.actions.append(SetCondition(p, status, reason, message, ltt))

    # all together

    def run(self) -> Decision:
        for p in self.alive:
            self.verdicts[p.key] = self._evaluate(p)
        self._select(self._units())
        intermediate = self._intermediate()
        for p in self.alive:
            if p.released or p.key in self.final:
                continue
            removing = {r.gate for r in intermediate.get(p.key, [])}
            self._expire(p, removing)
            if p.key in self.failing:
                continue  # the pod is deleted: releasing some of its gates first means nothing
            for r in intermediate.get(p.key, []):
                self.removed.setdefault(p.key, {})[r.gate] = r.evidence
                self.actions.append(r)
            if p.key not in self.waiting and p.pilotfish_gates:
                unmet = [
                    f"{g}: {self._why(p, g)}"
                    for g in p.pilotfish_gates
                    if g not in self.removed.get(p.key, {})
                ]
                self.waiting[p.key] = "; ".join(unmet)
            self._flag(p)
        self._conditions()
        future = [t for t in self.wake if t > self.now]
        return Decision(
            actions=tuple(self.actions),
            buckets=self.buckets,
            wake_at=min(future) if future else None,
            waiting=self.waiting,
        )
