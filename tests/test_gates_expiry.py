"""The pure decision, after release: expiry (Fail, Retry, Review), the next wake-up, and the
State condition each pod shows."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pilotfish import gates, timeutil
from pilotfish.gates import read_record
from pilotfish.operators.gates.expiry import retry_backoff
from pilotfish.operators.gates.model import Pacing, pod_view
from pilotfish.operators.gates.plan import Action, Expire, RemoveGate, UpdateRecord, World
from tests.test_gates_builders import (
    NOW,
    at,
    condition,
    decide,
    gate,
    of,
    pod,
    rec,
    released,
    signal,
    team_quota,
    view,
    world,
)

DATA = "gates.pilotfish.io/data"
QUOTA = "gates.pilotfish.io/quota"


# --- expiry --------------------------------------------------------------------------------


def test_expiry_fail_marks_expired_then_deletes() -> None:
    p = view("p", {"data": rec(deadline=-1, timeout=30, on_expiry="Fail")})
    d = decide(world([p], signals=[signal("data", "False")]), NOW)
    [e] = of(d, Expire)
    assert (e.gate, e.action) == (DATA, "Fail")
    assert "not Ready" in e.evidence
    c = condition(d, "p")
    assert c is not None and (c.status, c.reason) == ("False", gates.STATE_EXPIRED)
    assert "timeout 30s, onExpiry Fail" in c.message and "the pod is deleted" in c.message
    assert of(d, RemoveGate) == []


def test_expiry_fail_wins_over_releasing_other_gates() -> None:
    p = view("p", {"data": rec(), "late": rec(signal="never", deadline=-1)})
    d = decide(world([p], signals=[signal("data")]), NOW)
    assert of(d, RemoveGate) == []
    assert [e.gate for e in of(d, Expire)] == [gate("late")]


def test_expiry_retry_extends_the_deadline_with_backoff() -> None:
    p = view(
        "p", {"data": rec(deadline=-1, on_expiry="Retry", initial=10, maximum=600, attempts=2)}
    )
    d = decide(world([p], signals=[signal("data", "False")]), NOW)
    [u] = of(d, UpdateRecord)
    [e] = of(d, Expire)
    new = read_record({"metadata": {"annotations": {gates.ANNOTATION_RECORD: u.record}}})
    assert new is not None
    assert new.gates[DATA].attempts == 3
    assert new.gates[DATA].deadline == timeutil.format_time(at(40))  # 10 * 2**2
    assert (e.action, e.attempts, e.next_deadline) == ("Retry", 3, new.gates[DATA].deadline)
    assert d.wake_after == 40
    assert of(d, RemoveGate) == []


def test_retry_backoff_sequence_doubles_up_to_the_cap() -> None:
    r = rec(on_expiry="Retry", initial=10, maximum=300)
    seen: list[int] = []
    p = pod_view(pod("p", {"data": r}))
    for _ in range(7):
        expired_at = timeutil.parse_time(p.record[DATA].deadline) + datetime.timedelta(seconds=1)
        d = decide(world([p], signals=[signal("data", "False")]), expired_at)
        [u] = of(d, UpdateRecord)
        nxt = read_record({"metadata": {"annotations": {gates.ANNOTATION_RECORD: u.record}}})
        assert nxt is not None
        seen.append(
            int((timeutil.parse_time(nxt.gates[DATA].deadline) - expired_at).total_seconds())
        )
        p = pod_view(pod("p", dict(nxt.gates)))
    assert seen == [10, 20, 40, 80, 160, 300, 300]
    assert retry_backoff(rec(initial=10, maximum=300, attempts=10)) == 300


def test_expiry_review_flags_once_and_keeps_the_gate() -> None:
    p = view("p", {"data": rec(deadline=-1, on_expiry="Review")})
    d = decide(world([p], signals=[signal("data", "False")]), NOW)
    assert [(e.gate, e.action) for e in of(d, Expire)] == [(DATA, "Review")]
    assert of(d, RemoveGate) == []
    c = condition(d, "p")
    assert c is not None and c.reason == gates.STATE_EXPIRED and "review" in c.message
    # Next round: the pod carries the review label: no second expiry, no wake-up for it.
    flagged = view("p", {"data": rec(deadline=-1, on_expiry="Review")}, review=True)
    d2 = decide(world([flagged], signals=[signal("data", "False")]), at(5))
    assert of(d2, Expire) == [] and d2.wake_after is None
    # A person (or the signal) may still release it: the condition is still evaluated.
    d3 = decide(world([flagged], signals=[signal("data")]), at(6))
    assert released(d3) == ["p"]


def test_quota_refused_past_the_deadline_expires() -> None:
    p = view("p", {"quota": rec("Quota", deadline=-1, on_expiry="Fail")}, team="t", cpu="5")
    d = decide(world([p], quotas=[team_quota("t", batch={"cpu": "4"})]), NOW)
    [e] = of(d, Expire)
    assert "cpu 0/4 used, pod asks 5" in e.evidence


def test_met_but_paced_does_not_expire() -> None:
    """Waiting only for our own throttling is not the condition failing."""
    pods = [view(f"p{i}", {"data": rec(deadline=-1)}, age=10 - i) for i in range(2)]
    d = decide(
        world(pods, signals=[signal("data")], pacing={"team-a": Pacing(max_in_flight=1)}), NOW
    )
    assert released(d) == ["p0"]
    assert of(d, Expire) == []


# --- wake-up -------------------------------------------------------------------------------


def test_next_wake_up_is_the_earliest_future_deadline() -> None:
    pods = [
        view("a", {"data": rec(deadline=300)}),
        view("b", {"data": rec(deadline=45), "other": rec(signal="x", deadline=900)}),
        view("c", {"data": rec(deadline=120)}),
    ]
    d = decide(world(pods, signals=[signal("data", "False")]), NOW)
    assert d.wake_after == 45


def test_no_deadline_no_wake_up() -> None:
    d = decide(world([view("p", None, node="n", phase="Running")]), NOW)
    assert d.wake_after is None


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=20))
def test_property_wake_up_is_min_of_deadlines(deadlines: list[int]) -> None:
    pods = [view(f"p{i}", {"data": rec(deadline=s)}) for i, s in enumerate(deadlines)]
    d = decide(world(pods, signals=[signal("data", "False")]), NOW)
    assert d.wake_after == min(deadlines)


# --- the State condition -------------------------------------------------------------------


def test_condition_already_correct_is_not_rewritten() -> None:
    msg = f"waiting for {DATA} (GateSignal data not Ready)"
    p = view("p", {"data": rec()}, state=("False", gates.STATE_GATED, msg))
    d = decide(world([p], signals=[signal("data", "False")]), NOW)
    assert d.actions == ()


def test_condition_keeps_its_transition_time_while_status_stays() -> None:
    p = view("p", {"data": rec()}, age=60, state=("False", gates.STATE_GATED, "older message"))
    d = decide(world([p], signals=[signal("data", "False")]), NOW)
    c = condition(d, "p")
    assert c is not None and c.last_transition_time == timeutil.format_time(at(-60))
    flipped = view("p", {"data": rec()}, age=60, state=("True", "Older", "older message"))
    d2 = decide(world([flipped], signals=[signal("data", "False")]), NOW)
    c2 = condition(d2, "p")
    assert c2 is not None and c2.last_transition_time == timeutil.format_time(NOW)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"scheduled": ("False", "Unschedulable", "0/3 nodes are available")},
        {"node": "kwok-1", "phase": "Running"},
        {"node": "kwok-1"},
        {"other_gates": ["example.com/x"]},
    ],
)
def test_released_pods_get_no_state_condition(kw: dict[str, Any]) -> None:
    """Once no Pilotfish gate is left the scheduler's PodScheduled and the pod's phase say
    what happens next: the controller writes nothing, whatever its last condition said."""
    gated = ("False", gates.STATE_GATED, f"waiting for {DATA} (GateSignal data not Ready)")
    d = decide(world([view("p", None, state=gated, **kw)]), NOW)
    assert d.actions == ()


def test_condition_of_an_older_generation_is_rewritten_once() -> None:
    """A spec change that leaves the message as it was (another owner's gate removed) still
    moves the pod's generation: the condition is written again, naming the new one."""
    msg = f"waiting for {DATA} (GateSignal data not Ready)"
    old = view("p", {"data": rec()}, state=("False", gates.STATE_GATED, msg, 1), generation=2)
    d = decide(world([old], signals=[signal("data", "False")]), NOW)
    c = condition(d, "p")
    assert c is not None and (c.reason, c.message) == (gates.STATE_GATED, msg)
    same = view("p", {"data": rec()}, state=("False", gates.STATE_GATED, msg, 2), generation=2)
    assert decide(world([same], signals=[signal("data", "False")]), NOW).actions == ()
    unsaid = view("p", {"data": rec()}, state=("False", gates.STATE_GATED, msg), generation=2)
    assert decide(world([unsaid], signals=[signal("data", "False")]), NOW).actions == (), (
        "a server that keeps no observedGeneration is not written to forever"
    )


def test_same_world_same_decision() -> None:
    """Level-triggered: deciding twice from the same view gives the same writes, so a
    duplicate event or a restart converges instead of doing something else."""
    pods = [
        view(f"p{i}", {"data": rec(), "quota": rec("Quota")}, team="t", age=i) for i in range(4)
    ]
    w: World = world(pods, signals=[signal("data")], quotas=[team_quota("t", batch={"cpu": "2"})])
    a: tuple[Action, ...] = decide(w, NOW).actions
    assert a == decide(w, NOW).actions
