"""Whatever the interleaving of admissions, gate releases, finishing pods and the quota
controller's settling, the room handed out never exceeds the limit, and the ledger never
counts less than what runs or is owed.

The three writers are the real decisions (admission's `decide`, the gate controller's
`gate_condition` + `release_decision`, the quota controller's `decide`), each applied as the
API server applies a conditional write: decided from the TeamQuota version it read, written
only if that is still the current version. Each decision and its write are separate steps,
so any other step can fall between them.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pilotfish import ledger
from pilotfish.ledger import RESERVATION_TTL_SECONDS, Ledger
from pilotfish.operators.quota.decide import decide as quota_decide
from pilotfish.reservations import Release, release_decision
from pilotfish.webhooks.quota import QUOTA_GATE, Admit, Gate
from pilotfish.webhooks.quota import decide as admission_decide

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
NS_LABELS = {"pilotfish.io/team": "t"}


@dataclass
class Pod:
    uid: str
    cpu: int
    state: str  # gated | ungating (reserved, gate not yet removed) | running | finished

    def obj(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "containers": [{"name": "c", "resources": {"requests": {"cpu": str(self.cpu)}}}]
        }
        if self.state in ("gated", "ungating"):
            spec["schedulingGates"] = [{"name": QUOTA_GATE}]
        phase = "Succeeded" if self.state == "finished" else "Running"
        meta = {"name": self.uid, "namespace": "ns", "uid": self.uid}
        return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


@dataclass
class Pending:
    """A decision waiting for its write: valid only on TeamQuota version `rv`."""

    rv: int
    body: dict[str, Any]
    after: Callable[[], None]  # what happens once the write landed


@dataclass
class Cluster:
    limit: int
    version: int = 1
    status: dict[str, Any] = field(default_factory=dict)
    pods: dict[str, Pod] = field(default_factory=dict)
    pending: list[Pending] = field(default_factory=list)
    ages: dict[str, float] = field(default_factory=dict)
    serial: int = 0

    def tq(self) -> dict[str, Any]:
        return {
            "metadata": {"name": "t", "resourceVersion": str(self.version), "generation": 1},
            "spec": {"team": "t", "bands": {"batch": {"cpu": str(self.limit)}}},
            "status": self.status,
        }

    def write(self, p: Pending) -> None:
        self.pending.remove(p)
        if p.rv != self.version:
            return  # 409: the writer decides again, later, as a new step
        self.version += 1
        self.status = p.body["status"]
        p.after()

    # the writers

    def admit(self, cpu: int, *, created: bool = True) -> None:
        """`created` False: a later webhook or the API server refused the pod after its
        reservation landed, so the pod never appears."""
        self.serial += 1
        uid = f"p{self.serial}"
        pod = Pod(uid, cpu, "running")
        out = admission_decide(pod.obj(), NS_LABELS, "batch", [self.tq()], NOW)
        if isinstance(out, Gate):
            self.pods[uid] = Pod(uid, cpu, "gated")  # admitted behind the quota gate
        elif isinstance(out, Admit) and out.reservation is not None:
            body = Ledger.of(self.tq()).with_reservations([out.reservation])

            def create() -> None:
                if created:
                    self.pods[uid] = pod

            self.pending.append(Pending(self.version, body, create))

    def release(self, pick: int) -> None:
        gated = sorted(u for u, p in self.pods.items() if p.state == "gated")
        if not gated:
            return
        pod = self.pods[gated[pick % len(gated)]]
        book = Ledger.of(self.tq())
        ask = {"cpu": Fraction(pod.cpu), "pods": Fraction(1)}
        if not ledger.gate_condition("t", "batch", ask, [book], excluding={pod.uid}).satisfied:
            return
        spend = release_decision([Release(pod.uid, f"ns/{pod.uid}", "batch", ask)], "t0")
        out = spend(book)
        assert not isinstance(out, str), "the condition and the write decide alike"

        def reserved() -> None:
            if pod.state == "gated":
                pod.state = "ungating"

        self.pending.append(Pending(self.version, book.with_reservations(out), reserved))

    def ungate(self, pick: int) -> None:
        """The gate controller removes the gate once the reservation landed."""
        ready = sorted(u for u, p in self.pods.items() if p.state == "ungating")
        if ready:
            self.pods[ready[pick % len(ready)]].state = "running"

    def finish(self, pick: int) -> None:
        running = sorted(u for u, p in self.pods.items() if p.state == "running")
        if running:
            self.pods[running[pick % len(running)]].state = "finished"

    def settle(self) -> None:
        charges = ledger.TeamCharges.of(ledger.charge_of(p.obj()) for p in self.pods.values())
        for r in Ledger.of(self.tq()).reservations:
            self.ages.setdefault(r.uid, 0.0)
        plan = quota_decide(self.tq(), charges, self.ages)
        if plan is not None:
            self.pending.append(Pending(self.version, {"status": plan.status}, lambda: None))

    # what must hold after every step

    def check(self) -> None:
        running = sum(p.cpu for p in self.pods.values() if p.state == "running")
        owed = sum(p.cpu for p in self.pods.values() if p.state in ("running", "ungating"))
        assert running <= self.limit, f"{running} cpu handed out of {self.limit}"
        held = Ledger.of(self.tq()).held("batch").get("cpu", Fraction(0))
        assert held >= owed, f"the ledger holds {held} while {owed} runs or is owed"


# (step, argument, write at once): a decision written at once still races with every
# decision left pending before it.
STEPS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "lost", "release", "ungate", "finish", "settle", "write", "age"]),
        st.integers(0, 9),
        st.booleans(),
    ),
    min_size=10,
    max_size=80,
)


@settings(max_examples=1000, deadline=None)
@given(limit=st.integers(1, 6), steps=STEPS)
def test_quota_is_never_handed_out_twice(limit: int, steps: list[tuple[str, int, bool]]) -> None:
    c = Cluster(limit)
    for op, arg, at_once in steps:
        before = len(c.pending)
        if op == "admit":
            c.admit(1 + arg % 3)
        elif op == "lost":
            c.admit(1 + arg % 3, created=False)
        elif op == "release":
            c.release(arg)
        elif op == "ungate":
            c.ungate(arg)
        elif op == "finish":
            c.finish(arg)
        elif op == "settle":
            c.settle()
        elif op == "write" and c.pending:
            c.write(c.pending[arg % len(c.pending)])
        elif op == "age":
            c.ages = {u: a + RESERVATION_TTL_SECONDS for u, a in c.ages.items()}
        if at_once and len(c.pending) > before:
            c.write(c.pending[-1])
        c.check()
