"""Small builders of gated pods and the objects their gates wait on, for the gate tests.

Pods are built as raw dicts, the way the API server sends them, and parsed with the
controller's own `pod_view`, so every decision test also exercises the parsing. GatePolicies
too (`gate_policy`, parsed with `terms.policy_gates`); a `world` given no policies gets the
honest ones, which declare exactly what its pods' records say. The tests at the bottom pin
the builders themselves: a builder that silently built something else would make every test
that uses it meaningless.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

import pytest

from pilotfish import gates, names, timeutil
from pilotfish.gates import GateRecord, OnExpiry, PodGates
from pilotfish.operators.gates import decide as round_
from pilotfish.operators.gates.model import (
    OWNER,
    NodeView,
    Pacing,
    PodView,
    QuotaView,
    SignalView,
    batch_view,
    pod_view,
    quota_view,
)
from pilotfish.operators.gates.pacing import Bucket
from pilotfish.operators.gates.plan import Plan, RemoveGate, SetCondition, World
from pilotfish.operators.gates.terms import PolicyGates, policy_gates, verified, wire

NOW = datetime.datetime(2030, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
NS = "team-a"


def at(seconds: float) -> datetime.datetime:
    return NOW + datetime.timedelta(seconds=seconds)


def mono(t: datetime.datetime) -> float:
    """The monotonic instant of wall time `t`: the tests' two clocks move together, NOW at 0."""
    return (t - NOW).total_seconds()


def decide(w: World, now: datetime.datetime) -> Plan:
    """One round at wall time `now` (and its monotonic twin)."""
    return round_.decide(w, now, mono(now))


def ts(seconds: float) -> str:
    return timeutil.format_time(at(seconds))


def rec(
    kind: str = "GateSignal",
    *,
    signal: str = "data",
    size: int | None = None,
    min_nodes: int | None = None,
    timeout: int = 600,
    deadline: float | None = None,
    on_expiry: OnExpiry = "Fail",
    attempts: int = 0,
    initial: int = 10,
    maximum: int = 600,
    owner: str = OWNER,
    policy: str = "policy",
) -> GateRecord:
    """One gate's record; `deadline` in seconds from NOW (default: `timeout` from NOW)."""
    condition: dict[str, Any] = {"type": kind}
    if kind == "GateSignal":
        condition["signalName"] = signal
    if kind == "Gang":
        condition["size"] = size or 2
    if kind == "Image" and min_nodes is not None:
        condition["minNodes"] = min_nodes
    return GateRecord(
        policy=policy,
        generation=1,
        condition=condition,
        timeout_seconds=timeout,
        deadline=ts(timeout if deadline is None else deadline),
        on_expiry=on_expiry,
        initial_backoff_seconds=initial,
        max_backoff_seconds=maximum,
        attempts=attempts,
        owner=owner,
    )


def gate(name: str) -> str:
    return name if "/" in name else f"{names.GATE_PREFIX}{name}"


