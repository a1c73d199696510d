"""Sub-trees that repeat across objects are one object per process (`projections.shared`),
and sharing them changes no projection."""

from __future__ import annotations

import copy
import json
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from pilotfish import gates
from pilotfish.kube import projections
from tests.test_projections import decoded, full_pod


def service_pod(i: int, zone: str = "zone-c") -> dict[str, Any]:
    """A ServiceWorkload's pod as the API server serves it (the scale benchmark's, trimmed)."""
    ip = f"10.240.0.{i}"
    ready = {"lastProbeTime": None, "lastTransitionTime": "2026-12-06T06:22:36Z", "status": "True"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "creationTimestamp": "2026-12-06T06:22:35Z",
            "generation": 1,
            "labels": {
                "app": "web-0",
                "pilotfish.io/band": "production",
                "pilotfish.io/revision": "gphhgjvftp",
                "pilotfish.io/team": "bench",
                "pilotfish.io/workload": "web-0",
                "topology.kubernetes.io/zone": zone,
            },
            "name": f"web-0-gphhgjvftp-{i:05d}",
            "namespace": "scale-prod",
            "ownerReferences": [
                {
                    "apiVersion": "pilotfish.io/v1alpha1",
                    "blockOwnerDeletion": True,
                    "controller": True,
                    "kind": "ServiceWorkload",
                    "name": "web-0",
                    "uid": "f4733a8d-046e-4af8-8e27-656810029133",
                }
            ],
            "resourceVersion": str(2000 + i),
            "uid": f"56bc557f-1a4b-4b4f-ab65-{i:012d}",
        },
        "spec": {
            "containers": [
                {
                    "image": "example/app:1",
                    "imagePullPolicy": "IfNotPresent",
                    "name": "app",
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                    "volumeMounts": [{"mountPath": "/var/run/secrets", "name": f"token-{i}"}],
                }
            ],
            "nodeName": "kwok-zone-c-24",
            "priority": 1000000,
            "priorityClassName": "pilotfish-production",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}],
        },
        "status": {
            "conditions": [{**ready, "type": t} for t in ("Initialized", "Ready", "PodScheduled")],
            "hostIP": "10.250.0.1",
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "qosClass": "Burstable",
        },
    }


# What the projections returned before sub-trees were shared, to the key order and the types.
FULL_POD_1 = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "p-1",
        "namespace": "team-a",
        "uid": "uid-1",
        "resourceVersion": "1",
        "labels": {"pilotfish.io/band": "batch"},
        "annotations": {gates.ANNOTATION_RECORD: "{}"},
    },
    "spec": {
        "nodeName": "n1",
        "schedulingGates": [{"name": "gates.pilotfish.io/quota"}],
        "overhead": {"cpu": "10m"},
        "containers": [
            {
                "name": "app",
                "image": "example/app:1",
                "ports": [{"containerPort": 80}],
                "resources": {"requests": {"cpu": "1"}},
            }
        ],
        "initContainers": [{"name": "init", "image": "busybox"}],
        "volumes": [{"name": "v", "emptyDir": {}}],
    },
    "status": {
        "phase": "Running",
        "podIP": "10.0.0.1",
        "podIPs": [{"ip": "10.0.0.1"}],
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"},
            {
                "type": "PodScheduled",
                "status": "True",
                "lastTransitionTime": "2026-01-01T00:00:01Z",
            },
            {"type": gates.POD_CONDITION, "status": "False", "reason": "Waiting"},
        ],
    },
}
SERVICE_POD_1 = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "creationTimestamp": "2026-12-06T06:22:35Z",
        "generation": 1,
        "labels": {
            "app": "web-0",
            "pilotfish.io/band": "production",
            "pilotfish.io/revision": "gphhgjvftp",
            "pilotfish.io/team": "bench",
            "pilotfish.io/workload": "web-0",
            "topology.kubernetes.io/zone": "zone-c",
        },
        "name": "web-0-gphhgjvftp-00001",
        "namespace": "scale-prod",
        "ownerReferences": [
            {
                "apiVersion": "pilotfish.io/v1alpha1",
                "blockOwnerDeletion": True,
                "controller": True,
                "kind": "ServiceWorkload",
                "name": "web-0",
                "uid": "f4733a8d-046e-4af8-8e27-656810029133",
            }
        ],
        "resourceVersion": "2001",
        "uid": "56bc557f-1a4b-4b4f-ab65-000000000001",
    },
    "spec": {
        "nodeName": "kwok-zone-c-24",
        "priority": 1000000,
        "priorityClassName": "pilotfish-production",
        "containers": [
            {
                "name": "app",
                "image": "example/app:1",
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            }
        ],
    },
    "status": {
        "phase": "Running",
        "podIP": "10.240.0.1",
        "podIPs": [{"ip": "10.240.0.1"}],
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-06T06:22:36Z"},
            {
                "type": "PodScheduled",
                "status": "True",
                "lastTransitionTime": "2026-12-06T06:22:36Z",
            },
        ],
    },
}


