"""Planned maintenance against the real control plane: NodeMaintenance drains at the pace the
disruption budgets allow, surges what a budget cannot spare, moves at-most-one pods without
two copies, waits for batch tasks up to their deadline, reports what blocks it, survives an
operator killed mid-drain, and uncordons what it cordoned when deleted.

Each test drains nodes of a zone of its own (`fault_zone`), its pods pinned there, while a
recorder samples its pods, nodes and NodeMaintenance every 0.5 s (`e2e.maintenance`); the
invariants are checked on every sample. Replacement pods of the rolling tests carry the
test's own scheduling gate, lifted 2 s after each appears (`GateReleaser`): a pod slow to
become Ready, so a drain that evicts faster than the budget allows shows as a sample below it.
On the local cluster the API server's audit log shows how pods left: through the Eviction
API, never a bare delete by the operator.
"""

from __future__ import annotations

import time
from typing import Any, Final

import pytest
from kubernetes import client as k8s

from benchmarks.probes import maintenance as probe
from e2e import batch, taskwatch
from e2e import maintenance as nm
from e2e.conftest import Env, Tenant, wait_until
from e2e.lostnodes import fault_zone
from e2e.test_serviceworkload import (
    GateReleaser,
    create_sw,
    ns,
    pods_of,
    ready_pods,
    template,
    wait_rolled_out,
    workload,
)
from pilotfish import names
from pilotfish.devcluster import supervisor
from pilotfish.workloads import LABEL_WORKLOAD

__all__ = ["ns"]  # the fixture: a namespace whose team may run production pods

pytestmark = [pytest.mark.e2e]

OPERATOR: Final = "pilotfish-operator"
READY_DELAY: Final = 2.0
DRAIN_TIMEOUT: Final = 240.0


def spread(zone: str, name: str, gated: bool = True) -> dict[str, Any]:
    """A template pinned to `zone`, its pods spread over the zone's nodes."""
    constraint = {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {LABEL_WORKLOAD: name}},
    }
    return template(
        gated=gated,
        nodeSelector={names.LABEL_ZONE: zone},
        topologySpreadConstraints=[constraint],
    )


