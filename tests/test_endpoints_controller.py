"""The endpoints controller, the real one on the real factory and informers, against the
shared in-memory API (`tests.fakeapi`): coalescing, conflicts, lagging watches, the drain
handshake, foreign Services, failures.

The e2e suite runs the same controller against the real control plane; these tests reach
the paths a real cluster rarely shows on cue (a conflict between plan and write, a watch
that lags behind the controller's own writes).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from pilotfish import tasks
from pilotfish.kube.rest import NODES, PODS, SERVICEWORKLOADS
from pilotfish.kube.runtime import Runtime
from pilotfish.operators.endpoints import (
    ENDPOINTSLICES,
    LABEL_SERVICE_NAME,
    REASON_SERVICE_NOT_OWNED,
    REASON_SYNC_FAILED,
    SERVICES,
    EndpointsController,
)
from pilotfish.timeutil import FakeClock
from pilotfish.workloads import ANNOTATION_DRAIN, ANNOTATION_DRAINED, LABEL_WORKLOAD
from tests.fakeapi import FakeApi, wait_for

Obj = dict[str, Any]
NS = "team-a"
KEY = f"{NS}/web"
PORTS = [{"name": "http", "port": 80, "targetPort": 8080}]


def sw_obj(ports: list[Obj] | None = None, name: str = "web") -> Obj:
    spec: Obj = {"team": "t", "template": {}}
    if ports is not None:
        spec["service"] = {"ports": ports}
    return {
        "apiVersion": "pilotfish.io/v1alpha1",
        "kind": "ServiceWorkload",
        "metadata": {"name": name, "namespace": NS, "uid": f"sw-{name}"},
        "spec": spec,
    }


def pod_obj(i: int, ready: bool = True, workload: str = "web") -> Obj:
    return {
        "metadata": {
            "name": f"{workload}-{i}",
            "namespace": NS,
            "uid": f"pod-{workload}-{i}",
            "labels": {LABEL_WORKLOAD: workload},
            "annotations": {},
        },
        "spec": {"nodeName": f"node-{i % 3}", "containers": [{"name": "app"}]},
        "status": {
            "phase": "Running",
            "podIP": f"10.1.{i // 200}.{i % 200 + 1}",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def node_obj(i: int) -> Obj:
    return {"metadata": {"name": f"node-{i}", "labels": {"topology.kubernetes.io/zone": f"z{i}"}}}


def set_ready(ready: bool) -> Callable[[Obj], None]:
    def change(pod: Obj) -> None:
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]

    return change


class LaggingWatch:
    """Holds back the watch events of one resource until released, as a slow watch does:
    the informer shows the past while the API already has the controller's writes."""

    def __init__(self, api: FakeApi, plural: str) -> None:
        self.open = asyncio.Event()
        self.open.set()
        watch = api.watch

        async def lagging(
            path: str,
            resource_version: str,
            params: Mapping[str, Any] | None = None,
            timeout_seconds: int = 300,
        ) -> AsyncIterator[Obj]:
            async for event in watch(path, resource_version, params, timeout_seconds):
                if f"/{plural}" in path:
                    await self.open.wait()
                yield event

        api.watch = lagging  # type: ignore[method-assign]

    def hold(self) -> None:
        self.open.clear()

    def release(self) -> None:
        self.open.set()


