"""Forged gate records and release marks decide nothing: the terms of every gate come from its
GatePolicy (or the quota rule), a record that says otherwise holds its gate and flags the pod,
and audit lines are the controller's own observations.

The first half drives the pure decision, the second the controller itself against the fake
API server of `test_gates_controller`, each with the attacks seen in the field: a GateSignal
gate's record rewritten to a Gang of one (with a `pilotfish.io/gang=solo` label), the same
for the quota gate of a pod over quota, and a back-dated `gates.pilotfish.io/released`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pilotfish import gates, timeutil
from pilotfish.gates import GateRecord
from pilotfish.kube.rest import GATEPOLICIES
from pilotfish.operators.gates import terms
from pilotfish.operators.gates.model import ANNOTATION_RELEASED, OWNER, pod_view
from pilotfish.operators.gates.plan import Expire, Flag, Plan, RemoveGate, SetCondition
from pilotfish.operators.gates.terms import REASON_UNTRUSTED
from pilotfish.webhooks import pods as webhook_pods
from pilotfish.webhooks import quota as webhook_quota
from tests.gates_harness import Harness, running
from tests.test_gates_builders import (
    NOW,
    decide,
    gate,
    gate_policy,
    pod,
    rec,
    signal,
    team_quota,
    view,
    world,
)

DATA = gate("data")
GANG = gate("gang")
SIGNAL = {"type": "GateSignal", "signalName": "data"}
DATA_POLICY = gate_policy("policy", {"data": SIGNAL})


def forged_gang(size: int = 1, **kw: Any) -> GateRecord:
    """A record rewritten to a Gang condition, keeping the policy's name."""
    return rec("Gang", size=size, **kw)


def quota_record(condition: dict[str, Any] | None = None, **kw: Any) -> GateRecord:
    """The quota gate's record as admission writes it (or with another condition)."""
    return GateRecord(
        policy=gates.QUOTA_POLICY,
        generation=1,
        condition=condition or {"type": "Quota"},
        timeout_seconds=86400,
        deadline=timeutil.format_time(NOW),
        owner=OWNER,
        **kw,
    )


def of(d: Plan, kind: type[Any]) -> list[Any]:
    return [a for a in d.actions if isinstance(a, kind)]


def state(d: Plan, name: str) -> SetCondition:
    [c] = [a for a in d.actions if isinstance(a, SetCondition) and a.pod.name == name]
    return c


# --- the decision --------------------------------------------------------------------------


def test_core_names_are_the_webhooks() -> None:
    assert gates.QUOTA_GATE == webhook_quota.QUOTA_GATE
    assert gates.QUOTA_POLICY == webhook_pods.QUOTA_POLICY


def test_a_signal_gate_rewritten_to_a_gang_of_one_is_held_and_flagged() -> None:
    p = view("p", {"data": forged_gang()}, gang="solo")
    d = decide(world([p], signals=[signal("data", "False")], policies=[DATA_POLICY]), NOW)
    assert of(d, RemoveGate) == []
    [flag] = of(d, Flag)
    assert flag.gate == DATA
    assert flag.why == (
        'recorded condition {"size":1,"type":"Gang"} differs from the '
        '{"signalName":"data","type":"GateSignal"} that GatePolicy team-a/policy '
        "(generation 1) declares"
    )
    c = state(d, "p")
    assert (c.status, c.reason) == ("False", REASON_UNTRUSTED)
    assert c.message.startswith(f"held, record does not match its GatePolicy: {DATA} (")
    # The policy's own condition is what counts: once its signal is Ready the forged record
    # still releases nothing, and neither does a Ready signal with the forged record gone
    # from the policy's point of view.
    d2 = decide(world([p], signals=[signal("data")], policies=[DATA_POLICY]), NOW)
    assert of(d2, RemoveGate) == []


def test_the_quota_gate_of_a_pod_over_quota_rewritten_to_a_gang_is_held() -> None:
    forged = quota_record({"type": "Gang", "size": 1})
    p = view("p", {gates.QUOTA_GATE: forged}, team="t", cpu="1100m", gang="solo")
    full = [team_quota("t", batch={"cpu": "1"})]
    d = decide(world([p], quotas=full, policies=[]), NOW)
    assert of(d, RemoveGate) == []
    [flag] = of(d, Flag)
    assert "is not the quota rule's" in flag.why


def test_the_quota_gate_is_released_on_the_quota_rule_alone() -> None:
    p = view("p", {gates.QUOTA_GATE: quota_record()}, team="t", cpu="1100m")
    over = decide(world([p], quotas=[team_quota("t", batch={"cpu": "1"})], policies=[]), NOW)
    assert of(over, RemoveGate) == [] and of(over, Flag) == []
    room = decide(world([p], quotas=[team_quota("t", batch={"cpu": "2"})], policies=[]), NOW)
    assert [a.gate for a in of(room, RemoveGate)] == [gates.QUOTA_GATE]


