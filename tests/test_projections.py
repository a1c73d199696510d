"""The process-wide projections keep what the controllers read, drop the rest, and intern
the strings that repeat across objects (sub-trees: `test_projection_sharing`)."""

from __future__ import annotations

import json
from typing import Any

from pilotfish import gates
from pilotfish.kube import projections


def full_pod(i: int) -> dict[str, Any]:
    cond = [
        {
            "type": t,
            "status": "True",
            "lastProbeTime": None,
            "lastTransitionTime": "2026-01-01T00:00:01Z",
        }
        for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    cond.append({"type": gates.POD_CONDITION, "status": "False", "reason": "Waiting"})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"p-{i}",
            "generateName": "p-",
            "namespace": "team-a",
            "uid": f"uid-{i}",
            "resourceVersion": str(i),
            "labels": {"pilotfish.io/band": "batch"},
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "x" * 4000,
                gates.ANNOTATION_RECORD: "{}",
            },
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {
            "nodeName": "n1",
            "schedulingGates": [{"name": "gates.pilotfish.io/quota"}],
            "containers": [
                {
                    "name": "app",
                    "image": "example/app:1",
                    "env": [{"name": "A", "value": "b" * 500}],
                    "ports": [{"containerPort": 80}],
                    "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}},
                }
            ],
            "initContainers": [{"name": "init", "image": "busybox", "resources": {}}],
            "volumes": [
                {"name": "v", "emptyDir": {"sizeLimit": "1Gi"}},
                {"name": "cfg", "configMap": {"name": "app-config", "items": []}},
            ],
            "overhead": {"cpu": "10m"},
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "podIPs": [{"ip": "10.0.0.1"}],
            "conditions": cond,
            "containerStatuses": [{"name": "app", "ready": True, "state": {"running": {}}}],
        },
    }


def decoded(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as the informer gets it: its own objects, no string shared with another's."""
    out: dict[str, Any] = json.loads(json.dumps(obj))
    return out


def test_pod_keeps_what_controllers_read_and_nothing_large() -> None:
    p = projections.pod(full_pod(1))
    meta = p["metadata"]
    assert set(meta) == {"name", "namespace", "uid", "resourceVersion", "labels", "annotations"}
    assert list(meta["annotations"]) == [gates.ANNOTATION_RECORD]
    assert p["spec"]["containers"] == [
        {
            "name": "app",
            "image": "example/app:1",
            "ports": [{"containerPort": 80}],
            "resources": {"requests": {"cpu": "1"}},
        }
    ]
    assert p["spec"]["initContainers"] == [{"name": "init", "image": "busybox"}]
    assert p["spec"]["schedulingGates"] and p["spec"]["overhead"] == {"cpu": "10m"}
    # emptyDir volumes only, and only that they are one: the drain's local-storage rule.
    assert p["spec"]["volumes"] == [{"name": "v", "emptyDir": {}}]
    assert [c["type"] for c in p["status"]["conditions"]] == [
        "Ready",
        "PodScheduled",
        gates.POD_CONDITION,
    ]
    assert "containerStatuses" not in p["status"]
    assert p["status"]["podIPs"] == [{"ip": "10.0.0.1"}]
    assert len(json.dumps(p)) < len(json.dumps(full_pod(1))) / 5


def test_repeated_strings_are_one_object_across_pods() -> None:
    a, b = (projections.pod(json.loads(json.dumps(full_pod(i)))) for i in (1, 2))
    assert a["spec"]["nodeName"] is b["spec"]["nodeName"]
    assert a["status"]["phase"] is b["status"]["phase"]
    ka = next(k for k in a["metadata"]["labels"])
    kb = next(k for k in b["metadata"]["labels"])
    assert ka is kb


def test_node_keeps_image_names_not_sizes() -> None:
    node = {
        "metadata": {"name": "n", "labels": {"topology.kubernetes.io/zone": "a"}},
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}], "podCIDR": "10.0.0.0/24"},
        "status": {
            "allocatable": {"cpu": "8"},
            "images": [{"names": ["app:1", "app@sha256:abc"], "sizeBytes": 12345}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "nodeInfo": {"kubeletVersion": "v1.36.3"},
        },
    }
    p = projections.node(node)
    assert p["status"]["images"] == [{"names": ["app:1", "app@sha256:abc"]}]
    assert set(p["status"]) == {"allocatable", "images"}
    assert p["spec"] == {"taints": [{"key": "k", "effect": "NoSchedule"}]}


def test_pod_keeps_the_disruption_target_of_a_failed_task() -> None:
    """The batch operator tells a preempted task (recreated, not counted) from a failed one."""
    pod = full_pod(3)
    pod["status"] = {
        "phase": "Failed",
        "reason": "Evicted",
        "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"},
            {"type": "ContainersReady", "status": "False"},
        ],
    }
    kept = projections.pod(pod)["status"]
    assert kept["phase"] == "Failed" and kept["reason"] == "Evicted"
    assert kept["conditions"] == [
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    ]


def test_pod_without_an_empty_dir_keeps_no_volumes() -> None:
    pod = full_pod(1)
    pod["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": "app-config"}}]
    assert "volumes" not in projections.pod(pod)["spec"]