@dataclass
class Running:
    api: FakeApi
    controller: EndpointsController
    clock: FakeClock
    lag: LaggingWatch

    def put(self, resource: Any, obj: Obj) -> Obj:
        return self.api.put(resource.path(obj["metadata"].get("namespace")), obj)

    def get(self, resource: Any, name: str) -> Obj | None:
        return self.api.obj(resource.path(NS, name))

    def edit(self, resource: Any, name: str, change: Callable[[Obj], None]) -> Obj:
        obj = self.get(resource, name)
        assert obj is not None
        change(obj)
        return self.put(resource, obj)

    def slices(self) -> list[Obj]:
        return list(self.api.store("discovery.k8s.io/v1", "endpointslices").values())

    def events(self, reason: str) -> list[Obj]:
        found = self.api.store("events.k8s.io/v1", "events").values()
        return [e for e in found if e["reason"] == reason]

    def shown(self) -> dict[str, tuple[bool, bool, bool]]:
        """Pod name -> (ready, serving, terminating) over all slices."""
        out = {}
        for s in self.slices():
            for ep in s["endpoints"]:
                c = ep["conditions"]
                out[ep["targetRef"]["name"]] = (c["ready"], c["serving"], c["terminating"])
        return out

    def slice_writes(self) -> list[tuple[str, str]]:
        """(method, path) of every slice write so far."""
        return [(c.method, c.path) for c in self.api.writes("/endpointslices")]

    async def quiet(self) -> None:
        """Longer than the write interval passes with nothing to do."""
        await self.api.settle()
        await wait_for("an idle queue", lambda: not self.controller.queue.in_flight, within=10.0)
        self.clock.advance(5)


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    api = FakeApi()
    clock = FakeClock()
    lag = LaggingWatch(api, "endpointslices")
    for i in range(3):
        api.put(NODES.path(), node_obj(i))
    rt = Runtime.build(api, identity="endpoints-test", clock=clock)
    controller = EndpointsController(rt, min_interval=1.0)
    guarded = tasks.run_guarded(
        {"informers": rt.factory.run(), "events": rt.events.run(), "endpoints": controller.run()}
    )
    task = asyncio.ensure_future(guarded)
    try:
        await rt.factory.wait_synced()
        yield Running(api, controller, clock, lag)
    finally:
        lag.release()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def start(r: Running, pods: int, ports: list[Obj] | None = PORTS) -> None:
    for i in range(pods):
        r.put(PODS, pod_obj(i))
    r.put(SERVICEWORKLOADS, sw_obj(ports))
    if ports is not None:
        await wait_for(f"{pods} endpoints", lambda: len(r.shown()) == pods)


