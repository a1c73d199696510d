"""The endpoints controller's acting side, against an in-memory API with the API server's
write semantics (resourceVersion preconditions, generateName, generation, JSON-patch `test`,
list + watch): coalescing, conflicts, lagging watches, the drain handshake, foreign Services.

The e2e suite runs the same controller against the real control plane; these tests reach
the paths a real cluster rarely shows on cue (a conflict between plan and write, a watch
that lags behind the controller's own writes).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from pilotfish.kube.rest import ApiError, Rest
from pilotfish.operators.endpoints import (
    LABEL_SERVICE_NAME,
    REASON_SERVICE_NOT_OWNED,
    REASON_SYNC_FAILED,
    EndpointsController,
)
from pilotfish.workloads import ANNOTATION_DRAIN, ANNOTATION_DRAINED, LABEL_WORKLOAD

Obj = dict[str, Any]
NS = "team-a"
WAIT_SECONDS = 10.0


def _split(path: str) -> tuple[str, str | None, str | None, str | None]:
    """(plural, namespace, name, subresource) of an API path."""
    parts = path.strip("/").split("/")
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    ns = None
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        ns, rest = rest[1], rest[2:]
    return rest[0], ns, (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)


def _matches(obj: Obj, selector: str | None) -> bool:
    labels = obj["metadata"].get("labels") or {}
    for term in filter(None, (selector or "").split(",")):
        key, _, value = term.partition("=")
        if key not in labels or (value and labels[key] != value):
            return False
    return True


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.strip("/").split("/")]


def _json_patch(obj: Obj, ops: list[Obj]) -> Obj:
    out = copy.deepcopy(obj)
    for op in ops:
        *parents, last = _pointer(op["path"])
        target: Any = out
        for p in parents:
            target = target.setdefault(p, {})
        if op["op"] == "test":
            if target.get(last) != op["value"]:
                raise ApiError(422, "Invalid", f"test failed at {op['path']}")
        elif op["op"] in ("add", "replace"):
            target[last] = op["value"]
        elif op["op"] == "remove":
            del target[last]
    return out


@dataclass
class FakeApi:
    """The subset of the API server the controller uses, with its consistency rules."""

    objects: dict[tuple[str, str | None, str], Obj] = field(default_factory=dict)
    history: list[tuple[str, int, str, Obj]] = field(default_factory=list)  # type, rv, plural
    writes: list[tuple[str, str, str]] = field(default_factory=list)  # (verb, plural, name)
    rv: int = 100
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    held: set[str] = field(default_factory=set)  # plurals whose watch events are held back
    before_write: Callable[[str, str, str], None] | None = None
    _names: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    # -- server side --

    def _bump(self, kind: str, plural: str, obj: Obj) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.history.append((kind, self.rv, plural, copy.deepcopy(obj)))
        self.changed.set()

    def put(self, plural: str, obj: Obj) -> Obj:
        """Create or overwrite an object as another client would (tests' own writes)."""
        meta = obj["metadata"]
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta.setdefault("generation", 1)
        key = (plural, meta.get("namespace"), meta["name"])
        kind = "MODIFIED" if key in self.objects else "ADDED"
        self.objects[key] = obj
        self._bump(kind, plural, obj)
        return obj

    def edit(self, plural: str, name: str, change: Callable[[Obj], None]) -> Obj:
        obj = copy.deepcopy(self.objects[(plural, NS, name)])
        change(obj)
        return self.put(plural, obj)

    def get_obj(self, plural: str, name: str) -> Obj | None:
        return self.objects.get((plural, NS, name))

    def list_of(self, plural: str) -> list[Obj]:
        return [o for (p, _, _), o in self.objects.items() if p == plural]

    def release(self, plural: str) -> None:
        self.held.discard(plural)
        self.changed.set()

    # -- the Rest interface --

    async def get(self, path: str, **params: Any) -> Obj:
        plural, ns, name, _ = _split(path)
        assert name
        obj = self.objects.get((plural, ns, name))
        if obj is None:
            raise ApiError(404, "NotFound", path)
        return copy.deepcopy(obj)

    def _hook(self, verb: str, path: str, name: str | None = None) -> None:
        """Let a test change the object just before a write is checked against it."""
        plural, _, in_path, _ = _split(path)
        if self.before_write:
            self.before_write(verb, plural, str(name or in_path))

    def _write(self, verb: str, plural: str, name: str) -> None:
        self.writes.append((verb, plural, name))

    async def create(self, path: str, body: Obj) -> Obj:
        self._hook("create", path, body["metadata"].get("name", ""))
        plural, ns, _, _ = _split(path)
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        meta.setdefault("name", f"{meta.get('generateName', '')}{next(self._names):05d}")
        meta["namespace"] = ns
        if (plural, ns, meta["name"]) in self.objects:
            raise ApiError(409, "AlreadyExists", meta["name"])
        self._write("create", plural, meta["name"])
        meta["uid"] = f"uid-{plural}-{meta['name']}-{self.rv}"
        meta["generation"] = 1
        if plural == "services":
            obj["spec"]["clusterIP"] = f"10.96.0.{len(self.list_of('services')) + 10}"
        self.objects[(plural, ns, meta["name"])] = obj
        self._bump("ADDED", plural, obj)
        return copy.deepcopy(obj)

    async def replace(self, path: str, body: Obj) -> Obj:
        self._hook("update", path)
        plural, ns, name, _ = _split(path)
        assert name
        current = self.objects.get((plural, ns, name))
        if current is None:
            raise ApiError(404, "NotFound", path)
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified")
        self._write("update", plural, name)
        obj = copy.deepcopy(body)
        strip = {"metadata"}
        changed = {k: v for k, v in obj.items() if k not in strip} != {
            k: v for k, v in current.items() if k not in strip
        }
        obj["metadata"]["generation"] = current["metadata"]["generation"] + int(changed)
        self.objects[(plural, ns, name)] = obj
        self._bump("MODIFIED", plural, obj)
        return copy.deepcopy(obj)

    async def patch(self, path: str, body: Any, content_type: str = "") -> Obj:
        self._hook("patch", path)
        plural, ns, name, _ = _split(path)
        assert name and content_type == "application/json-patch+json"
        current = self.objects.get((plural, ns, name))
        if current is None:
            raise ApiError(404, "NotFound", path)
        obj = _json_patch(current, body)
        self._write("patch", plural, name)
        self.objects[(plural, ns, name)] = obj
        self._bump("MODIFIED", plural, obj)
        return copy.deepcopy(obj)

    async def delete(self, path: str, body: Obj | None = None) -> Obj:
        self._hook("delete", path)
        plural, ns, name, _ = _split(path)
        assert name
        current = self.objects.get((plural, ns, name))
        if current is None:
            raise ApiError(404, "NotFound", path)
        pre = (body or {}).get("preconditions") or {}
        meta = current["metadata"]
        if (
            pre.get("uid", meta["uid"]) != meta["uid"]
            or pre.get("resourceVersion", meta["resourceVersion"]) != (meta["resourceVersion"])
        ):
            raise ApiError(409, "Conflict", "precondition failed")
        self._write("delete", plural, name)
        del self.objects[(plural, ns, name)]
        self._bump("DELETED", plural, current)
        return {}

    async def list_pages(
        self, path: str, params: Mapping[str, Any] | None = None, page: int = 500
    ) -> tuple[list[Obj], str]:
        plural, ns, _, _ = _split(path)
        selector = (params or {}).get("labelSelector")
        items = [
            copy.deepcopy(o)
            for (p, o_ns, _), o in self.objects.items()
            if p == plural and (ns is None or o_ns == ns) and _matches(o, selector)
        ]
        return items, str(self.rv)

    async def watch(
        self,
        path: str,
        resource_version: str,
        params: Mapping[str, Any] | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[Obj]:
        plural, ns, _, _ = _split(path)
        selector = (params or {}).get("labelSelector")
        seen = int(resource_version)
        while True:
            for kind, rv, of, obj in list(self.history):
                if rv <= seen or plural in self.held:
                    continue
                seen = rv
                in_ns = ns is None or obj["metadata"].get("namespace") == ns
                if of == plural and in_ns and _matches(obj, selector):
                    yield {"type": kind, "object": copy.deepcopy(obj)}
            self.changed.clear()
            await self.changed.wait()


async def wait_for(what: str, check: Callable[[], Any], api: FakeApi) -> Any:
    """Wait, woken by API changes, until `check` returns something truthy."""

    async def loop() -> Any:
        while True:
            value = check()
            if value:
                return value
            await asyncio.sleep(0.01)

    try:
        return await asyncio.wait_for(loop(), WAIT_SECONDS)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


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


PORTS = [{"name": "http", "port": 80, "targetPort": 8080}]


@dataclass
class Running:
    api: FakeApi
    controller: EndpointsController
    clock: Clock

    def slices(self) -> list[Obj]:
        return self.api.list_of("endpointslices")

    def shown(self) -> dict[str, tuple[bool, bool, bool]]:
        """Pod name -> (ready, serving, terminating) over all slices."""
        out = {}
        for s in self.slices():
            for ep in s["endpoints"]:
                c = ep["conditions"]
                out[ep["targetRef"]["name"]] = (c["ready"], c["serving"], c["terminating"])
        return out

    def slice_writes(self) -> list[tuple[str, str, str]]:
        return [w for w in self.api.writes if w[1] == "endpointslices"]


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    api = FakeApi()
    clock = Clock()
    for i in range(3):
        api.put("nodes", node_obj(i))
    controller = EndpointsController(cast(Rest, api), min_interval=1.0, clock=clock)
    task = asyncio.create_task(controller.run())
    try:
        yield Running(api, controller, clock)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def start(r: Running, pods: int, ports: list[Obj] | None = PORTS) -> None:
    for i in range(pods):
        r.api.put("pods", pod_obj(i))
    r.api.put("serviceworkloads", sw_obj(ports))
    if ports is not None:
        await wait_for(f"{pods} endpoints", lambda: len(r.shown()) == pods, r.api)


async def test_service_and_slices_for_a_new_workload(running: Running) -> None:
    await start(running, 250)
    svc = running.api.get_obj("services", "web")
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


async def test_first_change_after_quiet_goes_out_at_once_then_bursts_coalesce(
    running: Running,
) -> None:
    await start(running, 150)
    running.clock.now += 5  # quiet for longer than the interval
    before = len(running.slice_writes())
    running.api.edit("pods", "web-1", set_ready(False))
    await wait_for("the first flip", lambda: running.shown()["web-1"][0] is False, running.api)
    assert len(running.slice_writes()) == before + 1, "one flip, one slice write"

    # A burst within the interval is held, then written together when the interval ends.
    for i in range(2, 12):
        running.api.edit("pods", f"web-{i}", set_ready(False))
    key = f"{NS}/web"
    await wait_for(
        "the burst to be held", lambda: running.controller.held_until.get(key), running.api
    )
    assert len(running.slice_writes()) == before + 1
    assert running.shown()["web-5"][0] is True, "not written before the interval ends"
    running.clock.now += 1.0
    running.controller.enqueue(key)  # what the coalescing timer does when it fires
    await wait_for(
        "the burst",
        lambda: all(running.shown()[f"web-{i}"][0] is False for i in range(2, 12)),
        running.api,
    )
    assert len(running.slice_writes()) <= before + 3, "the burst is one write per slice"


async def test_one_flip_writes_one_slice(running: Running) -> None:
    await start(running, 300)
    running.clock.now += 5
    before = len(running.slice_writes())
    running.api.edit("pods", "web-123", set_ready(False))
    await wait_for("the flip", lambda: running.shown()["web-123"][0] is False, running.api)
    assert running.slice_writes()[before:] == [
        ("update", "endpointslices", running.slice_writes()[before][2])
    ]


async def test_conflicting_write_is_re_read_and_re_planned(running: Running) -> None:
    await start(running, 20)
    running.clock.now += 5
    (victim,) = running.slices()
    name = victim["metadata"]["name"]

    def meddle(verb: str, plural: str, obj_name: str) -> None:
        """Someone else rewrites the slice between our plan and our write, once."""
        if plural == "endpointslices" and obj_name == name and verb == "update":
            running.api.before_write = None
            current = running.api.objects[("endpointslices", NS, name)]
            current["metadata"]["annotations"] = {"touched": "yes"}
            running.api.rv += 1
            current["metadata"]["resourceVersion"] = str(running.api.rv)

    running.api.held.add("endpointslices")  # the watch cannot tell the controller either
    running.api.before_write = meddle
    running.api.edit("pods", "web-3", set_ready(False))
    await wait_for("the flip", lambda: running.shown()["web-3"][0] is False, running.api)
    running.api.release("endpointslices")
    (after,) = running.slices()
    assert after["metadata"]["annotations"] == {"touched": "yes"}, "the other writer's change"
    assert len(running.shown()) == 20


async def test_a_lagging_watch_never_makes_a_second_slice(running: Running) -> None:
    running.api.held.add("endpointslices")  # our own creates stay invisible to the informer
    await start(running, 10)
    running.clock.now += 5
    running.api.edit("pods", "web-4", set_ready(False))
    await wait_for("the flip", lambda: running.shown()["web-4"][0] is False, running.api)
    assert len(running.slices()) == 1
    assert [w[0] for w in running.slice_writes()] == ["create", "update"]
    running.api.release("endpointslices")


async def test_new_pods_and_gone_pods(running: Running) -> None:
    await start(running, 5)
    running.clock.now += 5
    running.api.put("pods", pod_obj(7))
    await wait_for("a new pod", lambda: "web-7" in running.shown(), running.api)
    running.clock.now += 5
    running.api.edit("pods", "web-2", lambda p: p["status"].update(phase="Succeeded"))
    await wait_for("a finished pod", lambda: "web-2" not in running.shown(), running.api)
    assert sorted(running.shown()) == ["web-0", "web-1", "web-3", "web-4", "web-7"]


async def test_draining_pod_leaves_rotation_then_is_marked_drained(running: Running) -> None:
    await start(running, 5)
    running.clock.now += 5
    running.api.edit(
        "pods",
        "web-2",
        lambda p: p["metadata"]["annotations"].update({ANNOTATION_DRAIN: "2030-01-01T00:00:00Z"}),
    )

    def drained() -> str | None:
        pod = running.api.get_obj("pods", "web-2")
        return None if pod is None else pod["metadata"]["annotations"].get(ANNOTATION_DRAINED)

    await wait_for("drained-at", drained, running.api)
    assert running.shown()["web-2"] == (False, True, True)
    order = [(w[0], w[1]) for w in running.api.writes]
    slice_write = max(i for i, w in enumerate(order) if w == ("update", "endpointslices"))
    pod_patch = order.index(("patch", "pods"))
    assert slice_write < pod_patch, "drained-at only after the slice write succeeded"


async def test_foreign_service_is_left_alone_and_reported(running: Running) -> None:
    running.api.put(
        "services",
        {
            "metadata": {"name": "web", "namespace": NS},
            "spec": {"ports": [{"name": "x", "port": 1}], "selector": {"app": "x"}},
        },
    )
    foreign = copy.deepcopy(running.api.get_obj("services", "web"))
    await start(running, 3, ports=None)
    running.api.edit(
        "serviceworkloads", "web", lambda sw: sw["spec"].update(service={"ports": PORTS})
    )

    def reported() -> list[Obj]:
        return [e for e in running.api.list_of("events") if e["reason"] == REASON_SERVICE_NOT_OWNED]

    (event,) = await wait_for("the event", reported, running.api)
    assert event["regarding"]["name"] == "web" and event["type"] == "Warning"
    assert running.api.get_obj("services", "web") == foreign
    assert running.slices() == []


async def test_port_change_patches_the_service_and_keeps_its_address(running: Running) -> None:
    await start(running, 4)
    before = copy.deepcopy(running.api.get_obj("services", "web"))
    assert before is not None
    new_ports = [{"name": "http", "port": 81, "targetPort": 9090}]
    running.clock.now += 5
    running.api.edit(
        "serviceworkloads", "web", lambda sw: sw["spec"]["service"].update(ports=new_ports)
    )

    def moved() -> bool:
        return bool(running.slices()) and all(
            s["ports"][0]["port"] == 9090 for s in running.slices()
        )

    await wait_for("slices on the new port", moved, running.api)
    after = running.api.get_obj("services", "web")
    assert after is not None
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["spec"]["clusterIP"] == before["spec"]["clusterIP"]
    assert after["spec"]["ports"][0]["port"] == 81
    assert len(running.shown()) == 4


async def test_unsetting_the_service_deletes_it(running: Running) -> None:
    await start(running, 2)
    running.api.edit("serviceworkloads", "web", lambda sw: sw["spec"].pop("service"))
    await wait_for(
        "the Service gone", lambda: running.api.get_obj("services", "web") is None, running.api
    )


async def test_a_failed_write_is_reported_on_the_workload_and_retried(running: Running) -> None:
    def fail_once(verb: str, plural: str, name: str) -> None:
        if plural == "endpointslices" and verb == "create":
            running.api.before_write = None
            raise ApiError(500, "InternalError", "etcd is having a moment")

    running.api.before_write = fail_once
    await start(running, 3)  # the retry got there
    (event,) = [e for e in running.api.list_of("events") if e["reason"] == REASON_SYNC_FAILED]
    assert "etcd is having a moment" in event["note"] and event["type"] == "Warning"
    assert event["regarding"]["kind"] == "ServiceWorkload"
