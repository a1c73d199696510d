"""The batch gang gate against the real control plane: admission, the gate controller and the
garbage collector.

The gang's pods here are made by hand in the shape the batch operator gives a BatchWorkload's
first `spec.gang` tasks (the gang gate, the gang label, a controller owner reference to the
workload, the batch label and attempt annotation), created by the cluster admin, next to a
real BatchWorkload that gives the gang its size. The workload is suspended and the pods carry
no task-index label, so the batch operator of the same cluster creates nothing for it and
leaves these pods alone (it only takes pods with a readable index as its tasks): what is
tested is the gate alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, Tenant, team_namespace, tenant_of, wait_until
from e2e.teams import own_team
from pilotfish import gates, names, workloads
from pilotfish.operators.gates.model import ANNOTATION_RELEASED

GANG = gates.GANG_GATE


def batch_workload(
    name: str, team: str, gang: int, completions: int | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "BatchWorkload",
        "metadata": {"name": name},
        "spec": {
            "team": team,
            "completions": completions or gang,
            "parallelism": completions or gang,
            "gang": gang,
            "suspend": True,
            "template": {"spec": {"containers": [{"name": "task", "image": "example/task:1"}]}},
        },
    }


def create_batch(env: Env, namespace: str, name: str, gang: int) -> str:
    """Create the BatchWorkload (of the namespace's team); its uid."""
    labels = k8s.CoreV1Api(env.api).read_namespace(namespace).metadata.labels or {}
    body = batch_workload(name, str(labels.get(names.LABEL_TEAM) or ""), gang)
    made = k8s.CustomObjectsApi(env.api).create_namespaced_custom_object(
        names.GROUP, names.VERSION, namespace, "batchworkloads", body
    )
    return str(made["metadata"]["uid"])


def task_pod(
    name: str, workload: str, uid: str, *, cpu: str = "100m", gated: bool = True
) -> dict[str, Any]:
    """A gang task as the batch operator creates it (without the task-index label)."""
    spec: dict[str, Any] = {
        "containers": [
            {"name": "task", "image": "example/task:1", "resources": {"requests": {"cpu": cpu}}}
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if gated:
        spec["schedulingGates"] = [{"name": GANG}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {gates.LABEL_GANG: workload, workloads.LABEL_BATCH: workload},
            "annotations": {workloads.ANNOTATION_TASK_ATTEMPT: "0"},
            "ownerReferences": [
                {
                    "apiVersion": names.API_VERSION,
                    "kind": "BatchWorkload",
                    "name": workload,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


def read(env: Env, namespace: str, name: str) -> dict[str, Any]:
    got: dict[str, Any] = env.api.sanitize_for_serialization(
        k8s.CoreV1Api(env.api).read_namespaced_pod(name, namespace)
    )
    return got


def all_released(env: Env, namespace: str, pods: list[str]) -> list[dict[str, Any]] | None:
    got = [read(env, namespace, n) for n in pods]
    return got if all(not held(p) for p in got) else None


def held(pod: dict[str, Any]) -> list[str]:
    return gates.scheduling_gates(pod)


def state(pod: dict[str, Any]) -> dict[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == gates.POD_CONDITION:
            return dict(c)
    return None


def says(env: Env, namespace: str, name: str, text: str) -> bool:
    cond = state(read(env, namespace, name))
    return cond is not None and text in str(cond.get("message") or "")


@pytest.fixture
def ns(env: Env, namespace: str) -> str:
    env.require_local()  # the gate controller runs as a host process
    return namespace


def test_a_gang_of_8_is_released_together_or_not_at_all(env: Env, ns: str) -> None:
    core = k8s.CoreV1Api(env.api)
    uid = create_batch(env, ns, "train", gang=8)
    names_ = [f"train-{i}-0" for i in range(8)]
    for n in names_[:7]:
        core.create_namespaced_pod(ns, task_pod(n, "train", uid))
    for n in names_[:7]:
        wait_until(
            f"{n} to say 7 of 8 exist",
            lambda n=n: says(env, ns, n, "gang train: 7/8 pods present"),  # type: ignore[misc]
        )
    for n in names_[:7]:
        pod = read(env, ns, n)
        assert held(pod) == [GANG], f"{n} must wait for the eighth"
        assert not pod["spec"].get("nodeName")
        record = gates.read_record(pod)
        assert record is not None and record.gates[GANG].policy == gates.GANG_POLICY
        assert record.gates[GANG].condition == {"type": "Gang", "workload": "train"}

    core.create_namespaced_pod(ns, task_pod(names_[7], "train", uid))
    pods = wait_until(
        "all 8 released",
        lambda: all_released(env, ns, names_),
    )
    marks = [gates_released(p) for p in pods]
    assert all(m["evidence"] == "gang train: 8/8 pods present, 8 ready" for m in marks), marks
    assert len({m["at"] for m in marks}) == 1, f"one round released the gang: {marks}"


def gates_released(pod: dict[str, Any]) -> dict[str, str]:
    raw = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_RELEASED) or "{}"
    entry: dict[str, str] = json.loads(raw)[GANG]
    return entry


RULE = f"gate {GANG} is the batch gang gate: only task pods of a BatchWorkload carry it"


def test_a_tenant_cannot_carry_the_gang_gate_without_the_owner(env: Env, ns: str) -> None:
    tenant = tenant_of(env, ns)
    body = task_pod("p", "train", "0000")
    del body["metadata"]["ownerReferences"]
    with pytest.raises(ApiException) as refused:
        k8s.CoreV1Api(tenant.api).create_namespaced_pod(ns, body)
    assert refused.value.status == 403
    assert RULE in str(refused.value.body)
    assert "this pod has no controller ownerReference to a BatchWorkload" in str(refused.value.body)
    unlabelled = task_pod("q", "train", "0000")
    del unlabelled["metadata"]["labels"][gates.LABEL_GANG]
    with pytest.raises(ApiException) as refused:
        k8s.CoreV1Api(tenant.api).create_namespaced_pod(ns, unlabelled)
    assert "this pod has no pilotfish.io/gang label" in str(refused.value.body)


@pytest.fixture
def other_ns(env: Env, request: pytest.FixtureRequest) -> Iterator[Tenant]:
    """A second tenant namespace (another team's), with its tenant."""
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]
    with team_namespace(env, f"e2e-gang-other-{digest}") as name:
        yield tenant_of(env, name)


def test_a_forged_owner_reference_only_harms_the_forgers_pod(
    env: Env, ns: str, other_ns: Tenant
) -> None:
    """Another namespace's tenant copies this namespace's workload name and uid into its own
    pod: owner references resolve in the pod's own namespace, so the gate controller finds
    no such workload and holds only that pod (the garbage collector then deletes it, its
    owner being absent), and this namespace's gang neither counts it nor waits for it."""
    uid = create_batch(env, ns, "train", gang=2)
    theirs = k8s.CoreV1Api(other_ns.api)
    theirs.create_namespaced_pod(other_ns.namespace, task_pod("forged", "train", uid))

    def forged_held_or_collected() -> bool:
        try:
            pod = read(env, other_ns.namespace, "forged")
        except ApiException as e:
            if e.status == 404:
                return True  # collected: its owner does not exist in its namespace
            raise
        assert held(pod) == [GANG], "never released"
        cond = state(pod)
        return cond is not None and "not found" in str(cond.get("message"))

    wait_until("the forged pod held or collected", forged_held_or_collected)
    core = k8s.CoreV1Api(env.api)
    core.create_namespaced_pod(ns, task_pod("train-0-0", "train", uid))
    wait_until("one of two", lambda: says(env, ns, "train-0-0", "gang train: 1/2 pods present"))
    assert held(read(env, ns, "train-0-0")) == [GANG]
    core.create_namespaced_pod(ns, task_pod("train-1-0", "train", uid))
    wait_until(
        "the real gang released",
        lambda: all(not held(read(env, ns, n)) for n in ("train-0-0", "train-1-0")),
    )
    assert forged_held_or_collected()


def test_a_gang_over_quota_holds_as_a_whole(env: Env, ns: str) -> None:
    """Three members of 500m against 1 CPU of batch quota: two are admitted within it, the
    third behind the quota gate; none goes until the quota fits all three."""
    custom = k8s.CustomObjectsApi(env.api)
    core = k8s.CoreV1Api(env.api)
    with own_team(env, ns) as team:
        quota = {
            "apiVersion": names.API_VERSION,
            "kind": "TeamQuota",
            "metadata": {"name": team},
            "spec": {"team": team, "bands": {"batch": {"cpu": "1"}}},
        }
        custom.create_cluster_custom_object(names.GROUP, names.VERSION, "teamquotas", quota)

        def admitted() -> bool:
            probe = {
                "metadata": {"name": "probe"},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            }
            try:
                core.create_namespaced_pod(ns, probe, dry_run="All")
            except ApiException as e:
                if e.status in (403, 500, 503):
                    return False
                raise
            return True

        wait_until("admission to see the TeamQuota", admitted, timeout=30)
        uid = create_batch(env, ns, "train", gang=3)
        members = [f"train-{i}-0" for i in range(3)]
        for n in members:
            core.create_namespaced_pod(ns, task_pod(n, "train", uid, cpu="500m"))
        assert held(read(env, ns, members[2])) == [GANG, gates.QUOTA_GATE]
        wait_until(
            "the gang held for quota",
            lambda: (
                all(state(read(env, ns, n)) is not None for n in members)
                and says(env, ns, members[0], "cpu")
            ),
        )
        assert all(held(read(env, ns, n)) for n in members), "none goes alone"
        quota_now = custom.get_cluster_custom_object(names.GROUP, names.VERSION, "teamquotas", team)
        quota_now["spec"]["bands"]["batch"]["cpu"] = "2"
        custom.replace_cluster_custom_object(
            names.GROUP, names.VERSION, "teamquotas", team, quota_now
        )
        pods = wait_until(
            "the gang released once the quota fits it",
            lambda: all_released(env, ns, members),
        )
        assert len({gates_released(p)["at"] for p in pods}) == 1