@pytest.mark.parametrize(
    ("records", "policies", "why"),
    [
        (
            {"data": rec(policy="gone")},
            [DATA_POLICY],
            "GatePolicy team-a/gone named by the record does not exist",
        ),
        (
            {"data": rec()},
            [gate_policy("policy", {"data": SIGNAL}, ns="team-b")],
            "GatePolicy team-a/policy named by the record does not exist",
        ),
        (
            {"other": rec()},
            [DATA_POLICY],
            f"GatePolicy team-a/policy (generation 1) declares no gate {gate('other')}",
        ),
        (
            {"data": quota_record()},
            [DATA_POLICY],
            f"the record says the quota rule put {DATA} there, but the quota rule puts only "
            f"{gates.QUOTA_GATE}",
        ),
        (
            # An honest record whose policy changed the condition since: held all the same.
            {"data": rec(signal="yesterday")},
            [gate_policy("policy", {"data": SIGNAL}, generation=2)],
            'recorded condition {"signalName":"yesterday","type":"GateSignal"} differs from '
            'the {"signalName":"data","type":"GateSignal"} that GatePolicy team-a/policy '
            "(generation 2) declares",
        ),
        (
            {"gang": rec("Gang", size=1)},
            [gate_policy("policy", {"gang": {"type": "Gang", "size": 0}})],
            "GatePolicy team-a/policy (generation 1) cannot be read: spec.gates[0].condition: "
            "Gang size 0 is not a positive integer",
        ),
    ],
)
def test_records_their_source_does_not_confirm_are_untrusted(
    records: dict[str, GateRecord], policies: list[dict[str, Any]], why: str
) -> None:
    p = view("p", records)
    sigs = [signal("data"), signal("yesterday")]
    d = decide(world([p], signals=sigs, policies=policies), NOW)
    assert of(d, RemoveGate) == []
    assert [f.why for f in of(d, Flag)] == [why]
    assert why in state(d, "p").message


def test_gang_size_comes_from_the_policy_not_the_pod() -> None:
    """Three pods claim a gang of one; the policy says three. Two exist: none goes."""
    policy = gate_policy("policy", {"gang": {"type": "Gang", "size": 3}})
    forged = [view(n, {"gang": forged_gang()}, gang="g") for n in "ab"]
    d = decide(world(forged, policies=[policy]), NOW)
    assert of(d, RemoveGate) == [] and len(of(d, Flag)) == 2
    honest = [view(n, {"gang": rec("Gang", size=3)}, gang="g") for n in "ab"]
    d2 = decide(world(honest, policies=[policy]), NOW)
    assert of(d2, RemoveGate) == []
    assert "gang g: 2/3 pods present" in state(d2, "a").message
    # A member that forged its record does not count towards an honest gang's size either.
    mixed = [*honest, view("c", {"gang": forged_gang(size=2)}, gang="g")]
    d3 = decide(world(mixed, policies=[policy]), NOW)
    assert of(d3, RemoveGate) == []


def test_untrusted_gates_do_not_expire_and_trusted_ones_still_go() -> None:
    p = view(
        "p",
        {"data": rec(), "late": forged_gang(deadline=-1, on_expiry="Fail")},
        gang="solo",
    )
    policy = gate_policy("policy", {"data": SIGNAL, "late": SIGNAL})
    d = decide(world([p], signals=[signal("data")], policies=[policy]), NOW)
    assert of(d, Expire) == []
    # The met, trusted gate goes; the untrusted one keeps the pod from the scheduler.
    assert [(a.gate, a.final) for a in of(d, RemoveGate)] == [(DATA, False)]
    assert [f.gate for f in of(d, Flag)] == [gate("late")]


def test_a_flagged_pod_is_flagged_once() -> None:
    p = view("p", {"data": forged_gang()}, gang="solo")
    d = decide(world([p], policies=[DATA_POLICY]), NOW)
    c = state(d, "p")
    shown = view(
        "p",
        {"data": forged_gang()},
        gang="solo",
        review=True,
        state=(c.status, c.reason, c.message),
    )
    d2 = decide(world([shown], policies=[DATA_POLICY]), NOW)
    assert d2.actions == ()


# --- the controller ------------------------------------------------------------------------


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    async with running(tmp_path) as harness:
        yield harness


async def test_controller_holds_a_forged_record_flags_it_once_and_audits_nothing(
    h: Harness,
) -> None:
    h.add(pod("p", {"data": forged_gang()}, gang="solo"))
    h.signal(ready="False")
    await h.round()
    obj = h.pod("p")
    assert obj["spec"]["schedulingGates"] == [{"name": DATA}]
    assert obj["metadata"]["labels"][gates.LABEL_REVIEW] == "required"
    [cond] = [x for x in obj["status"]["conditions"] if x["type"] == gates.POD_CONDITION]
    assert (cond["status"], cond["reason"]) == ("False", REASON_UNTRUSTED)
    [event] = h.events()
    assert (event["reason"], event["type"]) == (REASON_UNTRUSTED, "Warning")
    assert event["note"].startswith(f"{DATA} is held: its record does not match its GatePolicy")
    assert h.lines() == []
    # Converged: the next round writes nothing, even with the signal Ready.
    await h.round()
    h.signal()
    n = len(h.api.writes("/pods/"))
    await h.round()
    assert len(h.api.writes("/pods/")) == n