async def test_service_and_slices_for_a_new_workload(running: Running) -> None:
    await start(running, 250)
    svc = running.get(SERVICES, "web")
    assert svc is not None
    assert "selector" not in svc["spec"] and svc["spec"]["type"] == "ClusterIP"
    assert svc["metadata"]["ownerReferences"][0]["uid"] == "sw-web"
    sizes = sorted(len(s["endpoints"]) for s in running.slices())
    assert sizes == [50, 100, 100]
    for s in running.slices():
        assert s["metadata"]["labels"][LABEL_SERVICE_NAME] == "web"
        assert s["metadata"]["ownerReferences"][0]["uid"] == svc["metadata"]["uid"]
        assert s["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    zones = {ep["zone"] for s in running.slices() for ep in s["endpoints"]}
    assert zones == {"z0", "z1", "z2"}
    assert all(v == (True, True, False) for v in running.shown().values())
    assert [m for m, _ in running.slice_writes()] == ["POST"] * 3


async def test_first_change_after_quiet_goes_out_at_once_then_bursts_coalesce(
    running: Running,
) -> None:
    await start(running, 150)
    await running.quiet()
    before = len(running.slice_writes())
    running.edit(PODS, "web-1", set_ready(False))
    await wait_for("the first flip", lambda: running.shown()["web-1"][0] is False, within=10.0)
    assert len(running.slice_writes()) == before + 1, "one flip, one slice write"

    # A burst within the interval is held, then written together when the interval ends.
    for i in range(2, 12):
        running.edit(PODS, f"web-{i}", set_ready(False))
    await wait_for(
        "the burst to be held", lambda: running.controller.held_until.get(KEY), within=10.0
    )
    await running.api.settle()
    assert len(running.slice_writes()) == before + 1
    assert running.shown()["web-5"][0] is True, "not written before the interval ends"
    running.clock.advance(1.0)
    running.controller.enqueue(KEY)  # what the hold's timer does when it fires
    await wait_for(
        "the burst", lambda: all(running.shown()[f"web-{i}"][0] is False for i in range(2, 12))
    )
    assert len(running.slice_writes()) <= before + 3, "the burst is one write per slice"


async def test_one_flip_writes_one_slice(running: Running) -> None:
    await start(running, 300)
    await running.quiet()
    before = len(running.slice_writes())
    running.edit(PODS, "web-123", set_ready(False))
    await wait_for("the flip", lambda: running.shown()["web-123"][0] is False, within=10.0)
    await running.api.settle()
    (write,) = running.slice_writes()[before:]
    assert write[0] == "PUT"


async def test_a_stale_cache_is_never_decided_from(running: Running) -> None:
    """The informer has not shown the slice the controller just created: a change then
    waits for it (no second create, no replace from a version the controller never saw)
    and is written once the informer catches up."""
    running.lag.hold()
    await start(running, 10)
    assert [m for m, _ in running.slice_writes()] == ["POST"]
    running.clock.advance(5)
    running.edit(PODS, "web-4", set_ready(False))
    # The round for the change ran and asked to come back once the cache has caught up.
    await wait_for(
        "the change looked at",
        lambda: running.controller.queue.scheduled(KEY) or len(running.slice_writes()) > 1,
    )
    assert [m for m, _ in running.slice_writes()] == ["POST"], "nothing decided from the past"
    assert not running.controller.own.settled(KEY)
    running.lag.release()
    await wait_for("the flip", lambda: running.shown()["web-4"][0] is False, within=10.0)
    await running.api.settle()
    assert len(running.slices()) == 1
    assert [m for m, _ in running.slice_writes()] == ["POST", "PUT"]


async def test_a_write_answered_after_its_watch_event_does_not_stall(running: Running) -> None:
    """Over a real connection the watch may deliver a write before its answer arrives: the
    controller must not then wait for an event that has already come."""
    request = running.api.request

    async def slow_answer(method: str, path: str, **kw: Any) -> Obj:
        out = await request(method, path, **kw)
        if "/endpointslices" in path and method in ("POST", "PUT"):
            await running.api.settle()  # the informer has it before the caller does
        return out

    running.api.request = slow_answer  # type: ignore[method-assign]
    await start(running, 10)
    running.clock.advance(5)
    running.edit(PODS, "web-4", set_ready(False))
    await wait_for("the flip", lambda: running.shown()["web-4"][0] is False, within=10.0)
    assert [m for m, _ in running.slice_writes()] == ["POST", "PUT"]


async def test_conflicting_write_is_decided_again_from_the_newer_version(
    running: Running,
) -> None:
    await start(running, 20)
    await running.quiet()
    (victim,) = running.slices()
    name = victim["metadata"]["name"]

    # Someone else rewrites the slice; the controller's watch has not shown it yet when
    # it plans, so its replace carries the old version and must be refused.
    running.lag.hold()
    touched = copy.deepcopy(victim)
    touched["metadata"]["annotations"] = {"touched": "yes"}
    touched_rv = running.put(ENDPOINTSLICES, touched)["metadata"]["resourceVersion"]
    running.edit(PODS, "web-3", set_ready(False))
    await wait_for(
        "a refused replace", lambda: running.controller.queue.failures(KEY) >= 1, within=10.0
    )
    running.lag.release()
    await wait_for("the flip", lambda: running.shown()["web-3"][0] is False, within=10.0)
    (after,) = running.slices()
    assert after["metadata"]["annotations"] == {"touched": "yes"}, "the other writer's change"
    assert len(running.shown()) == 20
    puts = [c for c in running.api.writes(f"/endpointslices/{name}") if c.method == "PUT"]
    planned_from = [c.body["metadata"]["resourceVersion"] for c in puts]
    stale, newer = victim["metadata"]["resourceVersion"], touched_rv
    assert planned_from[-1] == newer and set(planned_from[:-1]) == {stale}, planned_from


async def test_new_pods_and_gone_pods(running: Running) -> None:
    await start(running, 5)
    await running.quiet()
    running.put(PODS, pod_obj(7))
    await wait_for("a new pod", lambda: "web-7" in running.shown(), within=10.0)
    await running.quiet()
    running.edit(PODS, "web-2", lambda p: p["status"].update(phase="Succeeded"))
    await wait_for("a finished pod", lambda: "web-2" not in running.shown(), within=10.0)
    await running.quiet()
    running.api.remove(PODS.path(NS, "web-3"))
    await wait_for("a deleted pod", lambda: "web-3" not in running.shown(), within=10.0)
    assert sorted(running.shown()) == ["web-0", "web-1", "web-4", "web-7"]


async def test_draining_pod_leaves_rotation_then_is_marked_drained(running: Running) -> None:
    await start(running, 5)
    await running.quiet()
    running.edit(
        PODS,
        "web-2",
        lambda p: p["metadata"]["annotations"].update({ANNOTATION_DRAIN: "2030-01-01T00:00:00Z"}),
    )

    def drained() -> str | None:
        pod = running.get(PODS, "web-2")
        return None if pod is None else pod["metadata"]["annotations"].get(ANNOTATION_DRAINED)

    stamp = await wait_for("drained-at", drained, within=10.0)
    assert stamp == "2026-01-01T00:00:05.000000Z", "the injected clock, to the microsecond"
    assert running.shown()["web-2"] == (False, True, True)
    order = [(c.method, c.path) for c in running.api.writes()]
    slice_write = max(i for i, (m, p) in enumerate(order) if m == "PUT" and "endpointslices" in p)
    pod_patch = order.index(("PATCH", PODS.path(NS, "web-2")))
    assert slice_write < pod_patch, "drained-at only after the slice write succeeded"
    await running.api.settle()
    assert len(running.api.writes(PODS.path(NS, "web-2"))) == 1, "marked once"


async def test_foreign_service_is_left_alone_and_reported(running: Running) -> None:
    running.put(
        SERVICES,
        {
            "metadata": {"name": "web", "namespace": NS},
            "spec": {"ports": [{"name": "x", "port": 1}], "selector": {"app": "x"}},
        },
    )
    foreign = running.get(SERVICES, "web")
    await start(running, 3, ports=None)
    running.edit(SERVICEWORKLOADS, "web", lambda sw: sw["spec"].update(service={"ports": PORTS}))

    (event,) = await wait_for(
        "the event", lambda: running.events(REASON_SERVICE_NOT_OWNED), within=10.0
    )
    assert event["regarding"]["name"] == "web" and event["type"] == "Warning"
    assert running.get(SERVICES, "web") == foreign
    assert running.slices() == []
    assert running.api.writes(SERVICES.path(NS)) == []


async def test_port_change_patches_the_service_and_keeps_it(running: Running) -> None:
    await start(running, 4)
    before = running.get(SERVICES, "web")
    assert before is not None
    new_ports = [{"name": "http", "port": 81, "targetPort": 9090}]
    await running.quiet()
    running.edit(SERVICEWORKLOADS, "web", lambda sw: sw["spec"]["service"].update(ports=new_ports))

    def moved() -> bool:
        return bool(running.slices()) and all(
            s["ports"][0]["port"] == 9090 for s in running.slices()
        )

    await wait_for("slices on the new port", moved, within=10.0)
    after = running.get(SERVICES, "web")
    assert after is not None
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["spec"]["ports"][0]["port"] == 81
    assert len(running.shown()) == 4
    methods = [c.method for c in running.api.writes(SERVICES.path(NS))]
    assert methods == ["POST", "PATCH"], "patched, never re-created"


async def test_unsetting_the_service_deletes_it(running: Running) -> None:
    await start(running, 2)
    running.edit(SERVICEWORKLOADS, "web", lambda sw: sw["spec"].pop("service"))
    await wait_for("the Service gone", lambda: running.get(SERVICES, "web") is None, within=10.0)


async def test_a_failed_write_is_reported_on_the_workload_and_retried(running: Running) -> None:
    running.api.fail_next("POST", "/endpointslices", 500)
    await start(running, 3)  # the retry got there
    (event,) = await wait_for("the event", lambda: running.events(REASON_SYNC_FAILED), within=10.0)
    assert "injected 500" in event["note"] and event["type"] == "Warning"
    assert event["regarding"]["kind"] == "ServiceWorkload"
    assert [m for m, _ in running.slice_writes()] == ["POST", "POST"]


async def test_an_invalid_service_spec_is_reported_not_retried(running: Running) -> None:
    running.put(PODS, pod_obj(0))
    running.put(SERVICEWORKLOADS, sw_obj([{"name": "http", "port": 70000}]))
    (event,) = await wait_for("the event", lambda: running.events(REASON_SYNC_FAILED), within=10.0)
    assert event["note"].startswith("spec.service.ports.0.port:") and "70000" in event["note"]
    assert running.controller.queue.failures(KEY) == 0
    assert running.api.writes(SERVICES.path(NS)) == []
