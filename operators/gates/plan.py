"""The vocabulary of a round: what it reads (`World`), what it decides (`Plan` of actions), and
the `Progress` its phases share while deciding.

`decide` (release), `expiry` and `status` are phases of one pure round, in that order, as the
Deployment controller's sync / rolling / status: each reads what the earlier ones settled in
`Progress`, and none does I/O. `apply` is the only code that turns a `Plan` into writes.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from pilotfish import names
from pilotfish.gates import OnExpiry
from pilotfish.operators.gates.conditions import Verdict
from pilotfish.operators.gates.model import (
    BatchView,
    NodeView,
    Pacing,
    PodView,
    QuotaView,
    SignalView,
)
from pilotfish.operators.gates.pacing import Bucket
from pilotfish.operators.gates.terms import PolicyGates

INDEPENDENT: Final = frozenset({"GateSignal", "Image"})
JOINT: Final = frozenset({"Quota", "Gang"})

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
    """Write the pod's gates.pilotfish.io/State condition (pods/status); only pods that
    still hold a Pilotfish gate get one (`status`)."""

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
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    signals: Mapping[tuple[str, str], SignalView] | None = None  # None: not observed yet
    quotas: Sequence[QuotaView] = ()  # the quota ledgers, this process's reservations in
    nodes: Sequence[NodeView] = ()
    pacing: Mapping[str, Pacing] = field(default_factory=dict)
    buckets: Mapping[str, Bucket] = field(default_factory=dict)
    # Every GatePolicy, by (namespace, name): where each gate's terms come from (`terms`).
    policies: Mapping[tuple[str, str], PolicyGates] = field(default_factory=dict)
    # Every BatchWorkload, by (namespace, name): the size of each batch gang.
    batches: Mapping[tuple[str, str], BatchView] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """A round's outcome: the writes, the pacing buckets to keep, and when to look again
    (`wake_after`, seconds from the round's instant; None: only when something changes)."""

    actions: tuple[Action, ...]
    buckets: Mapping[str, Bucket]
    wake_after: float | None
    waiting: Mapping[str, str]  # pod key -> why it was not released this round
    # pod key -> team of each pod released now: its room is reserved in the team's quota
    # ledger before its last gate goes (`apply`).
    released: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Progress:
    """What the round's phases have settled so far, by pod key."""

    now: datetime.datetime  # wall time: record deadlines and condition timestamps
    mono: float  # monotonic seconds: pacing
    verdicts: dict[str, dict[str, Verdict]] = field(default_factory=dict)  # independent gates
    joint: dict[str, dict[str, Verdict]] = field(default_factory=dict)  # Quota/Gang verdicts
    removed: dict[str, dict[str, str]] = field(default_factory=dict)  # gate -> evidence
    final: set[str] = field(default_factory=set)  # released this round
    paced: dict[str, str] = field(default_factory=dict)  # conditions met, pacing holds it
    waiting: dict[str, str] = field(default_factory=dict)
    failing: dict[str, Expire] = field(default_factory=dict)
    reviewing: dict[str, list[str]] = field(default_factory=dict)
    wake: list[float] = field(default_factory=list)  # seconds from the round's instant
    actions: list[Action] = field(default_factory=list)

    def wake_at(self, t: datetime.datetime) -> None:
        """Look again at wall time `t` (a record deadline)."""
        self.wake.append((t - self.now).total_seconds())

    def first_unmet(self, p: PodView) -> str:
        for g, v in self.verdicts[p.key].items():
            if not v.satisfied:
                return f"{g} ({v.brief})"
        return ""


# --- helpers -----------------------------------------------------------------------------


def team_of(pod: PodView, namespace_labels: Mapping[str, Mapping[str, str]]) -> str:
    """The pod's team: its own label, else its namespace's ("" when neither has one)."""
    return (
        pod.labels.get(names.LABEL_TEAM)
        or (namespace_labels.get(pod.namespace) or {}).get(names.LABEL_TEAM)
        or ""
    )


def kind(pod: PodView, gate: str) -> str:
    """The condition type of a gate the controller manages (its policy's, not the record's)."""
    return str((pod.terms.get(gate) or {}).get("type") or "")