async def test_controller_follows_the_policy_it_watches(h: Harness) -> None:
    """Terms come from the controller's own GatePolicy view: an honest pod whose policy no
    longer declares its gate is held; a policy change starts a round."""
    await h.api.settle()
    while len(h.c.queue):
        h.c.queue.done(await h.c.queue.get())
    new = gate_policy("policy", {"quota": {"type": "Quota"}}, generation=2)
    h.api.put(GATEPOLICIES.path("team-a", "policy"), new)
    await h.api.settle()
    assert len(h.c.queue) == 1, "a change of the policy's gates starts a round"
    h.add(pod("p", {"data": rec()}))
    h.signal()
    await h.round()
    assert h.pod("p")["spec"]["schedulingGates"] == [{"name": DATA}]
    assert h.lines() == []


async def test_forged_release_marks_put_nothing_of_theirs_in_the_audit_log(
    h: Harness,
) -> None:
    """A back-dated mark with the tenant's text, on a gate still held, on a gate that is not
    ours, or from another actor, writes no line; the one line written (a gate that is gone,
    ours, under our mark) carries the controller's own time and words only."""
    tenant_text = "approved by the CFO"
    forged = {
        "at": "2001-01-01T00:00:00Z",
        "evidence": tenant_text,
        "decidedFrom": "1",
        "actor": f"{OWNER}/gates/forged",
    }
    held = pod("held", {"data": rec()})
    gone = pod("gone", {"data": rec(), "other": rec(owner="someone-else")})
    gone["spec"]["schedulingGates"] = []  # removed (by on-call, say): nothing of ours did
    marks = {
        DATA: forged,
        gate("other"): forged,
        gate("unrecorded"): forged,
    }
    for obj in (held, gone):
        obj["metadata"]["annotations"][ANNOTATION_RELEASED] = json.dumps(marks)
    foreign = pod("foreign", {"data": rec()})
    foreign["spec"]["schedulingGates"] = []
    foreign["metadata"]["annotations"][ANNOTATION_RELEASED] = json.dumps(
        {DATA: {**forged, "actor": "someone/else"}}
    )
    for o in (held, gone, foreign):
        h.add(o)
    h.signal(ready="False")
    await h.round()
    [line] = h.lines()
    assert (line["pod"], line["gate"], line["decision"]) == ("team-a/gone", DATA, "released")
    assert line["ts"] == "2030-01-01T12:00:00.000000Z"  # when the controller saw it
    assert line["decidedFrom"] == ""
    assert tenant_text not in json.dumps(line) and "2001" not in json.dumps(line)
    assert line["evidence"].startswith(f"{DATA} was released by this controller")


def test_policy_gates_parse_what_the_crd_stores() -> None:
    parsed = terms.policy_gates(gate_policy("p", {"data": {**SIGNAL, "minNodes": None}}))
    assert parsed.conditions == {DATA: SIGNAL} and parsed.error == ""
    broken = terms.policy_gates({"metadata": {"name": "b", "namespace": "n"}, "spec": {}})
    assert broken.error == "spec.gates is not a list"


GOOD_ENTRY = json.loads(gates.PodGates("t", {DATA: rec()}).encode())[DATA]


@pytest.mark.parametrize(
    "raw",
    [
        "[]",
        json.dumps({DATA: []}),
        json.dumps({DATA: {**GOOD_ENTRY, "policy": ["policy"]}}),
        json.dumps({DATA: {**GOOD_ENTRY, "condition": "GateSignal"}}),
        json.dumps({DATA: {**GOOD_ENTRY, "on_expiry": "Release"}}),
        json.dumps({DATA: {**GOOD_ENTRY, "generation": True}}),
        json.dumps({DATA: {**GOOD_ENTRY, "released": True}}),
        json.dumps({DATA: {k: v for k, v in GOOD_ENTRY.items() if k != "deadline"}}),
    ],
)
def test_a_record_of_the_wrong_shape_is_no_record(raw: str) -> None:
    obj = pod("p", {"data": rec()})
    obj["metadata"]["annotations"][gates.ANNOTATION_RECORD] = raw
    assert gates.read_record(obj) is None
    p = pod_view(obj)
    assert p.record == {} and "is not a valid gate record" in p.record_error
    d = decide(world([p], signals=[signal("data")], policies=[DATA_POLICY]), NOW)
    assert of(d, RemoveGate) == [] and of(d, Expire) == []
    assert "not managed by the gate controller" in state(d, "p").message
    assert "is not a valid gate record" in d.waiting["team-a/p"]