def test_sharing_changes_no_projection() -> None:
    for raw, before in ((full_pod(1), FULL_POD_1), (service_pod(1), SERVICE_POD_1)):
        for _ in range(2):  # as projected first, and again from the cache
            kept = projections.pod(decoded(raw))
            assert kept == before
            assert json.dumps(kept) == json.dumps(before)  # key order, true not 1


def test_one_workloads_pods_share_what_they_repeat() -> None:
    a, b = (projections.pod(decoded(service_pod(i))) for i in (1, 2))
    for part in ("labels", "ownerReferences"):
        assert a["metadata"][part] is b["metadata"][part]
    assert a["spec"]["containers"] is b["spec"]["containers"]
    assert a["spec"]["priority"] is b["spec"]["priority"]  # 1000000: not one of Python's own
    assert a["status"]["conditions"] is b["status"]["conditions"]
    # Each kept condition is one object too, also in a list that is not the same.
    late = service_pod(3)
    late["status"]["conditions"][1]["lastTransitionTime"] = "2026-12-06T06:22:40Z"
    c = projections.pod(decoded(late))
    assert c["status"]["conditions"] != a["status"]["conditions"]
    assert c["status"]["conditions"][1] is a["status"]["conditions"][1]  # PodScheduled
    # What is one pod's own is its own; its first IP is podIP's string, not another copy.
    assert a["status"]["podIPs"] is not b["status"]["podIPs"]
    assert a["status"]["podIPs"][0]["ip"] is a["status"]["podIP"]
    # Another zone: other labels, the rest still shared.
    d = projections.pod(decoded(service_pod(4, zone="zone-a")))
    assert d["metadata"]["labels"] is not a["metadata"]["labels"]
    assert d["spec"]["containers"] is a["spec"]["containers"]

    x, y = (projections.pod(decoded(full_pod(i))) for i in (1, 2))
    for part in ("labels", "annotations"):
        assert x["metadata"][part] is y["metadata"][part]
    for part in ("containers", "initContainers", "schedulingGates", "overhead", "volumes"):
        assert x["spec"][part] is y["spec"][part]
    # Inside a shared sub-tree its parts are shared too, with other pods' other sub-trees.
    assert x["spec"]["containers"][0]["ports"] is y["spec"]["containers"][0]["ports"]


def node_obj(name: str, images: list[list[str]]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}], "providerID": f"kwok://{name}"},
        "status": {
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "images": [{"names": n, "sizeBytes": 1000} for n in images],
        },
    }


def test_nodes_share_their_machine_and_images_but_not_a_large_list_whole() -> None:
    common = [
        [f"registry.example/app-{i}:1", f"registry.example/app-{i}@sha256:{i:064x}"]
        for i in range(8)
    ]
    a = projections.node(decoded(node_obj("a", [*common, ["only-a:1"]])))
    b = projections.node(decoded(node_obj("b", [*common, ["only-b:1"]])))
    assert a["status"]["allocatable"] is b["status"]["allocatable"]
    assert a["spec"]["taints"] is b["spec"]["taints"]
    # A list of images is too long to be looked up whole (no cache entry holds a large key),
    # even one another node holds too; the images in it are, and are one object.
    twin = projections.node(decoded(node_obj("twin", [*common, ["only-a:1"]])))
    assert len(json.dumps(a["status"]["images"])) > projections._SHARED_KEY_MAX
    assert twin["status"]["images"] == a["status"]["images"]
    assert twin["status"]["images"] is not a["status"]["images"]
    assert all(x is y for x, y in zip(twin["status"]["images"], a["status"]["images"], strict=True))
    assert all(
        x is y for x, y in zip(a["status"]["images"][:8], b["status"]["images"][:8], strict=True)
    )
    assert a["status"]["images"][8] == {"names": ["only-a:1"]}


def test_the_cache_forgets_what_one_pod_alone_held() -> None:
    """A batch task's labels carry its index: one pod's own, remembered only until values
    seen since fill the cache, while what every pod repeats stays shared."""

    def task(i: int) -> dict[str, Any]:
        pod = decoded(service_pod(1))
        pod["metadata"]["labels"]["pilotfish.io/task-index"] = str(i)
        return pod

    first = projections.pod(task(0))
    for i in range(1, projections.SHARED_MAX + 1):
        projections.pod(task(i))
    assert projections._canonical.cache_info().currsize <= projections.SHARED_MAX
    again = projections.pod(task(0))
    assert again["metadata"]["labels"] == first["metadata"]["labels"]
    assert again["metadata"]["labels"] is not first["metadata"]["labels"]  # forgotten
    assert again["spec"]["containers"] is first["spec"]["containers"]


