"""Machines that go silent, for the failure tests: kwok plays each fake node's kubelet only
while the node carries `pilotfish.io/fake-node=true` (its managed-node selector), so changing
that label stops the node's lease renewals and its pod updates, as a dead or cut-off machine
would; setting it back lets the node return (kwok renews the lease again, reports Ready and
removes the pods the store no longer lists for it).

`fault_zone` adds fake nodes in a zone of the test's own, so a test silences machines without
touching the nodes the rest of the suite schedules onto; pods pinned to that zone (a
nodeSelector on `topology.kubernetes.io/zone`) land only there.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping, Sequence

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, wait_until
from pilotfish import names
from pilotfish.devcluster import nodes

MANAGED: str = "true"
SILENT: str = "silent"


def _set_managed(env: Env, node: str, value: str) -> None:
    k8s.CoreV1Api(env.api).patch_node(
        node, {"metadata": {"labels": {names.LABEL_FAKE_NODE: value}}}
    )


def silence(env: Env, node: str) -> None:
    """The node's agent stops: no more lease renewals, no more pod updates."""
    _set_managed(env, node, SILENT)


def restore(env: Env, node: str) -> None:
    """The node's agent is back: its lease renews again."""
    _set_managed(env, node, MANAGED)


def ready(env: Env, node: str) -> bool:
    obj = k8s.CoreV1Api(env.api).read_node(node)
    return any(c.type == "Ready" and c.status == "True" for c in (obj.status.conditions or []))


def lease_renew_time(env: Env, node: str) -> object:
    lease = k8s.CoordinationV1Api(env.api).read_namespaced_lease(node, "kube-node-lease")
    return lease.spec.renew_time


@contextlib.contextmanager
def fault_zone(
    env: Env,
    zone: str,
    count: int,
    capacity: dict[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
) -> Iterator[list[str]]:
    """`count` fresh kwok nodes in `zone` (of `capacity`, with `taints`), Ready and renewing
    their leases; deleted (with whatever pods are left on them) afterwards."""
    core = k8s.CoreV1Api(env.api)
    created = []
    for i in range(count):
        body = nodes.fake_node(zone, i, capacity)
        if taints:
            body["spec"]["taints"] = [dict(t) for t in taints]
        name = body["metadata"]["name"]
        try:
            core.create_node(body)
        except ApiException as e:
            if e.status != 409:
                raise
            restore(env, name)
        created.append(name)
    try:
        for name in created:
            wait_until(f"{name} Ready", functools.partial(ready, env, name), timeout=60)
            wait_until(f"{name} lease", functools.partial(lease_renew_time, env, name), timeout=60)
        yield created
    finally:
        for name in created:
            pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}")
            for pod in pods.items:
                with contextlib.suppress(ApiException):
                    core.delete_namespaced_pod(
                        pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0
                    )
            with contextlib.suppress(ApiException):
                core.delete_node(name)
