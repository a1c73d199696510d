"""Driving the real maintenance controller on the in-memory API, without kopf.

kopf's part is played by the test: `feed` hands the controller each NodeMaintenance as its
watch would (`saw`), and `finish` removes the finalizer once the controller says the nodes
are released, as kopf's deletion handler does. Pods carry a finalizer standing for the
kubelet, so an evicted pod stays Terminating until `kubelet()` lets it go.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY

from pilotfish import names
from pilotfish.kube.rest import NODEMAINTENANCES, NODES, PODS
from pilotfish.kube.runtime import Runtime
from pilotfish.kube.workqueue import Result
from pilotfish.operators.maintenance import MaintenanceController
from pilotfish.timeutil import FakeClock
from tests.fakeapi import FakeApi
from tests.nodelifecycle_harness import KUBELET, NS, node, pod

Obj = dict[str, Any]
NM = "upgrade"


def maintenance(*nodes: str, name: str = NM, **spec: Any) -> Obj:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "NodeMaintenance",
        "metadata": {"name": name, "finalizers": [names.FINALIZER_MAINTENANCE]},
        "spec": {"nodes": list(nodes), **spec},
    }


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@dataclass
class Cluster:
    api: FakeApi
    clock: FakeClock
    rt: Runtime
    ctrl: MaintenanceController
    informers: asyncio.Task[None]
    results: dict[str, Result] = field(default_factory=dict)

    # the cluster's side ------------------------------------------------------------------

    def add_node(self, name: str, zone: str = "z1", **spec: Any) -> None:
        body = node(name, zone)
        body["spec"].update(spec)
        self.api.put(NODES.path(name=name), body)

    def add_pod(self, name: str, on: str, **kw: Any) -> None:
        self.api.put(PODS.path(NS, name), pod(name, on, **kw))

    def add_nm(self, *nodes: str, name: str = NM, **spec: Any) -> None:
        self.api.put(NODEMAINTENANCES.path(name=name), maintenance(*nodes, name=name, **spec))

    def node(self, name: str) -> Obj:
        found = self.api.obj(NODES.path(name=name))
        assert found is not None
        return found

    def nm(self, name: str = NM) -> Obj:
        found = self.api.obj(NODEMAINTENANCES.path(name=name))
        assert found is not None
        return found

    def status(self, name: str = NM) -> Obj:
        return dict(self.nm(name).get("status") or {})

    def node_states(self, name: str = NM) -> dict[str, str]:
        return {n["name"]: n["state"] for n in self.status(name).get("nodes") or []}

    def pods_on(self, node_name: str) -> list[str]:
        return sorted(
            k for k, p in self.api.store("v1", "pods").items() if p["spec"]["nodeName"] == node_name
        )

    def kubelet(self) -> None:
        """Every evicted pod finishes stopping and is gone."""
        for key, p in list(self.api.store("v1", "pods").items()):
            if p["metadata"].get("deletionTimestamp"):
                p["metadata"]["finalizers"] = [
                    f for f in p["metadata"].get("finalizers") or [] if f != KUBELET
                ]
                self.api.remove(PODS.path(NS, key.split("/", 1)[1]))

    def evictions(self) -> list[str]:
        return [c.path.split("/")[-2] for c in self.api.writes("/eviction")]

    async def events(self, reason: str) -> list[Obj]:
        await self.rt.events.flush()
        found = self.api.store("events.k8s.io/v1", "events").values()
        return [e for e in found if e["reason"] == reason]

    # kopf's side and the controller's ----------------------------------------------------

    def feed(self) -> None:
        """What kopf's watch of the NodeMaintenances would hand the controller."""
        for name, obj in self.api.store(names.API_VERSION, "nodemaintenances").items():
            self.ctrl.saw(name, obj)

    def finish(self, name: str = NM) -> None:
        """kopf removes its finalizer once the deletion handler returned."""
        obj = self.nm(name)
        obj["metadata"]["finalizers"] = []
        self.api.put(NODEMAINTENANCES.path(name=name), obj)
        self.api.store(names.API_VERSION, "nodemaintenances").pop(name, None)
        self.ctrl.saw(name, None)

    def snapshot(self) -> str:
        kept = {"/".join(k): v for k, v in self.api.objects.items() if k[1] != "events"}
        return json.dumps(kept, sort_keys=True)

    async def sweep(self, rounds: int = 20, *, kubelet: bool = True) -> None:
        """Reconcile every maintenance until a round changes nothing."""
        for _ in range(rounds):
            before = self.snapshot()
            await self.api.settle()
            self.feed()
            for name in sorted(self.api.store(names.API_VERSION, "nodemaintenances")):
                self.results[name] = await self.ctrl.reconcile(name)
            await self.api.settle()
            if kubelet:
                self.kubelet()
                await self.api.settle()
            if self.snapshot() == before:
                return
        raise AssertionError("the controller kept writing")

    async def stop(self) -> None:
        self.informers.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.informers


async def start(api: FakeApi | None = None, clock: FakeClock | None = None) -> Cluster:
    """An operator process: its own runtime and clock, informers listed."""
    api = api or FakeApi()
    clock = clock or FakeClock()
    rt = Runtime.build(api, clock=clock, resync_seconds=None)
    ctrl = MaintenanceController(rt)
    informers = asyncio.ensure_future(rt.factory.run())
    await rt.factory.wait_synced()
    return Cluster(api, clock, rt, ctrl, informers)