# -- whatever the pod, sharing changes nothing in what is kept ------------------------------

_WORDS = st.sampled_from(["", "a", "app", "zone-a", "0", "1", "True", "cpu"])
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)  # beyond 64 bits: not looked up
    | st.floats(allow_nan=False, allow_infinity=False)
    | _WORDS
    | st.text(max_size=12)
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_WORDS, inner, max_size=3),
    max_leaves=12,
)
_TIMES = st.sampled_from(["2026-12-06T06:22:35Z", "2026-12-06T06:22:36Z"])
_CONDITION = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            ["Ready", "PodScheduled", "DisruptionTarget", gates.POD_CONDITION, "Initialized"]
        ),
        "status": st.sampled_from(["True", "False"]),
    },
    optional={
        "reason": _WORDS,
        "message": st.text(max_size=600),
        "lastTransitionTime": _TIMES,
        "lastProbeTime": st.none(),
        "observedGeneration": st.integers(min_value=0, max_value=3) | _JSON,
    },
)
_CONTAINER = st.fixed_dictionaries(
    {"name": _WORDS},
    optional={
        "image": _WORDS,
        "ports": st.lists(st.fixed_dictionaries({"containerPort": st.integers(1, 3)}), max_size=2),
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "requests": st.dictionaries(st.sampled_from(["cpu", "memory"]), _WORDS | _JSON),
                "limits": _JSON,
            },
        ),
        "env": _JSON,
    },
)
_META = st.fixed_dictionaries(
    {"name": _WORDS, "namespace": _WORDS, "uid": _WORDS, "resourceVersion": _WORDS},
    optional={
        "labels": st.dictionaries(_WORDS, _WORDS, max_size=4),
        "annotations": st.dictionaries(
            st.sampled_from(["a", gates.ANNOTATION_RECORD, *projections._DROPPED_ANNOTATIONS]),
            st.text(max_size=600) | _WORDS,
        ),
        "ownerReferences": st.lists(
            st.fixed_dictionaries({"kind": _WORDS, "name": _WORDS, "controller": st.booleans()}),
            max_size=2,
        ),
        "finalizers": st.lists(_WORDS, max_size=2),
        "generation": st.integers(min_value=0, max_value=2**63),
        "managedFields": _JSON,
        "generateName": _WORDS,
        "deletionTimestamp": _TIMES,
        "other": _JSON,
    },
)
_SPEC = st.fixed_dictionaries(
    {},
    optional={
        "nodeName": _WORDS,
        "schedulingGates": st.lists(st.fixed_dictionaries({"name": _WORDS}), max_size=2),
        "priority": st.integers(min_value=-(2**31), max_value=2**31) | _JSON,
        "priorityClassName": _WORDS,
        "overhead": st.dictionaries(_WORDS, _WORDS) | _JSON,
        "containers": st.lists(_CONTAINER | _JSON, max_size=2),
        "initContainers": st.lists(_CONTAINER, max_size=2),
        "volumes": st.lists(
            st.fixed_dictionaries({"name": _WORDS}, optional={"emptyDir": _JSON, "secret": _JSON}),
            max_size=3,
        ),
        "tolerations": _JSON,
    },
)
_IPS = st.sampled_from(["10.0.0.1", "10.0.0.2"])
_STATUS = st.fixed_dictionaries(
    {},
    optional={
        "phase": _WORDS,
        "reason": _WORDS,
        "podIP": _IPS,
        "podIPs": st.lists(st.fixed_dictionaries({"ip": _IPS}), max_size=2) | _JSON,
        "conditions": st.lists(_CONDITION | _JSON, max_size=4),
        "containerStatuses": _JSON,
    },
)
_POD = st.fixed_dictionaries(
    {"metadata": _META, "spec": _SPEC, "status": _STATUS},
    optional={"apiVersion": st.just("v1"), "kind": st.just("Pod")},
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_POD, min_size=1, max_size=4))
def test_a_shared_projection_equals_the_unshared_one(pods: list[dict[str, Any]]) -> None:
    """Few words, two timestamps and two IPs: the pods' sub-trees collide, and some are not
    JSON the cache can key (integers beyond 64 bits)."""
    sent = [json.dumps(p) for p in pods]
    with mock.patch.object(projections, "shared", copy.deepcopy):
        alone = [projections.pod(json.loads(s)) for s in sent]
    for _ in range(2):  # each pod after the others, then all again from the cache
        together = [projections.pod(json.loads(s)) for s in sent]
        for t, a in zip(together, alone, strict=True):
            assert t == a
            assert json.dumps(t) == json.dumps(a)  # key order, true not 1, 1.0 not 1