def pod(
    name: str,
    gated: Mapping[str, GateRecord] | None = None,
    *,
    ns: str = NS,
    other_gates: Iterable[str] = (),
    unrecorded: Iterable[str] = (),
    priority: int = 0,
    age: float = 0.0,
    team: str | None = None,
    band: str | None = None,
    gang: str | None = None,
    cpu: str | None = "1",
    memory: str | None = None,
    images: Iterable[str] = ("registry.example/app:1",),
    node: str = "",
    phase: str = "Pending",
    deleting: bool = False,
    state: tuple[str, str, str] | tuple[str, str, str, int] | None = None,
    scheduled: tuple[str, str, str] | None = None,
    review: bool = False,
    rv: str = "10",
    owner: tuple[str, str] | None = None,
    generation: int | None = None,
) -> dict[str, Any]:
    """A raw gated pod. `gated` maps gate names (short names get the Pilotfish prefix) to
    records; `unrecorded` are Pilotfish gates without a record; `age` is seconds old."""
    records = {gate(k): v for k, v in (gated or {}).items()}
    # `owner`: (name, uid) of the BatchWorkload that is the pod's controller.
    labels = {gates.LABEL_GATED: "true"}
    if team:
        labels[names.LABEL_TEAM] = team
    if band:
        labels[names.LABEL_BAND] = band
    if gang:
        labels[gates.LABEL_GANG] = gang
    if review:
        labels[gates.LABEL_REVIEW] = "required"
    created = timeutil.format_time(at(-age))
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    conditions = []
    if state:
        shown: dict[str, Any] = {
            "type": gates.POD_CONDITION,
            "status": state[0],
            "reason": state[1],
            "message": state[2],
            "lastTransitionTime": ts(-age),
        }
        if len(state) == 4:  # the generation it describes
            shown["observedGeneration"] = state[3]
        conditions.append(shown)
    if scheduled:
        conditions.append(
            {"type": "PodScheduled", "status": scheduled[0], "reason": scheduled[1]}
            | {"message": scheduled[2]}
        )
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "uid": f"uid-{name}",
        "resourceVersion": rv,
        "creationTimestamp": created,
        "labels": labels,
        "annotations": {
            gates.ANNOTATION_CREATED: created,
            gates.ANNOTATION_RECORD: PodGates(created, records).encode(),
        },
    }
    if deleting:
        meta["deletionTimestamp"] = ts(0)
    if generation is not None:
        meta["generation"] = generation
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": names.API_VERSION,
                "kind": "BatchWorkload",
                "name": owner[0],
                "uid": owner[1],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    spec: dict[str, Any] = {
        "containers": [
            {"name": f"c{i}", "image": img, "resources": {"requests": requests}}
            for i, img in enumerate(images)
        ]
        or [{"name": "c", "image": "x", "resources": {"requests": requests}}],
        "priority": priority,
    }
    held = [*records, *(gate(g) for g in unrecorded), *other_gates]
    if held:
        spec["schedulingGates"] = [{"name": g} for g in held]
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase, "conditions": conditions}}


def view(name: str, gated: Mapping[str, GateRecord] | None = None, **kw: Any) -> PodView:
    return pod_view(pod(name, gated, **kw))


def team_quota(
    team: str,
    name: str | None = None,
    *,
    used: Mapping[str, Mapping[str, Any]] | None = None,
    reservations: Iterable[Mapping[str, Any]] = (),
    **bands: Mapping[str, Any],
) -> QuotaView:
    """A TeamQuota, read as its quota ledger: `bands` its limits (band keyword best_effort
    stands for best-effort), `used` what the quota controller counted per band (wire form),
    `reservations` the room handed out to pods not counted yet."""
    spec_bands = {k.replace("_", "-"): dict(v) for k, v in bands.items()}
    status: dict[str, Any] = {"used": dict(used or {}), "reservations": list(reservations)}
    return quota_view(
        {
            "metadata": {"name": name or team},
            "spec": {"team": team, "bands": spec_bands},
            "status": status,
        }
    )


def reservation(uid: str, band: str = "batch", **resources: Any) -> dict[str, Any]:
    """A reservation in a TeamQuota's status, as admission or a release writes it."""
    return {"pod": f"{NS}/{uid}", "uid": uid, "band": band, "resources": resources, "time": ts(0)}


def signal(name: str, ready: str = "True", ns: str = NS) -> SignalView:
    return SignalView(ns, name, ready, resource_version="42", transition_time=ts(-5))


