"""Driving the real reclaim controller on the in-memory API with a fake Prometheus.

`FakePrometheus` implements `pilotfish.promql.PromQL` from three tables (cpu p95 in cores,
memory p95 in bytes, each node's sample age in seconds), told apart by the metric each
query names; `down` makes every query fail as an unreachable Prometheus does. The
controller cannot tell it from `PrometheusClient`. `Cluster.cycle()` runs one reclaim
cycle and waits until the informers and the Event poster caught up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY

from pilotfish import names
from pilotfish.kube.rest import NODES, PODS
from pilotfish.kube.runtime import Runtime
from pilotfish.operators.reclaim import ReclaimController
from pilotfish.operators.reclaim.settings import ReclaimSettings
from pilotfish.promql import PromQLError, Sample
from pilotfish.timeutil import FakeClock
from tests.fakeapi import FakeApi

Obj = dict[str, Any]
NS = "ns"
SETTINGS = ReclaimSettings(
    prometheus_url="http://prometheus.test", interval=60, window="1h", stale_after=180
)


@dataclass
class FakePrometheus:
    cpu: dict[tuple[str, str], float] = field(default_factory=dict)  # (node, pod) -> cores
    memory: dict[tuple[str, str], float] = field(default_factory=dict)  # -> bytes
    ages: dict[str, float] = field(default_factory=dict)  # node -> seconds
    down: PromQLError | None = None
    queries: list[str] = field(default_factory=list)

    def use(
        self, node: str, pod: str, cpu: float | None = None, memory: float | None = None
    ) -> None:
        if cpu is not None:
            self.cpu[(node, pod)] = cpu
        if memory is not None:
            self.memory[(node, pod)] = memory
        self.ages.setdefault(node, 5.0)

    async def query(self, expr: str) -> list[Sample]:
        self.queries.append(expr)
        await asyncio.sleep(0)
        if self.down is not None:
            raise self.down
        if "pod_cpu_usage_seconds_total" in expr:
            table = self.cpu
        elif "pod_memory_working_set_bytes" in expr:
            table = self.memory
        elif "node_memory_working_set_bytes" in expr:
            return [Sample({"node": n}, age, 0.0) for n, age in self.ages.items()]
        else:
            raise PromQLError(expr, "bad_data", "unknown query")
        return [
            Sample({"node": n, "namespace": NS, "pod": p}, v, 0.0) for (n, p), v in table.items()
        ]


def unreachable() -> PromQLError:
    return PromQLError("q", "connection", "http://prometheus.test: connection refused")


def node(name: str, cpu: str = "8", memory: str = "16Gi") -> Obj:
    amounts = {"cpu": cpu, "memory": memory, "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {names.LABEL_ZONE: "z"}},
        "spec": {},
        "status": {
            "capacity": dict(amounts),
            "allocatable": dict(amounts),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def pod(
    name: str,
    on: str,
    *,
    band: str = "production",
    created: str = "2025-12-31T23:00:00Z",  # an hour before the fake clock starts
    phase: str = "Running",
    **requests: str,
) -> Obj:
    """`requests` by resource, with `batch_cpu` / `batch_memory` for the extended ones."""
    asked = {
        {"batch_cpu": names.BATCH_CPU, "batch_memory": names.BATCH_MEMORY}.get(k, k): v
        for k, v in requests.items()
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "creationTimestamp": created,
            "labels": {names.LABEL_BAND: band},
        },
        "spec": {
            "nodeName": on,
            "priorityClassName": names.PRIORITY_CLASS[band],
            "containers": [{"name": "c", "image": "i", "resources": {"requests": asked}}],
        },
        "status": {"phase": phase},
    }


def metric(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


@dataclass
class Cluster:
    api: FakeApi
    clock: FakeClock
    rt: Runtime
    prom: FakePrometheus
    ctrl: ReclaimController
    informers: asyncio.Task[None]

    def add_node(self, name: str, **kw: str) -> None:
        self.api.put(NODES.path(name=name), node(name, **kw))

    def add_pod(self, name: str, on: str, **kw: Any) -> None:
        self.api.put(PODS.path(NS, name), pod(name, on, **kw))

    def node(self, name: str) -> Obj:
        found = self.api.obj(NODES.path(name=name))
        assert found is not None
        return found

    def figure(self, name: str) -> tuple[str | None, str | None]:
        alloc = self.node(name)["status"].get("allocatable") or {}
        return alloc.get(names.BATCH_CPU), alloc.get(names.BATCH_MEMORY)

    def condition(self, name: str) -> Obj:
        for c in self.node(name)["status"].get("conditions") or []:
            if c["type"] == names.CONDITION_BATCH_CAPACITY:
                return dict(c)
        raise AssertionError(f"no BatchCapacity condition on {name}")

    def annotation(self, name: str) -> Any:
        raw = (self.node(name)["metadata"].get("annotations") or {})[names.ANNOTATION_RECLAIM]
        return json.loads(raw)

    def pods(self) -> set[str]:
        return set(self.api.store("v1", "pods"))

    def status_writes(self, name: str) -> int:
        return len(self.api.writes(f"/nodes/{name}/status"))

    async def events(self, reason: str) -> list[Obj]:
        await self.rt.events.flush()
        found = self.api.store("events.k8s.io/v1", "events").values()
        return [e for e in found if e["reason"] == reason]

    async def cycle(self, advance: float = 60.0) -> None:
        self.clock.advance(advance)
        await self.api.settle()
        await self.ctrl.cycle()
        await self.api.settle()
        await self.rt.events.flush()

    async def stop(self) -> None:
        self.informers.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.informers


async def start(
    settings: ReclaimSettings = SETTINGS, prom: FakePrometheus | None = None
) -> Cluster:
    api = FakeApi()
    clock = FakeClock()
    rt = Runtime.build(api, clock=clock, resync_seconds=None)
    prom = prom or FakePrometheus()
    ctrl = ReclaimController(rt, settings=settings, prometheus=prom)
    informers = asyncio.create_task(rt.factory.run())
    await rt.factory.wait_synced()
    return Cluster(api, clock, rt, prom, ctrl, informers)
