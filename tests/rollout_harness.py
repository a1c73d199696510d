"""Driving the real ServiceWorkload controller on the shared in-memory API (`tests.fakeapi`).

`Lagging` holds the watches' events while a test acts, so what happens between `lag()`
and its end is exactly the lag the controller must survive; `World.converge` lets the
watches catch up and reconciles until a round changes nothing. Pods carry a finalizer
standing for the kubelet's graceful termination: a deleted pod stays, terminating, until
`terminate`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import random
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from pilotfish.kube.rest import PODS, SERVICEWORKLOADS
from pilotfish.kube.runtime import Runtime
from pilotfish.kube.workqueue import Result
from pilotfish.operators.serviceworkload import ServiceWorkloadController
from pilotfish.timeutil import FakeClock, format_time
from pilotfish.workloads import ANNOTATION_DRAIN, LABEL_REVISION
from tests.fakeapi import FakeApi

Obj = dict[str, Any]
T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
KEY = "ns/web"
SW = SERVICEWORKLOADS.path("ns", "web")
KUBELET = "test.pilotfish.io/kubelet"  # stands for graceful termination


class Lagging(FakeApi):
    """The shared fake, with watch events held back while `lag()` is open."""

    def __init__(self) -> None:
        super().__init__()
        self.flowing = asyncio.Event()
        self.flowing.set()

    async def watch(
        self,
        path: str,
        resource_version: str,
        params: Mapping[str, Any] | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[dict[str, Any]]:
        async for event in super().watch(path, resource_version, params, timeout_seconds):
            await self.flowing.wait()
            yield event

    @contextlib.asynccontextmanager
    async def lag(self) -> AsyncIterator[None]:
        """From a view that has caught up, hold every further event until the end."""
        await self.settle()
        self.flowing.clear()
        try:
            yield
        finally:
            self.flowing.set()

    # the cluster's side ------------------------------------------------------------------

    def pods(self, *, live: bool = True) -> list[Obj]:
        return [
            p
            for p in self.store("v1", "pods").values()
            if not (live and p["metadata"].get("deletionTimestamp"))
        ]

    def revisions(self) -> list[Obj]:
        return list(self.store("apps/v1", "controllerrevisions").values())

    def sw(self) -> Obj:
        found = self.obj(SW)
        assert found is not None
        return found

    def edit(self, path: str, change: Callable[[Obj], None]) -> Obj:
        obj = self.obj(path)
        assert obj is not None
        change(obj)
        return self.put(path, obj)

    def make_ready(self, clock: FakeClock, *, revision: str | None = None) -> None:
        """kube-scheduler and the kubelet: the pods run, Ready from now."""
        for p in self.pods():
            name = p["metadata"]["name"]
            if revision and p["metadata"]["labels"][LABEL_REVISION] != revision:
                continue
            if (p.get("status") or {}).get("phase") == "Running":
                continue

            def run(pod: Obj) -> None:
                pod["metadata"]["finalizers"] = [KUBELET]
                pod["spec"]["nodeName"] = "kwok-1"
                pod["status"] = {
                    "phase": "Running",
                    "podIP": "10.0.0.1",
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "lastTransitionTime": format_time(clock.now()),
                        }
                    ],
                }

            self.edit(PODS.path("ns", name), run)

    def terminate(self) -> None:
        """The kubelet finishes every graceful termination."""
        for p in self.pods(live=False):
            if p["metadata"].get("deletionTimestamp"):
                self.remove(PODS.path("ns", p["metadata"]["name"]))


def template(image: str = "app:1", **spec: Any) -> Obj:
    return {
        "metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": image}], **spec},
    }


def workload(replicas: int = 3, **spec: Any) -> Obj:
    return {
        "apiVersion": "pilotfish.io/v1alpha1",
        "kind": "ServiceWorkload",
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {"team": "payments", "replicas": replicas, "template": template(), **spec},
    }


class Reconciles(Protocol):
    async def reconcile(self, key: str) -> Result: ...


ApiT = TypeVar("ApiT", bound=FakeApi)
CtrlT = TypeVar("CtrlT", bound=Reconciles)


@dataclass
class ControllerWorld(Generic[ApiT, CtrlT]):
    """One real controller on a fake API, stepped by hand: what every controller harness
    shares."""

    api: ApiT
    clock: FakeClock
    rt: Runtime
    ctrl: CtrlT
    informers: asyncio.Task[None]
    key: str

    async def step(self) -> Result:
        """One round after the watches caught up."""
        await self.api.settle()
        return await self.ctrl.reconcile(self.key)

    async def converge(self, rounds: int = 20) -> Result:
        """Rounds until one changes nothing in the API."""
        result = Result()
        for _ in range(rounds):
            before = self.snapshot()
            result = await self.step()
            if self.snapshot() == before:
                return result
        return result

    def snapshot(self) -> str:
        """Everything but Events, which the poster writes on its own schedule."""
        kept = {"/".join(k): v for k, v in self.api.objects.items() if k[1] != "events"}
        return json.dumps(kept, sort_keys=True)

    async def events(self) -> list[Obj]:
        await self.rt.events.flush()
        return list(self.api.store("events.k8s.io/v1", "events").values())

    async def stop(self) -> None:
        self.informers.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.informers


World = ControllerWorld[Lagging, ServiceWorkloadController]


async def start(api: Lagging, clock: FakeClock, seed: int = 7) -> World:
    """An operator process: its own runtime, informers listed before anything is decided."""
    rt = Runtime.build(api, clock=clock, resync_seconds=None)
    ctrl = ServiceWorkloadController(rt, rng=random.Random(seed))
    informers = asyncio.create_task(rt.factory.run())
    await rt.factory.wait_synced()
    return World(api, clock, rt, ctrl, informers, KEY)


def status(api: Lagging) -> Obj:
    found: Obj = api.sw().get("status") or {}
    return found


def condition(api: Lagging, type_: str) -> tuple[str, str]:
    for c in status(api).get("conditions") or []:
        if c["type"] == type_:
            return c["status"], c["reason"]
    raise AssertionError(f"no {type_} condition in {status(api)}")


def set_template(api: Lagging, tpl: Obj) -> None:
    api.edit(SW, lambda sw: sw["spec"].update(template=tpl))


def revisions_of(pods: list[Obj]) -> list[str]:
    return sorted(p["metadata"]["labels"][LABEL_REVISION] for p in pods)


def draining(api: Lagging) -> list[Obj]:
    return [p for p in api.pods() if ANNOTATION_DRAIN in p["metadata"].get("annotations", {})]
