"""The drain planner's safety rules hold over random clusters: budgets, pods left alone,
surge-first workloads, concurrency and zones."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pilotfish import names
from pilotfish.api.nodemaintenance import NodeMaintenanceStatus
from pilotfish.operators.maintenance import decide as d
from pilotfish.operators.maintenance.budgets import budgets_of, selectors
from pilotfish.operators.maintenance.surge import surge_first
from pilotfish.workloads import LABEL_WORKLOAD
from tests.drain_planner_harness import (
    NM,
    batch_pod,
    nm,
    node,
    observed,
    pdb,
    pod,
    sw_pod,
    workload,
)

Obj = dict[str, Any]
NODES = [f"n{i}" for i in range(6)]
APPS = ["a", "b", "c"]
WORKLOADS = ["w0", "w1", "w2"]
UNAVAILABLE: list[int | str] = [0, 1, "50%"]
# Weighted towards the pods budgets and surges apply to, so collisions are common.
KINDS = (
    ["plain"] * 4 + ["sw"] * 3 + ["daemonset", "mirror", "terminal", "terminating", "batch", "amo"]
)


@st.composite
def clusters(draw: st.DrawFn) -> dict[str, Any]:
    nodes: list[Obj] = []
    for name in NODES:
        zone = draw(st.sampled_from(["z1", "z2", None]))
        state = draw(st.sampled_from(["plain", "cordoned", "ours", "other", "missing"]))
        if state == "missing":
            continue
        if state == "ours":
            nodes.append(node(name, zone=zone, unschedulable=True, draining=NM, cordoned_by=NM))
        elif state == "other":
            nodes.append(node(name, zone=zone, unschedulable=True, draining="other"))
        else:
            nodes.append(node(name, zone=zone, unschedulable=state == "cordoned"))
    # Nodes outside the maintenance hold replacements; one is another maintenance's.
    nodes += [node("spare"), node("spare-drain", unschedulable=True, draining="other")]

    pods: list[Obj] = []
    extra: list[Obj] = []
    count = draw(st.integers(0, 30))
    for i in range(count):
        on = draw(st.sampled_from([*NODES, "spare", "spare-drain"]))
        kind = draw(st.sampled_from(KINDS))
        labels = {"app": draw(st.sampled_from(APPS))}
        ready = draw(st.booleans())
        name = f"p{i}"
        if kind == "sw":
            w = draw(st.sampled_from(WORKLOADS))
            p = sw_pod(name, on, w, labels=labels, ready=ready)
        elif kind == "amo":
            p = sw_pod(name, on, "amo", labels=labels, epoch=True)
        elif kind == "batch":
            p = batch_pod(name, on)
        else:
            p = pod(
                name,
                on,
                labels=labels,
                owner="DaemonSet" if kind == "daemonset" else "ReplicaSet",
                mirror=kind == "mirror",
                phase=draw(st.sampled_from(["Succeeded", "Failed"]))
                if kind == "terminal"
                else "Running",
                terminating=kind == "terminating",
                empty_dir=kind == "plain" and draw(st.integers(0, 3)) == 0,
            )
        (extra if on.startswith("spare") else pods).append(p)

    budgets = [
        pdb(f"pdb-{app}", draw(st.integers(0, 3)), match={"app": app}, stale=draw(st.booleans()))
        for app in draw(st.lists(st.sampled_from(APPS), unique=True))
    ]
    workloads = [
        workload(
            w,
            draw(st.integers(0, 4)),
            max_surge=1,
            max_unavailable=draw(st.sampled_from(UNAVAILABLE)),
        )
        for w in WORKLOADS
    ] + [workload("amo", 1, at_most_one=True)]
    spec: dict[str, Any] = {
        "maxConcurrent": draw(st.integers(1, 3)),
        "onePerZone": draw(st.booleans()),
        "order": draw(st.sampled_from(["Given", "FewestProductionFirst"])),
        "allowLocalStorage": draw(st.booleans()),
        "batchTaskDeadlineSeconds": 100,
    }
    draining_for = {n: draw(st.floats(0, 200)) for n in NODES}
    return {
        "nm": nm(draw(st.permutations(NODES)), **spec),
        "nodes": nodes,
        "pods": pods,
        "extra": extra,
        "pdbs": budgets,
        "workloads": workloads,
        "draining_for": draining_for,
    }


def _annotation(n: Obj, key: str) -> str | None:
    value: str | None = n["metadata"]["annotations"].get(key)
    return value


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters())
def test_the_plan_keeps_every_safety_rule(cluster: dict[str, Any]) -> None:
    obs = observed(
        cluster["nm"],
        cluster["nodes"],
        cluster["pods"],
        pdbs=cluster["pdbs"],
        workloads=cluster["workloads"],
        extra_pods=cluster["extra"],
        draining_for=cluster["draining_for"],
    )
    plan = d.decide(obs)
    NodeMaintenanceStatus.model_validate(plan.status)
    spec = cluster["nm"]["spec"]
    by_uid = {p["metadata"]["uid"]: p for p in cluster["pods"]}
    evicted = [by_uid[r.uid] for r in plan.evict]
    nodes = {n["metadata"]["name"]: n for n in cluster["nodes"]}
    states = {n["name"]: n["state"] for n in plan.status["nodes"]}

    # Only live, ordinary pods, and only on nodes this maintenance drains.
    for p in evicted:
        meta = p["metadata"]
        assert p["status"]["phase"] not in ("Succeeded", "Failed")
        assert "deletionTimestamp" not in meta
        assert "kubernetes.io/config.mirror" not in meta["annotations"]
        assert all(o["kind"] != "DaemonSet" for o in meta.get("ownerReferences", []))
        assert states[p["spec"]["nodeName"]] == d.DRAINING
        if not spec["allowLocalStorage"]:
            assert "volumes" not in p["spec"]
    assert len({r.uid for r in plan.evict}) == len(plan.evict)

    # No budget gives more than it allows now (nothing while its status is stale).
    sels = selectors(cluster["pdbs"])
    spent = Counter(b for p in evicted for b in budgets_of(p, sels))
    for b in cluster["pdbs"]:
        key = f"{b['metadata']['namespace']}/{b['metadata']['name']}"
        stale = b["status"]["observedGeneration"] != b["metadata"]["generation"]
        allowed = 0 if stale else b["status"]["disruptionsAllowed"]
        assert spent[key] <= allowed

    # Surge-first workloads keep replicas Ready pods that no other maintenance may take.
    others = {n for n, o in nodes.items() if _annotation(o, names.ANNOTATION_DRAINING) == "other"}
    gone = {p["metadata"]["uid"] for p in evicted}
    for w in cluster["workloads"]:
        name, replicas = w["metadata"]["name"], w["spec"]["replicas"]
        mine = [p for p in evicted if p["metadata"]["labels"].get(LABEL_WORKLOAD) == name]
        if not mine or not surge_first(w):
            continue
        staying = [
            p
            for p in [*cluster["pods"], *cluster["extra"]]
            if p["metadata"]["labels"].get(LABEL_WORKLOAD) == name
            and p["status"]["conditions"][0]["status"] == "True"
            and "deletionTimestamp" not in p["metadata"]
            and p["metadata"]["uid"] not in gone
            and p["spec"]["nodeName"] not in others
        ]
        assert len(staying) >= replicas
        if replicas == 1:
            # The literal rule for a single replica: its replacement is Ready off draining
            # nodes (or on one of this maintenance's, where it is counted and held in turn).
            assert staying

    # Concurrency and zones: new nodes start only into free slots, one per zone.
    def ours(n: str) -> bool:
        return _annotation(nodes[n], names.ANNOTATION_DRAINING) == NM

    before = [n for n in spec["nodes"] if n in nodes and ours(n) and states[n] == d.DRAINING]
    started = [c.node for c in plan.cordon if not ours(c.node)]
    active = [n for n, s in states.items() if s in (d.DRAINING, d.CORDONED)]
    assert len(active) <= max(spec["maxConcurrent"], len(before))
    if started:
        assert len(active) <= spec["maxConcurrent"]
    if spec["onePerZone"]:
        zones = [nodes[n]["metadata"]["labels"].get(names.LABEL_ZONE) for n in started]
        held = {nodes[n]["metadata"]["labels"].get(names.LABEL_ZONE) for n in before}
        assert len(zones) == len(set(zones)) and not (set(zones) & held)

    # Nodes held by another maintenance are never touched.
    for n in others:
        assert n not in {c.node for c in plan.cordon}
        assert states.get(n, d.PENDING) == d.PENDING
    # A cordon lifts nobody else's: cordoned-by is set only where the node was not cordoned
    # or this maintenance had cordoned it.
    for c in plan.cordon:
        if c.set_unschedulable:
            n = nodes[c.node]
            assert not n["spec"].get("unschedulable") or (
                _annotation(n, names.ANNOTATION_CORDONED_BY) == NM
            )
