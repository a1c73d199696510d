"""The gate controller on the shared fake API server, as one operator process runs it: the
real runtime (factory, informers, own-writes tracker, Event poster) and the real reconcile.

A test writes objects as others would (`api.put`), lets the watches deliver them
(`api.settle`), runs rounds (`Harness.round`) and checks exactly what the controller wrote.
`Harness.lag` holds the watches back, as a slow network would: that is how a test makes the
controller's view stale on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pilotfish import names
from pilotfish.kube.informer import Obj
from pilotfish.kube.rest import GATEPOLICIES, GATESIGNALS, NAMESPACES, PODS, TEAMQUOTAS
from pilotfish.kube.runtime import Runtime
from pilotfish.kube.workqueue import Result
from pilotfish.operators.gates import GateController, audit
from pilotfish.operators.gates.apply import ROUND
from pilotfish.timeutil import FakeClock
from tests.fakeapi import FakeApi
from tests.test_gates_builders import NOW, gate_policy

DATA = "gates.pilotfish.io/data"
QUOTA_GATE = "gates.pilotfish.io/quota"
HONEST = {"data": {"type": "GateSignal", "signalName": "data"}, "quota": {"type": "Quota"}}


def seeded_api() -> FakeApi:
    """The tenant namespace (team t) and the GatePolicy that gave the tests' pods their
    gates (`rec()` names it)."""
    api = FakeApi()
    api.put(
        NAMESPACES.path(None, "team-a"),
        {"metadata": {"name": "team-a", "labels": {names.LABEL_TEAM: "t"}}},
    )
    api.put(GATEPOLICIES.path("team-a", "policy"), gate_policy("policy", HONEST))
    return api


class Harness:
    """One operator process's gate controller on `api`: its own runtime and clock."""

    def __init__(self, api: FakeApi, tmp_path: Path, identity: str = "test-1") -> None:
        self.api = api
        self.clock = FakeClock(NOW)
        self.audit_path = tmp_path / "audit.jsonl"
        self.rt = Runtime.build(
            api, identity=identity, audit_log=self.audit_path, clock=self.clock, resync_seconds=None
        )
        self.c = GateController(self.rt)
        self._task: asyncio.Task[Any] | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()
        real_watch = api.watch

        async def lagging_watch(*args: Any, **kw: Any) -> AsyncIterator[dict[str, Any]]:
            async for event in real_watch(*args, **kw):
                await self._flowing.wait()
                yield event

        api.watch = lagging_watch  # type: ignore[method-assign]

    def lag(self) -> None:
        """Hold every watch event back from here on (a slow network to the API server): the
        informers keep what they hold until `catch_up`."""
        self._flowing.clear()

    async def catch_up(self) -> None:
        self._flowing.set()
        await self.api.settle()

    async def start(self) -> None:
        self._task = asyncio.ensure_future(self.rt.factory.run())
        await self.rt.factory.wait_synced()
        await self.api.settle()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.c.audit.close()

    def add(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        return self.api.put(PODS.path(meta["namespace"], meta["name"]), obj)

    def pod(self, name: str) -> Obj:
        found = self.api.obj(PODS.path("team-a", name))
        assert found is not None, name
        return found

    def signal(self, name: str = "data", ready: str = "True") -> None:
        self.api.put(
            GATESIGNALS.path("team-a", name),
            {
                "metadata": {"name": name, "namespace": "team-a"},
                "status": {"conditions": [{"type": "Ready", "status": ready}]},
            },
        )

    def quota(self, cpu: str) -> None:
        self.api.put(
            TEAMQUOTAS.path(None, "t"),
            {"metadata": {"name": "t"}, "spec": {"team": "t", "bands": {"batch": {"cpu": cpu}}}},
        )

    async def round(self, *, settle: bool = True) -> Result:
        """One reconcile; `settle=False` decides from whatever the informers hold now."""
        if settle:
            await self.api.settle()
        result = await self.c.reconcile(ROUND)
        await self.rt.events.flush()
        return result

    def events(self) -> list[Obj]:
        return list(self.api.store("events.k8s.io/v1", "events").values())

    def lines(self) -> list[dict[str, Any]]:
        return audit.read(self.audit_path)

    def gate_patches(self, name: str) -> list[Any]:
        """The controller's writes to the pod itself (gate removals), not to its status."""
        path = PODS.path("team-a", name)
        return [c.body for c in self.api.writes(path) if c.method == "PATCH" and c.path == path]


@contextlib.asynccontextmanager
async def running(tmp_path: Path) -> AsyncIterator[Harness]:
    """A started controller on a seeded API, stopped afterwards."""
    harness = Harness(seeded_api(), tmp_path)
    await harness.start()
    try:
        yield harness
    finally:
        await harness.stop()