def gate_policy(
    name: str, gates_: Mapping[str, Mapping[str, Any]], ns: str = NS, generation: int = 1
) -> dict[str, Any]:
    """A raw GatePolicy declaring `gates_` (short names get the Pilotfish prefix) -> condition."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": "GatePolicy",
        "metadata": {"name": name, "namespace": ns, "generation": generation},
        "spec": {
            "selector": {},
            "gates": [
                {"name": gate(g), "condition": dict(c), "timeoutSeconds": 600}
                for g, c in gates_.items()
            ],
        },
    }


def honest_policies(pods: Iterable[PodView]) -> dict[tuple[str, str], PolicyGates]:
    """The GatePolicies that put the pods' records there: each declares exactly the recorded
    conditions. Two records of one policy's gate with different conditions are a mistake
    in the test (no policy declares both), so they raise."""
    declared: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for p in pods:
        for g, r in p.record.items():
            if r.policy in (gates.QUOTA_POLICY, gates.GANG_POLICY):
                continue
            mine = declared.setdefault((p.namespace, r.policy), {})
            cond = wire(r.condition)
            if mine.setdefault(g, cond) != cond:
                raise AssertionError(f"policy {r.policy}: {g} recorded as {mine[g]} and {cond}")
    return {
        key: policy_gates(gate_policy(key[1], conds, ns=key[0])) for key, conds in declared.items()
    }


def world(
    pods: Iterable[PodView],
    *,
    signals: Iterable[SignalView] | None = (),
    quotas: Iterable[QuotaView] = (),
    nodes: Iterable[NodeView] = (),
    pacing: Mapping[str, Pacing] | None = None,
    buckets: Mapping[str, Bucket] | None = None,
    namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
    policies: Iterable[dict[str, Any]] | None = None,
    batches: Iterable[dict[str, Any]] = (),
) -> World:
    """`policies`: raw GatePolicies; None: the honest ones (`honest_policies`); `batches`:
    raw BatchWorkloads."""
    pods = list(pods)
    index = (
        honest_policies(pods)
        if policies is None
        else {(v.namespace, v.name): v for v in map(policy_gates, policies)}
    )
    return World(
        pods=pods,
        namespace_labels=dict(namespace_labels or {}),
        signals=None if signals is None else {(s.namespace, s.name): s for s in signals},
        quotas=list(quotas),
        nodes=list(nodes),
        pacing=dict(pacing or {}),
        buckets=dict(buckets or {}),
        policies=index,
        batches={(b.namespace, b.name): b for b in map(batch_view, batches)},
    )


# --- reading a plan -----------------------------------------------------------------------


def of(d: Plan, kind: type[Any]) -> list[Any]:
    return [a for a in d.actions if isinstance(a, kind)]


def removed(d: Plan) -> list[tuple[str, str]]:
    return sorted((a.pod.name, a.gate) for a in of(d, RemoveGate))


def released(d: Plan) -> list[str]:
    return sorted({a.pod.name for a in of(d, RemoveGate) if a.final})


def condition(d: Plan, name: str) -> SetCondition | None:
    found = [a for a in of(d, SetCondition) if a.pod.name == name]
    assert len(found) <= 1
    return found[0] if found else None


# --- the builders build what they say ----------------------------------------------------


def test_pod_builder_round_trips_through_the_controllers_parser() -> None:
    v = view(
        "p",
        {"data": rec(), "quota": rec("Quota")},
        unrecorded=["stray"],
        other_gates=["example.com/other"],
        priority=7,
        age=30,
        team="payments",
        band="production",
        gang="g1",
        cpu="500m",
        memory="1Gi",
    )
    assert v.key == f"{NS}/p"
    assert v.scheduling_gates == (
        "gates.pilotfish.io/data",
        "gates.pilotfish.io/quota",
        "gates.pilotfish.io/stray",
        "example.com/other",
    )
    assert v.pilotfish_gates == v.scheduling_gates[:3]
    assert not v.managed("gates.pilotfish.io/data"), "nothing is managed before verification"
    checked = verified(v, honest_policies([v]))
    assert checked.managed("gates.pilotfish.io/data")
    assert not checked.managed("gates.pilotfish.io/stray")
    assert checked.terms["gates.pilotfish.io/quota"] == {"type": "Quota"}
    assert v.priority == 7 and v.created == at(-30) and v.band == "production"
    assert v.gang == "g1" and v.labels[names.LABEL_TEAM] == "payments"
    assert str(v.requests["cpu"]) == "1/2" and v.requests["memory"] == 2**30
    assert v.deadline("gates.pilotfish.io/data") == at(600)


def test_record_owned_by_someone_else_is_not_managed() -> None:
    v = view("p", {"data": rec(owner="someone-else")})
    checked = verified(v, honest_policies([v]))
    assert not checked.managed("gates.pilotfish.io/data")
    assert checked.untrusted == {}, "another owner's gate is theirs, not a forgery"


def test_honest_policies_declare_what_the_records_say() -> None:
    pods = [view("a", {"data": rec(), "gang": rec("Gang", size=3)}), view("b", {"data": rec()})]
    [(key, policy)] = honest_policies(pods).items()
    assert key == (NS, "policy")
    assert policy.conditions == {
        "gates.pilotfish.io/data": {"type": "GateSignal", "signalName": "data"},
        "gates.pilotfish.io/gang": {"type": "Gang", "size": 3},
    }
    with pytest.raises(AssertionError, match="recorded as"):
        honest_policies([*pods, view("c", {"data": rec(signal="other")})])


def test_team_quota_builder_maps_bands() -> None:
    q = team_quota("t", batch={"cpu": "2"}, best_effort={"pods": 3})
    assert q.limits["batch"] == {"cpu": Fraction(2)}
    assert q.limits["best-effort"] == {"pods": Fraction(3)}
    assert q.limits["production"] is None
