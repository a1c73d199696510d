"""Reclaim in e2e tests: kwok nodes of a test module's own, production that uses less than it
asks, and the batch figures the reclaim controller writes onto nodes.

`reclaim_nodes` adds kwok nodes of a small machine class (8 cores, 40 GiB: round numbers
for the arithmetic) tainted `e2e.pilotfish.io/reclaim=true:NoSchedule`, so that only pods
tolerating it (`pinned`) land there and the rest of the suite's pods never change what is
measured on them. kwok reports a pod's usage from its `kwok.x-k8s.io/usage-cpu` and
`usage-memory` annotations (per container; the pods here have one), and Prometheus scrapes
it; a test changes a running pod's usage by changing the annotation (`set_usage`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any, Final

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from benchmarks.probes import reclaim as probe
from e2e.conftest import Env, wait_until
from e2e.lostnodes import fault_zone
from pilotfish import names
from pilotfish.devcluster.kwokusage import ANNOTATION_USAGE_CPU, ANNOTATION_USAGE_MEMORY
from pilotfish.workloads import LABEL_BATCH

GI: Final = 1024**3
CAPACITY: Final = {"cpu": "8", "memory": "40Gi", "pods": "110", "ephemeral-storage": "100Gi"}
CPU_MILLI: Final = 8000
MEMORY_BYTES: Final = 40 * GI
TAINT_KEY: Final = "e2e.pilotfish.io/reclaim"
TAINT: Final = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}
TOLERATION: Final = {"key": TAINT_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}


def pinned(node: str) -> dict[str, Any]:
    """Pod spec fields that put a pod on `node`, and only there."""
    return {"nodeSelector": {"kubernetes.io/hostname": node}, "tolerations": [dict(TOLERATION)]}


def usage(cpu: str, memory: str) -> dict[str, str]:
    """The annotations kwok reads a pod's usage from."""
    return {ANNOTATION_USAGE_CPU: cpu, ANNOTATION_USAGE_MEMORY: memory}


@contextlib.contextmanager
def reclaim_nodes(env: Env, zone: str, count: int) -> Iterator[list[str]]:
    """`count` fresh tainted kwok nodes of `CAPACITY` in `zone`, Ready and renewing their
    leases; deleted afterwards with whatever pods are left on them."""
    with fault_zone(env, zone, count, CAPACITY, [TAINT]) as created:
        yield created


def enable(env: Env, namespace: str) -> None:
    """Label `namespace` `pilotfish.io/reclaim=enabled` (as the platform would) and wait
    until the webhook translates a batch pod there: it reads namespaces from a cache."""
    core = k8s.CoreV1Api(env.api)
    core.patch_namespace(namespace, {"metadata": {"labels": {names.LABEL_RECLAIM: "enabled"}}})
    probe_pod = {
        "metadata": {"name": "reclaim-probe", "labels": {names.LABEL_BAND: "batch"}},
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]
        },
    }

    def translated() -> bool:
        made = core.create_namespaced_pod(namespace, probe_pod, dry_run="All")
        requests = made.spec.containers[0].resources.requests or {}
        return names.BATCH_CPU in requests

    wait_until(f"the webhook translating batch pods in {namespace}", translated, timeout=30)


def raw_node(env: Env, node: str) -> dict[str, Any]:
    resp = k8s.CoreV1Api(env.api).read_node(node, _preload_content=False)
    obj: dict[str, Any] = json.loads(resp.data)
    return obj


def figure(env: Env, node: str) -> probe.NodeFigure:
    return probe.node_figure(raw_node(env, node))


def wait_figure(
    env: Env,
    node: str,
    what: str,
    check: Callable[[probe.NodeFigure], bool],
    timeout: float,
) -> probe.NodeFigure:
    """The node's figure once `check` holds; the figure it had at the deadline is part of
    the failure."""
    try:
        return wait_until(
            f"{node}: {what}",
            lambda: f if check(f := figure(env, node)) else None,
            timeout=timeout,
            interval=1.0,
        )
    except AssertionError as e:
        raise AssertionError(f"{e}; figure now {figure(env, node)}") from None


def raw_pods(env: Env, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    resp = k8s.CoreV1Api(env.api).list_namespaced_pod(
        namespace, label_selector=selector, _preload_content=False
    )
    items: list[dict[str, Any]] = json.loads(resp.data)["items"]
    return items


def set_usage(env: Env, namespace: str, pod: str, cpu: str) -> None:
    """Change a running pod's cpu usage, as its load would (kwok reads the annotation)."""
    body = {"metadata": {"annotations": {ANNOTATION_USAGE_CPU: cpu}}}
    k8s.CoreV1Api(env.api).patch_namespaced_pod(pod, namespace, body)


def node_events(env: Env, node: str, reason: str) -> list[dict[str, Any]]:
    """events.k8s.io/v1 Events about the node with `reason`, in any namespace. Read raw:
    the client's models refuse Events other components write without an eventTime."""
    resp = k8s.EventsV1Api(env.api).list_event_for_all_namespaces(_preload_content=False)
    return [
        e
        for e in json.loads(resp.data)["items"]
        if e.get("reason") == reason
        and (e.get("regarding") or {}).get("kind") == "Node"
        and (e.get("regarding") or {}).get("name") == node
    ]


def stop_job(env: Env, namespace: str, name: str) -> None:
    """Suspend a BatchWorkload (its operator deletes its pods), wait until none is left
    bound, then delete it: a job left running would hold batch capacity into the next
    test."""
    api = k8s.CustomObjectsApi(env.api)
    try:
        api.patch_namespaced_custom_object(
            names.GROUP,
            names.VERSION,
            namespace,
            "batchworkloads",
            name,
            {"spec": {"suspend": True}},
        )
    except ApiException as e:
        if e.status == 404:
            return
        raise
    wait_until(
        f"no live pods of {name}",
        lambda: not [p for p in raw_pods(env, namespace, f"{LABEL_BATCH}={name}") if probe.live(p)],
        timeout=60,
    )
    with contextlib.suppress(ApiException):
        api.delete_namespaced_custom_object(
            names.GROUP, names.VERSION, namespace, "batchworkloads", name
        )