def per_node(env: Env, namespace: str, name: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for p in pods_of(env, namespace, name):
        counts[p.spec.node_name] = counts.get(p.spec.node_name, 0) + 1
    return counts


def fully_drained(done: dict[str, Any], nodes: list[str]) -> None:
    states = {n: nm.node_status(done, n).get("state") for n in nodes}
    assert states == dict.fromkeys(nodes, "Drained"), nm.status(done)
    complete = nm.condition(done, "Complete")
    assert (complete.get("status"), complete.get("reason")) == ("True", "Drained"), complete
    assert nm.status(done).get("progress") == f"{len(nodes)}/{len(nodes)}"


def on_nodes(s: probe.Sample, nodes: list[str]) -> set[str]:
    """Names of the live pods on `nodes` in sample `s`."""
    return {p.key.split("/", 1)[1] for p in s.pods if p.live and p.node in nodes}


def evicted_only(audit: nm.Audit | None, namespace: str, leaving: set[str]) -> None:
    """Every pod in `leaving` went through the Eviction API, and the operator deleted no pod
    of the namespace outright (checked where the audit log is at hand: the local cluster)."""
    if audit is None:
        return
    assert audit.deleted(namespace) == []
    assert leaving <= audit.evicted(namespace), (leaving, audit.pod_writes(namespace))


def six_spread(env: Env, ns: str, zone: str) -> list[str]:
    """The 6-replica `web` (maxUnavailable 1) Ready over `zone`; the two nodes holding the
    most of its pods, each at least one."""
    strategy = {"maxSurge": 1, "maxUnavailable": 1}
    create_sw(env, ns, workload("web", ns, 6, strategy=strategy, template=spread(zone, "web")))
    wait_rolled_out(env, ns, "web", timeout=120)
    wait_until("6 Ready", lambda: len(ready_pods(env, ns, "web")) == 6, timeout=60)
    nm.wait_budget(env, ns, "web")
    placed = sorted(per_node(env, ns, "web").items(), key=lambda kv: -kv[1])
    assert len(placed) >= 2, f"the pods did not spread: {placed}"
    return [placed[0][0], placed[1][0]]


def test_two_nodes_drained_one_at_a_time_within_the_budget(env: Env, ns: str) -> None:
    zone = "e2e-maint-a"
    with (
        fault_zone(env, zone, 4),
        GateReleaser(env, ns, delay=READY_DELAY),
        nm.removed(env, "two-nodes"),
    ):
        drained = six_spread(env, ns, zone)
        audit = nm.Audit.begin(env)
        with nm.Recorder(env, ns, zone, "two-nodes").running() as rec:
            leaving = on_nodes(rec.latest(), drained)
            nm.create(env, nm.body("two-nodes", drained, maxConcurrent=1))
            done = nm.wait_phase(env, "two-nodes", "Done", timeout=DRAIN_TIMEOUT)
            wait_until("6 Ready again", lambda: len(ready_pods(env, ns, "web")) == 6, 90)
        fully_drained(done, drained)
        assert probe.budget_violations(rec.samples, {f"{ns}/web": 5}) == []
        # Seen at the floor: the drain used the budget while it was watched.
        assert probe.fewest_ready(rec.samples, f"{ns}/web") == 5
        assert probe.most_holding(rec.samples, "two-nodes") <= 1
        assert probe.most_in_flight(rec.samples) <= 1
        assert probe.pods_on(rec.latest(), drained) == 0
        assert not set(per_node(env, ns, "web")) & set(drained)
        evicted_only(audit, ns, leaving)
        rec.check_gaps()


def test_a_single_replica_service_is_surged_before_its_pod_is_evicted(env: Env, ns: str) -> None:
    zone = "e2e-maint-b"
    with (
        fault_zone(env, zone, 2) as nodes,
        GateReleaser(env, ns, delay=READY_DELAY),
        nm.removed(env, "surge"),
    ):
        create_sw(env, ns, workload("solo", ns, 1, template=spread(zone, "solo")))
        wait_rolled_out(env, ns, "solo")
        (old,) = ready_pods(env, ns, "solo")
        nm.wait_budget(env, ns, "solo")
        node = old.spec.node_name
        audit = nm.Audit.begin(env)
        with nm.Recorder(env, ns, zone, "surge").running() as rec:
            nm.create(env, nm.body("surge", [node]))
            done = nm.wait_phase(env, "surge", "Done", timeout=DRAIN_TIMEOUT)
        fully_drained(done, [node])
        key = f"{ns}/solo"
        assert probe.surge_before_eviction(rec.samples, key, f"{ns}/{old.metadata.name}") is None
        assert probe.fewest_ready(rec.samples, key) == 1
        assert probe.most_live(rec.samples, key) <= 2  # replicas + maxSurge
        wait_until("one pod again", lambda: len(pods_of(env, ns, "solo")) == 1, 60)
        assert [p.spec.node_name for p in pods_of(env, ns, "solo")] == [
            next(n for n in nodes if n != node)
        ]
        # Back to one pod by the eviction alone: the surge pod stays, nothing is deleted.
        evicted_only(audit, ns, {old.metadata.name})
        rec.check_gaps()


def guarded_pod(name: str, zone: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": "guarded"}},
        "spec": {
            "nodeSelector": {names.LABEL_ZONE: zone},
            "containers": [{"name": "c", "image": "example/app:1"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def pdb_allows(env: Env, namespace: str, name: str, allowed: int, healthy: int) -> bool:
    st = k8s.PolicyV1Api(env.api).read_namespaced_pod_disruption_budget(name, namespace).status
    return bool(st and st.disruptions_allowed == allowed and st.current_healthy == healthy)


def test_a_budget_of_zero_blocks_with_a_condition_and_an_event_until_raised(
    env: Env, namespace: str
) -> None:
    zone = "e2e-maint-c"
    core, policy = k8s.CoreV1Api(env.api), k8s.PolicyV1Api(env.api)
    pods = ["guarded-0", "guarded-1"]
    with fault_zone(env, zone, 1) as (node,), nm.removed(env, "blocked"):
        for name in pods:
            core.create_namespaced_pod(namespace, guarded_pod(name, zone))
        pdb = {
            "metadata": {"name": "guard"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "guarded"}}},
        }
        policy.create_namespaced_pod_disruption_budget(namespace, pdb)
        wait_until("the budget at 0", lambda: pdb_allows(env, namespace, "guard", 0, 2), 60)

        audit = nm.Audit.begin(env)
        nm.create(env, nm.body("blocked", [node], blockedAfterSeconds=3))

        def blocked() -> dict[str, Any] | None:
            obj = nm.get(env, "blocked")
            return obj if nm.condition(obj, "Blocked").get("status") == "True" else None

        obj = wait_until("Blocked True", blocked, timeout=60)
        cond = nm.condition(obj, "Blocked")
        budget = f"{namespace}/guard"
        assert cond["reason"] == "DrainBlocked", cond
        assert budget in cond["message"], cond
        assert any(p in cond["message"] for p in pods), cond
        blockers = nm.node_status(obj, node).get("blockers") or []
        assert {b["pod"] for b in blockers} == {f"{namespace}/{p}" for p in pods}, blockers
        assert {(b["reason"], b.get("budget")) for b in blockers} == {
            ("DisruptionBudget", budget)
        }, blockers
        assert nm.node_status(obj, node).get("podsLeft") == 2
        events = wait_until(
            "a DrainBlocked Event", lambda: nm.events_of(env, "blocked", "DrainBlocked"), 30
        )
        note = events[0].get("note") or ""
        assert "guard" in note and any(p in note for p in pods), note
        assert (
            len(
                [
                    p
                    for p in core.list_namespaced_pod(namespace).items
                    if p.metadata.deletion_timestamp is None
                ]
            )
            == 2
        )

        policy.patch_namespaced_pod_disruption_budget(
            "guard", namespace, {"spec": {"minAvailable": 0}}
        )
        done = nm.wait_phase(env, "blocked", "Done", timeout=90)
        fully_drained(done, [node])
        unblocked = nm.condition(done, "Blocked")
        assert unblocked.get("status") == "False", unblocked
        wait_until(
            "the guarded pods gone", lambda: not core.list_namespaced_pod(namespace).items, 60
        )
        evicted_only(audit, namespace, set(pods))


def epoch(pod: k8s.V1Pod) -> int:
    return int((pod.metadata.annotations or {})[names.ANNOTATION_EPOCH])


def test_an_at_most_one_pod_moves_without_ever_running_twice(env: Env, ns: str) -> None:
    zone = "e2e-maint-d"
    with fault_zone(env, zone, 2) as nodes, nm.removed(env, "fenced"):
        tpl = template(nodeSelector={names.LABEL_ZONE: zone})
        create_sw(env, ns, workload("solo", ns, 1, atMostOne=True, template=tpl))
        (old,) = wait_until("solo Ready", lambda: ready_pods(env, ns, "solo"), timeout=90)
        nm.wait_budget(env, ns, "solo")
        node = old.spec.node_name
        other = next(n for n in nodes if n != node)
        audit = nm.Audit.begin(env)
        with nm.Recorder(env, ns, zone, "fenced").running() as rec:
            nm.create(env, nm.body("fenced", [node]))
            done = nm.wait_phase(env, "fenced", "Done", timeout=DRAIN_TIMEOUT)
            (new,) = wait_until(
                "the replacement Ready", lambda: ready_pods(env, ns, "solo"), timeout=120
            )
        fully_drained(done, [node])
        assert new.metadata.name != old.metadata.name
        assert new.spec.node_name == other
        assert epoch(new) == epoch(old) + 1
        if audit is not None:  # moved by the drain's eviction, not released some other way
            assert old.metadata.name in audit.evicted(ns), audit.pod_writes(ns)
        assert probe.most_live(rec.samples, f"{ns}/solo") <= 1, [
            [p.key for p in s.live(f"{ns}/solo")]
            for s in rec.samples
            if len(s.live(f"{ns}/solo")) > 1
        ]
        rec.check_gaps()


@pytest.mark.disruptive
def test_an_operator_killed_mid_drain_resumes_within_the_budget(env: Env, ns: str) -> None:
    env.require_local()
    zone = "e2e-maint-e"
    with (
        fault_zone(env, zone, 4),
        GateReleaser(env, ns, delay=3.0),
        nm.removed(env, "crash"),
    ):
        drained = six_spread(env, ns, zone)
        audit = nm.Audit.begin(env)
        with nm.Recorder(env, ns, zone, "crash").running() as rec:
            leaving = on_nodes(rec.latest(), drained)
            before = len(leaving)
            nm.create(env, nm.body("crash", drained, maxConcurrent=1))
            wait_until(
                "a first eviction",
                lambda: (
                    any(p.terminating for p in rec.latest().pods)
                    or probe.pods_on(rec.latest(), drained) < before
                ),
                timeout=90,
                interval=0.1,
            )
            env.kill(OPERATOR)
            # Killed mid-drain: pods left to evict, and nothing can finish it meanwhile.
            assert probe.pods_on(rec.latest(), drained) > 0
            assert nm.status(nm.get(env, "crash")).get("phase") != "Done"
            port = env.host_process(OPERATOR).port
            wait_until("the operator's port free", lambda: not supervisor.port_in_use(port), 30)
            env.restart(OPERATOR)
            done = nm.wait_phase(env, "crash", "Done", timeout=DRAIN_TIMEOUT)
            wait_until("6 Ready again", lambda: len(ready_pods(env, ns, "web")) == 6, 90)
        fully_drained(done, drained)
        assert probe.budget_violations(rec.samples, {f"{ns}/web": 5}) == []
        assert probe.fewest_ready(rec.samples, f"{ns}/web") == 5
        assert probe.most_holding(rec.samples, "crash") <= 1
        assert probe.pods_on(rec.latest(), drained) == 0
        evicted_only(audit, ns, leaving)
        rec.check_gaps()


def test_deleting_the_maintenance_uncordons_only_what_it_cordoned(env: Env) -> None:
    zone = "e2e-maint-f"
    with fault_zone(env, zone, 3) as (mine, untouched, admins), nm.removed(env, "undo"):
        nm.cordon(env, admins)
        nm.create(env, nm.body("undo", [mine, admins], maxConcurrent=2))
        fully_drained(nm.wait_phase(env, "undo", "Done", timeout=90), [mine, admins])
        table = env.kubectl("get", "nm", "undo").stdout.split()
        assert table[:4] == ["NAME", "PHASE", "PROGRESS", "BLOCKED"], table
        assert table[5:9] == ["undo", "Done", "2/2", "False"], table
        assert nm.unschedulable(env, mine) and nm.unschedulable(env, admins)
        assert nm.node_annotations(env, mine).get(names.ANNOTATION_CORDONED_BY) == "undo"
        assert nm.node_annotations(env, mine).get(names.ANNOTATION_DRAINING) == "undo"
        assert names.ANNOTATION_CORDONED_BY not in nm.node_annotations(env, admins)

        nm.delete(env, "undo")
        wait_until("undo deleted (its finalizer done)", lambda: nm.gone(env, "undo"), 60)
        assert not nm.unschedulable(env, mine)
        for node in (mine, admins):
            left = {names.ANNOTATION_CORDONED_BY, names.ANNOTATION_DRAINING}
            assert not left & set(nm.node_annotations(env, node)), (
                node,
                nm.node_annotations(env, node),
            )
        assert nm.unschedulable(env, admins), "the admin's cordon was lifted"
        assert not nm.unschedulable(env, untouched)


def test_a_batch_task_is_evicted_after_its_deadline_and_not_counted_as_failed(
    env: Env, namespace: str, tenant: Tenant
) -> None:
    zone, deadline = "e2e-maint-g", 3
    body = batch.batchworkload("crunch", "e2e", 1, 1)
    body["spec"]["template"]["spec"]["nodeSelector"] = {names.LABEL_ZONE: zone}

    def outcome(index: int, attempt: int) -> batch.Outcome | None:
        return None if attempt == 0 else "succeed"  # the first runs until the drain

    with (
        fault_zone(env, zone, 2) as nodes,
        nm.removed(env, "batch"),
        batch.job(env, tenant, body, outcome) as (watch, _),
    ):

        def running() -> list[dict[str, Any]]:
            return [p for p in watch.live_pods() if taskwatch.running(p)]

        (task,) = wait_until("the task running", running, timeout=90)
        node = task["spec"]["nodeName"]
        audit = nm.Audit.begin(env)
        began = time.monotonic()
        nm.create(env, nm.body("batch", [node], batchTaskDeadlineSeconds=deadline))
        bw = batch.wait_condition(env.api, namespace, "crunch", "Complete", reason="Completed")
        done = nm.wait_phase(env, "batch", "Done", timeout=60)
    fully_drained(done, [node])
    uid = task["metadata"]["uid"]
    evicted = watch.first(uid, lambda p: bool(p["metadata"].get("deletionTimestamp")))
    assert evicted is not None, watch.history(0)
    assert evicted.at - began >= deadline, f"evicted {evicted.at - began:.1f}s into the drain"
    st = batch.status(bw)
    assert (st["succeeded"], st["failed"], st["disrupted"]) == (1, 0, 1), st
    second = [p for p in watch.of_index(0) if p["metadata"]["uid"] != uid]
    assert [p["spec"].get("nodeName") for p in second] == [next(n for n in nodes if n != node)]
    if audit is not None:
        assert task["metadata"]["name"] in audit.evicted(namespace), audit.pod_writes(namespace)
