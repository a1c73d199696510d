"""Driving the real node lifecycle controller on the in-memory API with a fake clock.

Leases are not written: the test tells the process's silence tracker what it saw
(`renew`), as the kube-node-lease informer would, and moves the fake clock. `sweep`
reconciles every node until a round changes nothing in the API, so a test reads the state
the controller converges to at each instant. Pods carry a finalizer standing for the
kubelet: a deleted pod stays Terminating, as it does on a silent node.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY

from pilotfish import names
from pilotfish.kube.rest import NODES, PODS
from pilotfish.kube.runtime import Runtime
from pilotfish.kube.workqueue import Result
from pilotfish.nodesilence import SilenceSettings
from pilotfish.operators.nodelifecycle import NodeLifecycleController
from pilotfish.timeutil import FakeClock
from tests.fakeapi import FakeApi

Obj = dict[str, Any]
KUBELET = "test.pilotfish.io/kubelet"
NS = "ns"
_renewals = itertools.count(1)


def node(name: str, zone: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {names.LABEL_ZONE: zone}},
        "spec": {},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": "MemoryPressure", "status": "False"},
            ]
        },
    }


def pod(name: str, on: str, *, kind: str = "ReplicaSet", **annotations: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "annotations": dict(annotations),
            "finalizers": [KUBELET],
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "u", "controller": True}
            ],
        },
        "spec": {"nodeName": on, "containers": [{"name": "c", "image": "i"}]},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "True"},
            ],
        },
    }


def metric(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


@dataclass
class Cluster:
    api: FakeApi
    clock: FakeClock
    rt: Runtime
    ctrl: NodeLifecycleController
    informers: asyncio.Task[None]
    results: dict[str, Result] = field(default_factory=dict)

    # the cluster's side ------------------------------------------------------------------

    def add_node(self, name: str, zone: str) -> None:
        self.api.put(NODES.path(name=name), node(name, zone))

    def add_pod(self, name: str, on: str, **kw: Any) -> None:
        self.api.put(PODS.path(NS, name), pod(name, on, **kw))

    def renew(self, *nodes: str) -> None:
        for n in nodes:
            r = str(next(_renewals))
            self.rt.silence.observe(n, (r, r))

    def node(self, name: str) -> Obj:
        found = self.api.obj(NODES.path(name=name))
        assert found is not None
        return found

    def pod(self, name: str) -> Obj:
        found = self.api.obj(PODS.path(NS, name))
        assert found is not None
        return found

    def ready(self, obj: Obj) -> tuple[str, str]:
        for c in obj["status"].get("conditions") or []:
            if c["type"] == "Ready":
                return c["status"], c.get("reason", "")
        raise AssertionError(f"no Ready condition in {obj['status']}")

    def taints(self, name: str) -> list[tuple[str, str]]:
        return [(t["key"], t["effect"]) for t in self.node(name)["spec"].get("taints") or []]

    def evicted(self, name: str) -> bool:
        return bool(self.pod(name)["metadata"].get("deletionTimestamp"))

    def node_writes(self) -> int:
        return len(self.api.writes("/nodes")) + len(self.api.writes("/pods"))

    async def events(self, reason: str) -> list[Obj]:
        await self.rt.events.flush()
        found = self.api.store("events.k8s.io/v1", "events").values()
        return [e for e in found if e["reason"] == reason]

    # the controller's side ---------------------------------------------------------------

    def snapshot(self) -> str:
        kept = {"/".join(k): v for k, v in self.api.objects.items() if k[1] != "events"}
        return json.dumps(kept, sort_keys=True)

    async def sweep(self, rounds: int = 10) -> None:
        """Reconcile every node until a round changes nothing."""
        for _ in range(rounds):
            before = self.snapshot()
            await self.api.settle()
            for name in sorted(self.api.store("v1", "nodes")):
                self.results[name] = await self.ctrl.reconcile(name)
            await self.api.settle()
            if self.snapshot() == before:
                return
        raise AssertionError("the controller kept writing")

    async def at(self, seconds: float, *, renewing: tuple[str, ...] = ()) -> None:
        """Advance the clock by `seconds`, the `renewing` nodes renewing as it goes, and
        sweep."""
        self.clock.advance(seconds)
        self.renew(*renewing)
        await self.sweep()

    async def stop(self) -> None:
        self.informers.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.informers


async def start(
    api: FakeApi | None = None,
    clock: FakeClock | None = None,
    settings: SilenceSettings | None = None,
) -> Cluster:
    """An operator process: its own runtime and silence clock, informers listed."""
    api = api or FakeApi()
    clock = clock or FakeClock()
    rt = Runtime.build(api, clock=clock, resync_seconds=None, silence=settings)
    ctrl = NodeLifecycleController(rt)
    informers = asyncio.create_task(rt.factory.run())
    await rt.factory.wait_synced()
    return Cluster(api, clock, rt, ctrl, informers)
