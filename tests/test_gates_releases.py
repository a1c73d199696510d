"""The GateReleased summary of a round (`operators/gates/releases.py`): one per gate and
namespace, regarding the first pod in release order, naming the count and the first pods."""

from __future__ import annotations

from pilotfish.operators.gates.plan import RemoveGate
from pilotfish.operators.gates.releases import RoundReleases
from tests.test_gates_builders import rec, view

DATA = "gates.pilotfish.io/data"
QUOTA = "gates.pilotfish.io/quota"


def test_groups_by_gate_and_namespace_in_plan_order_not_commit_order() -> None:
    pods = [view(f"p{i}", {"data": rec()}) for i in range(7)]
    other = view("q", {"data": rec()}, ns="team-b")
    plan = [RemoveGate(p, DATA, "signal up", final=True) for p in [*pods, other]]
    round_ = RoundReleases.of(plan)
    for p in reversed(pods):  # answers come back in any order
        round_.add(p, f"rv-{p.name}", [RemoveGate(p, DATA, "signal up", final=True)])
    round_.add(other, "rv-q", [RemoveGate(other, DATA, "signal up", final=True)])
    a, b = round_.summaries()
    assert (a.pod.key, a.rv, a.gate) == ("team-a/p0", "rv-p0", DATA)
    assert a.note == (
        f"released {DATA} from 7 pods in one round: p0, p1, p2, p3, p4 and 2 more; signal up; "
        "7 go to the scheduler now (no Pilotfish gate left)"
    )
    assert (b.pod.key, b.note) == (
        "team-b/q",
        f"released {DATA} from pod q: signal up; no Pilotfish gate left, the pod goes to the "
        "scheduler",
    )


def test_says_when_evidence_differs_and_counts_only_the_pods_it_released() -> None:
    p0, p1 = view("p0", {"data": rec()}), view("p1", {"data": rec()})
    round_ = RoundReleases.of([RemoveGate(p0, DATA, "a", False), RemoveGate(p1, DATA, "b", True)])
    round_.add(p0, "1", [RemoveGate(p0, DATA, "a", final=False)])
    round_.add(p1, "2", [RemoveGate(p1, DATA, "b", final=True)])
    [s] = round_.summaries()
    assert s.note == (
        f"released {DATA} from 2 pods in one round: p0, p1; a (for p0; it differs for 1 of the "
        "others: audit log); 1 go to the scheduler now (no Pilotfish gate left)"
    )
    lone = RoundReleases.of([])
    lone.add(p0, "3", [RemoveGate(p0, DATA, "a", final=False), RemoveGate(p0, QUOTA, "q", True)])
    notes = [x.note for x in lone.summaries()]
    assert notes == [
        f"released {DATA} from pod p0: a",
        f"released {QUOTA} from pod p0: q; no Pilotfish gate left, the pod goes to the scheduler",
    ]
    assert RoundReleases.of([]).summaries() == []
