"""The controller's act layer against an in-memory API: conditional writes, expectations
(a lagging watch or a lost answer never doubles a create or a drain), restarts, drains,
the progress deadline and the status it writes.

The fake speaks the subset of the REST API the controller and its informers use: create,
get, JSON patch (with `test` ops, 422 when one fails, status subresource), delete with
preconditions (graceful for pods bound to a node), list with label selectors, and a watch
as a log of events. A test lets the watch catch up explicitly (`catch_up`), so everything
between two catch-ups is exactly the lag the controller must survive.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import random
from collections.abc import AsyncIterator, Mapping
from typing import Any

import jsonpatch
import pytest

from pilotfish.api.serviceworkload import AVAILABLE, PROGRESSING, STALLED
from pilotfish.kube.rest import JSON_PATCH, MERGE_PATCH, ApiError
from pilotfish.operators.serviceworkload.controller import CreateFailed, ServiceWorkloadController
from pilotfish.operators.serviceworkload.progress import (
    REASON_COMPLETE,
    REASON_DEADLINE_EXCEEDED,
    REASON_IN_PROGRESS,
    REASON_PAUSED,
)
from pilotfish.operators.serviceworkload.revisions import template_hash
from pilotfish.operators.serviceworkload.sync import format_time
from pilotfish.workloads import (
    ANNOTATION_DRAIN,
    ANNOTATION_DRAINED,
    LABEL_REVISION,
    LABEL_WORKLOAD,
    PROPAGATION_SECONDS,
)

Obj = dict[str, Any]
T0 = 1_700_000_000.0
KEY = "ns/web"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _parse(path: str) -> tuple[str, str | None, str | None, str | None]:
    parts = path.strip("/").split("/")
    parts = parts[2:] if parts[0] == "api" else parts[3:]
    ns = None
    if parts[0] == "namespaces" and len(parts) > 2:
        ns, parts = parts[1], parts[2:]
    plural = parts[0]
    name = parts[1] if len(parts) > 1 else None
    sub = parts[2] if len(parts) > 2 else None
    return plural, ns, name, sub


def _selected(obj: Obj, selector: str | None) -> bool:
    if not selector:
        return True
    labels = obj["metadata"].get("labels") or {}
    for term in selector.split(","):
        if "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k) != v:
                return False
        elif term not in labels:
            return False
    return True


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(out.get(k), v)
    return out


class FakeApi:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.objects: dict[str, dict[tuple[str | None, str], Obj]] = {}
        self.rv = itertools.count(100)
        self.uids = itertools.count(1)
        self.calls: list[tuple[str, str]] = []
        self.lose_answers = 0  # creates that commit but whose answer is lost (timeout)
        self.log: list[tuple[str, str, Obj]] = []  # (plural, event type, object): the watch
        self.positions: dict[int, int] = {}  # how far each informer has read the log
        self.changed = asyncio.Event()

    def _record(self, plural: str, kind: str, obj: Obj) -> None:
        self.log.append((plural, kind, copy.deepcopy(obj)))
        self.changed.set()

    # helpers for tests ------------------------------------------------------------------

    def put(self, plural: str, obj: Obj) -> Obj:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{next(self.uids)}")
        meta.setdefault("creationTimestamp", format_time(self.clock.now))
        meta["resourceVersion"] = str(next(self.rv))
        store = self.objects.setdefault(plural, {})
        kind = "MODIFIED" if (meta.get("namespace"), meta["name"]) in store else "ADDED"
        store[(meta.get("namespace"), meta["name"])] = obj
        self._record(plural, kind, obj)
        return obj

    def remove(self, plural: str, name: str) -> None:
        self._record(plural, "DELETED", self.objects[plural].pop(("ns", name)))

    def all(self, plural: str) -> list[Obj]:
        return list(self.objects.get(plural, {}).values())

    def pods(self, *, live: bool = True) -> list[Obj]:
        return [
            p for p in self.all("pods") if not (live and p["metadata"].get("deletionTimestamp"))
        ]

    def edit(self, plural: str, name: str, change: Any) -> Obj:
        obj = self.objects[plural][("ns", name)]
        change(obj)
        obj["metadata"]["resourceVersion"] = str(next(self.rv))
        self._record(plural, "MODIFIED", obj)
        return obj

    def make_ready(self, *, revision: str | None = None, at: float | None = None) -> None:
        when = format_time(self.clock.now if at is None else at)
        for p in self.pods():
            if revision and p["metadata"]["labels"][LABEL_REVISION] != revision:
                continue
            if p.get("status", {}).get("phase") == "Running":
                continue
            p["spec"]["nodeName"] = "kwok-1"
            p["status"] = {
                "phase": "Running",
                "podIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": when}],
            }
            p["metadata"]["resourceVersion"] = str(next(self.rv))
            self._record("pods", "MODIFIED", p)

    # the REST surface -------------------------------------------------------------------

    async def create(self, path: str, body: Obj) -> Obj:
        plural, ns, _, _ = _parse(path)
        self.calls.append(("create", plural))
        body = copy.deepcopy(body)
        body["metadata"].setdefault("namespace", ns)
        if (ns, body["metadata"]["name"]) in self.objects.get(plural, {}):
            raise ApiError(409, "AlreadyExists", f"{plural} {body['metadata']['name']} exists")
        if plural == "serviceworkloads":
            body["metadata"]["generation"] = 1
        out = copy.deepcopy(self.put(plural, body))
        if plural == "pods" and self.lose_answers:
            self.lose_answers -= 1
            raise TimeoutError("the answer was lost")
        return out

    async def get(self, path: str, **_params: Any) -> Obj:
        plural, ns, name, _sub = _parse(path)
        try:
            return copy.deepcopy(self.objects[plural][(ns, str(name))])
        except KeyError:
            raise ApiError(404, "NotFound", path) from None

    async def patch(self, path: str, body: Any, content_type: str = JSON_PATCH) -> Obj:
        plural, ns, name, sub = _parse(path)
        self.calls.append(("patch", f"{plural}/{sub}" if sub else plural))
        current = self.objects.get(plural, {}).get((ns, str(name)))
        if current is None:
            raise ApiError(404, "NotFound", path)
        if plural == "controllerrevisions":
            # As the real API server does with revisions Python wrote: a patch re-encodes the
            # RawExtension `data`, which then differs byte-wise from what is stored.
            raise ApiError(422, "Invalid", "data: Invalid value: field is immutable")
        if content_type == MERGE_PATCH:
            patched = _merge(copy.deepcopy(current), body)
        else:
            assert content_type == JSON_PATCH
            try:
                patched = jsonpatch.apply_patch(current, body)
            except jsonpatch.JsonPatchTestFailed as e:
                raise ApiError(422, "Invalid", str(e)) from None
        if sub == "status":
            result = copy.deepcopy(current)
            result["status"] = patched.get("status")
        else:
            result = patched
            if plural == "serviceworkloads" and patched.get("spec") != current.get("spec"):
                result["metadata"]["generation"] += 1
        result["metadata"]["resourceVersion"] = str(next(self.rv))
        self.objects[plural][(ns, str(name))] = result
        self._record(plural, "MODIFIED", result)
        return copy.deepcopy(result)

    async def delete(self, path: str, body: Obj | None = None) -> Obj:
        plural, ns, name, _ = _parse(path)
        self.calls.append(("delete", plural))
        store = self.objects.get(plural, {})
        current = store.get((ns, str(name)))
        if current is None:
            raise ApiError(404, "NotFound", path)
        pre = (body or {}).get("preconditions") or {}
        meta = current["metadata"]
        if "uid" in pre and pre["uid"] != meta["uid"]:
            raise ApiError(409, "Conflict", "uid precondition")
        if "resourceVersion" in pre and pre["resourceVersion"] != meta["resourceVersion"]:
            raise ApiError(409, "Conflict", "resourceVersion precondition")
        if plural == "pods" and current["spec"].get("nodeName"):
            meta["deletionTimestamp"] = format_time(self.clock.now + 30)
            meta["resourceVersion"] = str(next(self.rv))
            self._record(plural, "MODIFIED", current)
            return copy.deepcopy(current)
        del store[(ns, str(name))]
        self._record(plural, "DELETED", current)
        return copy.deepcopy(current)

    async def watch(
        self,
        path: str,
        resource_version: str,
        params: Mapping[str, Any] | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[Obj]:
        """Events after `resource_version`, waiting for new ones until the timeout."""
        plural, _, _, _ = _parse(path)
        name = str((params or {}).get("fieldSelector", "")).removeprefix("metadata.name=")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        pos = 0
        while True:
            while pos < len(self.log):
                kind_plural, kind, obj = self.log[pos]
                pos += 1
                meta = obj["metadata"]
                newer = int(meta["resourceVersion"]) > int(resource_version)
                if kind_plural == plural and newer and (not name or meta["name"] == name):
                    yield {"type": kind, "object": copy.deepcopy(obj)}
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), deadline - loop.time())
            except TimeoutError:
                return

    async def list_pages(
        self, path: str, params: Mapping[str, Any] | None = None, page: int = 500
    ) -> tuple[list[Obj], str]:
        plural, ns, _, _ = _parse(path)
        selector = (params or {}).get("labelSelector")
        items = [
            copy.deepcopy(o)
            for (ons, _), o in self.objects.get(plural, {}).items()
            if (ns is None or ons == ns) and _selected(o, selector)
        ]
        return items, str(next(self.rv))


def template(image: str = "app:1", **spec: Any) -> Obj:
    return {
        "metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": image}], **spec},
    }


def workload(replicas: int = 3, **spec: Any) -> Obj:
    return {
        "apiVersion": "pilotfish.io/v1alpha1",
        "kind": "ServiceWorkload",
        "metadata": {"name": "web", "namespace": "ns", "generation": 1},
        "spec": {"team": "payments", "replicas": replicas, "template": template(), **spec},
    }


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def api(clock: Clock) -> FakeApi:
    return FakeApi(clock)


def controller(api: FakeApi, clock: Clock) -> ServiceWorkloadController:
    return ServiceWorkloadController(api, clock=clock, rng=random.Random(7))  # type: ignore[arg-type]


async def catch_up(ctrl: ServiceWorkloadController, api: FakeApi) -> None:
    """The watch delivers everything that happened so far (the first time: the list)."""
    for informer in (ctrl.sws, ctrl.pods, ctrl.revisions, ctrl.pdbs):
        seen = api.positions.get(id(informer))
        if seen is None:
            await informer.relist()
            api.positions[id(informer)] = len(api.log)
            continue
        selector = informer.params.get("labelSelector")
        for plural, kind, obj in api.log[seen:]:
            if plural == informer.resource.plural and _selected(obj, selector):
                informer._apply({"type": kind, "object": copy.deepcopy(obj)})
        api.positions[id(informer)] = len(api.log)


async def sync(ctrl: ServiceWorkloadController) -> None:
    api: FakeApi = ctrl.rest  # type: ignore[assignment]
    await catch_up(ctrl, api)
    await ctrl.sync(KEY)


def sw_status(api: FakeApi) -> Obj:
    status: Obj = api.objects["serviceworkloads"][("ns", "web")].get("status") or {}
    return status


def condition(api: FakeApi, type_: str) -> tuple[str, str]:
    for c in sw_status(api).get("conditions") or []:
        if c["type"] == type_:
            return c["status"], c["reason"]
    raise AssertionError(f"no {type_} condition in {sw_status(api)}")


def set_template(api: FakeApi, tpl: Obj) -> None:
    def change(sw: Obj) -> None:
        sw["spec"]["template"] = tpl
        sw["metadata"]["generation"] += 1

    api.edit("serviceworkloads", "web", change)


# -- replicas ------------------------------------------------------------------------------


async def test_creates_the_replicas_a_revision_a_pdb_and_reports_them(
    api: FakeApi, clock: Clock
) -> None:
    api.put("serviceworkloads", workload())
    ctrl = controller(api, clock)
    await sync(ctrl)
    pods = api.pods()
    h = template_hash(template())
    assert len(pods) == 3
    for p in pods:
        assert p["metadata"]["name"].startswith(f"web-{h}-")
        assert p["metadata"]["labels"][LABEL_WORKLOAD] == "web"
        assert p["metadata"]["labels"][LABEL_REVISION] == h
        assert p["metadata"]["ownerReferences"][0]["name"] == "web"
    (rev,) = api.all("controllerrevisions")
    assert (rev["metadata"]["name"], rev["revision"], rev["data"]) == (f"web-{h}", 1, template())
    (pdb,) = api.all("poddisruptionbudgets")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert condition(api, PROGRESSING) == ("True", REASON_IN_PROGRESS)
    assert condition(api, AVAILABLE)[0] == "False"

    clock.now += 2
    api.make_ready()
    await sync(ctrl)
    status = sw_status(api)
    assert (status["readyReplicas"], status["availableReplicas"]) == (3, 3)
    assert (status["currentRevision"], status["updateRevision"]) == (h, h)
    assert status["observedGeneration"] == 1
    assert condition(api, AVAILABLE) == ("True", "MinimumReplicasAvailable")
    assert condition(api, PROGRESSING) == ("True", REASON_COMPLETE)
    assert condition(api, STALLED) == ("False", REASON_COMPLETE)


async def test_a_lagging_watch_never_doubles_the_creates(api: FakeApi, clock: Clock) -> None:
    api.put("serviceworkloads", workload())
    ctrl = controller(api, clock)
    await sync(ctrl)
    assert len(api.pods()) == 3
    for _ in range(3):
        await ctrl.sync(KEY)  # no catch-up: the informer has not seen any pod yet
    assert len(api.pods()) == 3


async def test_a_restarted_controller_lists_before_it_creates(api: FakeApi, clock: Clock) -> None:
    api.put("serviceworkloads", workload(strategy={"maxSurge": 1}))
    await sync(controller(api, clock))
    # The old process dies here; the new one has no memory of what it created.
    await sync(controller(api, clock))
    assert len(api.pods()) == 3


async def test_a_create_whose_answer_is_lost_still_counts(api: FakeApi, clock: Clock) -> None:
    api.put("serviceworkloads", workload())
    api.lose_answers = 1
    ctrl = controller(api, clock)
    with pytest.raises(CreateFailed):
        await sync(ctrl)  # slow start: the first create "times out", the batch stops
    assert len(api.pods()) == 1
    await ctrl.sync(KEY)  # the watch has not shown it: the expectation still counts it
    assert len(api.pods()) == 3
    await sync(ctrl)
    assert len(api.pods()) == 3


async def test_refused_creates_back_off_with_an_error(api: FakeApi, clock: Clock) -> None:
    api.put("serviceworkloads", workload())
    ctrl = controller(api, clock)

    async def refuse(path: str, body: Obj) -> Obj:
        if "/pods" in path:
            raise ApiError(403, "Forbidden", "quota exceeded for team payments")
        return await FakeApi.create(api, path, body)

    api.create = refuse  # type: ignore[method-assign]
    with pytest.raises(CreateFailed, match="quota exceeded"):
        await sync(ctrl)
    creates = [c for c in api.calls if c == ("create", "pods")]
    assert creates == [], "the fake refused before recording; nothing was created"
    assert api.pods() == []


async def test_failed_and_deleted_pods_are_replaced(api: FakeApi, clock: Clock) -> None:
    api.put("serviceworkloads", workload())
    ctrl = controller(api, clock)
    await sync(ctrl)
    api.make_ready()
    first, second, _ = sorted(p["metadata"]["name"] for p in api.pods())
    api.edit("pods", first, lambda p: p["status"].update(phase="Failed", reason="Evicted"))
    api.remove("pods", second)
    await sync(ctrl)
    names = {p["metadata"]["name"] for p in api.pods()}
    assert len(names) == 3 and first not in names and second not in names
    assert api.objects["pods"][("ns", first)]["metadata"].get("deletionTimestamp"), "graceful"


async def test_pods_of_another_owner_are_never_counted(api: FakeApi, clock: Clock) -> None:
    api.put("serviceworkloads", workload(replicas=1))
    api.put(
        "pods",
        {
            "metadata": {"name": "stray", "namespace": "ns", "labels": {LABEL_WORKLOAD: "web"}},
            "spec": {},
        },
    )
    await sync(controller(api, clock))
    assert len(api.pods()) == 2
    assert "stray" in {p["metadata"]["name"] for p in api.pods()}


# -- rollouts --------------------------------------------------------------------------------


async def ready_workload(api: FakeApi, clock: Clock, **spec: Any) -> ServiceWorkloadController:
    api.put("serviceworkloads", workload(**spec))
    ctrl = controller(api, clock)
    await sync(ctrl)
    clock.now += 1
    api.make_ready()
    await sync(ctrl)
    assert condition(api, PROGRESSING) == ("True", REASON_COMPLETE)
    return ctrl


async def test_rollout_drains_before_deleting_and_never_drains_twice_on_a_stale_view(
    api: FakeApi, clock: Clock
) -> None:
    ctrl = await ready_workload(
        api, clock, replicas=2, service={"ports": [{"name": "http", "port": 80}]}
    )
    old = template_hash(template())
    set_template(api, template("app:2"))
    await sync(ctrl)
    new = template_hash(template("app:2"))
    assert sorted(p["metadata"]["labels"][LABEL_REVISION] for p in api.pods()) == sorted(
        [old, old, new]
    )
    clock.now += 1
    api.make_ready(revision=new)
    await sync(ctrl)
    draining = [p for p in api.pods() if ANNOTATION_DRAIN in p["metadata"].get("annotations", {})]
    assert len(draining) == 1 and draining[0]["metadata"]["labels"][LABEL_REVISION] == old
    await ctrl.sync(KEY)  # the drain annotation has not come back through the watch yet
    draining = [p for p in api.pods() if ANNOTATION_DRAIN in p["metadata"].get("annotations", {})]
    assert len(draining) == 1, "a stale view must not drain a second available pod"
    assert len(api.pods()) == 3, "the draining pod still counts toward the surge"

    victim = draining[0]["metadata"]["name"]
    api.edit(
        "pods",
        victim,
        lambda p: p["metadata"]["annotations"].update({ANNOTATION_DRAINED: format_time(clock.now)}),
    )
    await sync(ctrl)
    assert not api.objects["pods"][("ns", victim)]["metadata"].get("deletionTimestamp")
    clock.now += PROPAGATION_SECONDS
    await sync(ctrl)
    assert api.objects["pods"][("ns", victim)]["metadata"].get("deletionTimestamp")


async def test_a_never_ready_rollout_stalls_at_its_deadline(api: FakeApi, clock: Clock) -> None:
    ctrl = await ready_workload(api, clock, strategy={"progressDeadlineSeconds": 60})
    wakes: list[tuple[str, float]] = []
    add_after = ctrl.queue.add_after

    def spy(key: str, delay: float) -> None:
        wakes.append((key, delay))
        add_after(key, delay)

    ctrl.queue.add_after = spy  # type: ignore[method-assign]
    set_template(api, template("broken:1"))
    await sync(ctrl)
    assert len(api.pods()) == 4, "the surge, and no more"
    assert wakes and wakes[-1][0] == KEY and 59 < wakes[-1][1] <= 61, "a wake-up, not polling"
    clock.now += 30
    await sync(ctrl)
    assert condition(api, STALLED) == ("False", REASON_IN_PROGRESS)
    clock.now += 31
    await sync(ctrl)
    assert condition(api, STALLED) == ("True", REASON_DEADLINE_EXCEEDED)
    assert condition(api, PROGRESSING) == ("False", REASON_DEADLINE_EXCEEDED)
    assert condition(api, AVAILABLE)[0] == "True", "the old pods keep serving"
    assert len(api.pods()) == 4

    # Undo by spec: the old template again reuses its revision, renumbered.
    set_template(api, template())
    await sync(ctrl)
    clock.now += 1
    await sync(ctrl)
    numbers = {r["metadata"]["name"]: r["revision"] for r in api.all("controllerrevisions")}
    assert numbers[f"web-{template_hash(template())}"] == 3
    assert numbers[f"web-{template_hash(template('broken:1'))}"] == 2
    revisions = {p["metadata"]["labels"][LABEL_REVISION] for p in api.pods()}
    assert revisions == {template_hash(template())}, "the broken pod went without a drain"
    assert condition(api, PROGRESSING) == ("True", REASON_COMPLETE)


async def test_paused_workloads_roll_nothing_but_still_scale(api: FakeApi, clock: Clock) -> None:
    ctrl = await ready_workload(api, clock, strategy={"paused": True})
    set_template(api, template("app:2"))
    await sync(ctrl)
    assert {p["metadata"]["labels"][LABEL_REVISION] for p in api.pods()} == {
        template_hash(template())
    }
    assert condition(api, PROGRESSING) == ("Unknown", REASON_PAUSED)
    api.edit("serviceworkloads", "web", lambda sw: sw["spec"].update(replicas=4))
    await sync(ctrl)
    assert len(api.pods()) == 4
    assert {p["metadata"]["labels"][LABEL_REVISION] for p in api.pods()} == {
        template_hash(template())
    }, "paused: replacements and scale-ups run the stable revision"


async def test_status_writes_are_conditional_on_the_version_read(
    api: FakeApi, clock: Clock
) -> None:
    api.put("serviceworkloads", workload())
    ctrl = controller(api, clock)
    await catch_up(ctrl, api)
    api.edit("serviceworkloads", "web", lambda sw: sw["spec"].update(replicas=5))
    await ctrl.sync(KEY)  # decided from replicas=3: the status write must be refused
    assert "status" not in api.objects["serviceworkloads"][("ns", "web")]
    await sync(ctrl)
    assert sw_status(api)["observedGeneration"] == 1
    assert len(api.pods()) == 5


async def test_history_beyond_the_limit_is_pruned(api: FakeApi, clock: Clock) -> None:
    ctrl = await ready_workload(api, clock, replicas=1, strategy={"revisionHistoryLimit": 1})
    for image in ("app:2", "app:3", "app:4"):
        set_template(api, template(image))
        for _ in range(4):
            clock.now += 1
            api.make_ready()
            await sync(ctrl)
            for p in api.pods(live=False):
                if p["metadata"].get("deletionTimestamp"):
                    api.remove("pods", p["metadata"]["name"])
    numbers = sorted(r["revision"] for r in api.all("controllerrevisions"))
    assert numbers == [3, 4], "the update revision and one old one"


async def test_a_create_the_watch_never_reported_is_looked_up_not_waited_for(
    api: FakeApi, clock: Clock
) -> None:
    """A pod created and deleted while the watch was down (410 Gone, relist) never shows up
    as an event; after CREATE_CONFIRM_SECONDS the controller asks the API instead of
    counting a phantom until the 5-minute expectation TTL."""
    ticks = Clock()
    api.put("serviceworkloads", workload(replicas=1))
    ctrl = ServiceWorkloadController(
        api,  # type: ignore[arg-type]
        clock=clock,
        rng=random.Random(1),
        monotonic=ticks,
    )
    await sync(ctrl)
    (pod,) = api.pods()
    api.remove("pods", pod["metadata"]["name"])
    api.positions.clear()  # the watch expired: the informers relist and see no event for it
    await sync(ctrl)
    assert api.pods() == [], "still expected: no second pod yet"
    ticks.now += 31
    await sync(ctrl)
    assert len(api.pods()) == 1


async def test_a_persistently_refused_write_backs_off_instead_of_looping(
    api: FakeApi, clock: Clock
) -> None:
    ctrl = await ready_workload(api, clock)
    api.edit("poddisruptionbudgets", "web", lambda pdb: pdb["spec"].update(maxUnavailable=7))
    real_patch = api.patch

    async def refuse_pdb(path: str, body: Any, content_type: str = JSON_PATCH) -> Obj:
        if "poddisruptionbudgets" in path:
            raise ApiError(422, "Invalid", "spec: something the API server keeps refusing")
        return await real_patch(path, body, content_type)

    api.patch = refuse_pdb  # type: ignore[method-assign]
    delays: list[float] = []
    add_after = ctrl.queue.add_after

    def spy(key: str, delay: float) -> None:
        delays.append(delay)
        add_after(key, delay)

    ctrl.queue.add_after = spy  # type: ignore[method-assign]
    for _ in range(4):
        await sync(ctrl)
    assert delays == [0.05, 0.1, 0.2, 0.4]
    api.patch = real_patch  # type: ignore[method-assign]
    await sync(ctrl)
    assert api.objects["poddisruptionbudgets"][("ns", "web")]["spec"]["maxUnavailable"] == 1
    assert "ns/web" not in ctrl.refusals
