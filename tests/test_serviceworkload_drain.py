"""Planned maintenance and the real ServiceWorkload controller: a surge-first workload keeps
a replacement elsewhere for each of its pods on a draining node and never takes the old pod
down itself; the drain's eviction brings the count back to `replicas` with no delete. The
maintenance controller is played by the test: it annotates and cordons nodes, and evicts
(a graceful delete, as the Eviction API does) once the workload has `replicas` Ready pods
off draining nodes.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest

from pilotfish import names
from pilotfish.api.serviceworkload import AVAILABLE, PROGRESSING
from pilotfish.kube.rest import NODES, PODS, SERVICEWORKLOADS
from pilotfish.operators.serviceworkload.progress import REASON_COMPLETE
from pilotfish.operators.serviceworkload.revisions import template_hash
from pilotfish.timeutil import FakeClock, format_time
from pilotfish.workloads import ANNOTATION_DRAIN, LABEL_REVISION
from tests.amo_harness import Machines, create
from tests.rollout_harness import (
    KUBELET,
    SW,
    T0,
    Lagging,
    World,
    condition,
    set_template,
    start,
    status,
    template,
    workload,
)

Obj = dict[str, Any]
NODE_NAMES = ("n1", "n2", "n3")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
async def world(clock: FakeClock) -> AsyncIterator[World]:
    api = Lagging()
    for n in NODE_NAMES:
        api.put(NODES.path(name=n), {"metadata": {"name": n}, "spec": {}})
    w = await start(api, clock)
    yield w
    await w.stop()


# -- the cluster's side ----------------------------------------------------------------------


def node_of(pod: Obj) -> str | None:
    node = pod["spec"].get("nodeName")
    return str(node) if node else None


def cordoned(api: Lagging) -> set[str]:
    return {
        n["metadata"]["name"]
        for n in api.store("v1", "nodes").values()
        if n["spec"].get("unschedulable")
    }


def schedule(api: Lagging, clock: FakeClock, onto: Iterable[str] | None = None) -> None:
    """kube-scheduler and the kubelet: each unbound pod onto the next schedulable node (or
    the nodes given, in turn), running and Ready from now."""
    targets = itertools.cycle(
        list(onto) if onto is not None else [n for n in NODE_NAMES if n not in cordoned(api)]
    )
    for p in api.pods():
        if node_of(p):
            continue
        node = next(targets)

        def run(pod: Obj, node: str = node) -> None:
            pod["metadata"]["finalizers"] = [KUBELET]
            pod["spec"]["nodeName"] = node
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

        api.edit(PODS.path("ns", p["metadata"]["name"]), run)


def start_drain(api: Lagging, node: str, maintenance: str = "nm1") -> None:
    """The maintenance controller's cordon: one patch, unschedulable and the annotations."""

    def cordon(n: Obj) -> None:
        n["spec"]["unschedulable"] = True
        n["metadata"]["annotations"] = {
            names.ANNOTATION_DRAINING: maintenance,
            names.ANNOTATION_CORDONED_BY: maintenance,
        }

    api.edit(NODES.path(name=node), cordon)


def end_drain(api: Lagging, node: str) -> None:
    def uncordon(n: Obj) -> None:
        n["spec"].pop("unschedulable", None)
        n["metadata"].pop("annotations", None)

    api.edit(NODES.path(name=node), uncordon)


async def evict(api: Lagging, pod: Obj) -> None:
    """The Eviction API: the pod is deleted gracefully and stays Terminating for a while."""
    await api.delete(PODS.path("ns", pod["metadata"]["name"]))


def on(api: Lagging, node: str) -> list[Obj]:
    return [p for p in api.pods() if node_of(p) == node]


def off_draining_ready(api: Lagging, draining: set[str]) -> int:
    return sum(
        1
        for p in api.pods()
        if node_of(p) not in draining and (p.get("status") or {}).get("phase") == "Running"
    )


def taken_down(api: Lagging) -> list[str]:
    """Pods the controller drained or deleted (evictions are the test's own)."""
    return [
        p["metadata"]["name"]
        for p in api.pods(live=False)
        if ANNOTATION_DRAIN in (p["metadata"].get("annotations") or {})
    ]


async def running(world: World, replicas: int, **spec: Any) -> None:
    world.api.put(SERVICEWORKLOADS.path("ns"), workload(replicas, **spec))
    await world.converge()
    schedule(world.api, world.clock)
    await world.converge()
    assert len(world.api.pods()) == replicas


# -- surge-first ------------------------------------------------------------------------------


async def test_default_workload_surges_elsewhere_and_the_eviction_returns_it_to_replicas(
    world: World,
) -> None:
    api, clock = world.api, world.clock
    await running(world, 3)
    [old] = on(api, "n1")

    start_drain(api, "n1")
    await world.converge()
    assert len(api.pods()) == 4, "one surge for the one pod on the draining node"
    [surge] = [p for p in api.pods() if not node_of(p)]
    assert condition(api, PROGRESSING) == ("True", REASON_COMPLETE), "a drain is no rollout"

    clock.advance(1)
    schedule(api, clock)
    await world.converge()
    assert node_of(api.obj(PODS.path("ns", surge["metadata"]["name"])) or {}) != "n1"
    assert len(api.pods()) == 4, "the surge is kept: the old pod is the drain's to evict"
    assert taken_down(api) == [] and all(
        not p["metadata"].get("deletionTimestamp") for p in api.pods(live=False)
    ), "the controller never takes the old pod down itself"
    assert off_draining_ready(api, {"n1"}) >= 3, "the maintenance controller may evict now"
    assert condition(api, AVAILABLE)[0] == "True"
    assert condition(api, PROGRESSING) == ("True", REASON_COMPLETE)

    await evict(api, old)
    await world.converge()
    assert len(api.pods()) == 3, "no replacement for the evicted pod: the surge was it"
    assert len(api.pods(live=False)) == 4, "the old pod terminates on its own"
    assert taken_down(api) == []
    api.terminate()
    await world.converge()
    pods = api.pods(live=False)
    assert len(pods) == 3 and all(node_of(p) != "n1" for p in pods)
    assert status(api)["replicas"] == 3


async def test_a_single_replica_workload_is_surged_even_when_it_allows_unavailability(
    world: World,
) -> None:
    api, clock = world.api, world.clock
    await running(world, 1, strategy={"maxSurge": 0, "maxUnavailable": 1})
    [old] = api.pods()
    start_drain(api, str(node_of(old)))
    await world.converge()
    assert len(api.pods()) == 2, "max(1, maxSurge) surges: one"
    clock.advance(1)
    schedule(api, clock)
    await world.converge()
    assert len(api.pods()) == 2 and taken_down(api) == []
    await evict(api, old)
    await world.converge()
    assert len(api.pods()) == 1


async def test_a_workload_that_allows_unavailability_does_nothing_special(world: World) -> None:
    api = world.api
    await running(world, 3, strategy={"maxUnavailable": 1})
    start_drain(api, "n1")
    await world.converge()
    assert len(api.pods()) == 3, "its budget lets the drain evict; it replaces afterwards"
    [old] = on(api, "n1")
    await evict(api, old)
    await world.converge()
    assert len(api.pods()) == 3, "replaced at once"
    assert len([p for p in api.pods() if not node_of(p)]) == 1


async def test_two_pods_on_one_draining_node_surge_one_at_a_time(world: World) -> None:
    api, clock = world.api, world.clock
    api.put(SERVICEWORKLOADS.path("ns"), workload(3))  # maxSurge 1
    await world.converge()
    schedule(api, clock, onto=["n1", "n1", "n2"])
    await world.converge()
    start_drain(api, "n1")
    await world.converge()
    assert len(api.pods()) == 4, "at most max(1, maxSurge) surges at a time"
    clock.advance(1)
    schedule(api, clock)
    await world.converge()
    assert len(api.pods()) == 4, "still one surge while both old pods stay"
    first, second = on(api, "n1")
    await evict(api, first)  # 3 Ready remain without it
    await world.converge()
    assert len(api.pods()) == 4, "the next surge, for the pod still on the node"
    assert len([p for p in api.pods() if not node_of(p)]) == 1
    clock.advance(1)
    schedule(api, clock)
    await world.converge()
    await evict(api, second)
    await world.converge()
    assert len(api.pods()) == 3 and taken_down(api) == []
    assert all(node_of(p) != "n1" for p in api.pods())


async def test_a_drain_that_ends_before_the_eviction_scales_the_surge_away(
    world: World,
) -> None:
    api, clock = world.api, world.clock
    await running(world, 3)
    start_drain(api, "n1")
    await world.converge()
    clock.advance(1)
    schedule(api, clock)
    await world.converge()
    assert len(api.pods()) == 4
    end_drain(api, "n1")
    await world.converge()
    assert len(api.pods()) == 3, "the NodeMaintenance was deleted: back to replicas"
    assert condition(api, AVAILABLE)[0] == "True"


async def test_a_rollout_during_a_drain_never_exceeds_replicas_surge_and_draining_pods(
    world: World,
) -> None:
    api, clock = world.api, world.clock
    await running(world, 3)  # maxSurge 1, maxUnavailable 0
    start_drain(api, "n1")
    set_template(api, template("app:2"))
    new = template_hash(template("app:2"))
    evicted = False
    for _ in range(30):
        await world.converge()
        counted = [
            p for p in api.pods(live=False) if (p.get("status") or {}).get("phase") != "Failed"
        ]
        assert len(counted) <= 3 + 1 + 1, [p["metadata"]["name"] for p in counted]
        live = api.pods()
        ready = [p for p in live if ANNOTATION_DRAIN not in p["metadata"].get("annotations", {})]
        assert len([p for p in ready if node_of(p)]) >= 3, "never below replicas serving"
        if not evicted and off_draining_ready(api, {"n1"}) >= 3:
            for old in on(api, "n1"):
                await evict(api, old)
                evicted = True
        clock.advance(6)
        api.terminate()
        schedule(api, clock)
    await world.converge()
    pods = api.pods(live=False)
    assert evicted
    assert len(pods) == 3 and all(p["metadata"]["labels"][LABEL_REVISION] == new for p in pods)
    assert all(node_of(p) != "n1" for p in pods)
    assert condition(api, PROGRESSING) == ("True", REASON_COMPLETE)


async def test_a_node_annotation_enqueues_only_the_workloads_on_that_node(world: World) -> None:
    api, clock = world.api, world.clock
    for name, node in (("a", "n1"), ("b", "n2")):
        body = workload(1)
        body["metadata"]["name"] = name
        api.put(SERVICEWORKLOADS.path("ns"), body)
        world.key = f"ns/{name}"
        await world.converge()
        schedule(api, clock, onto=[node])
        await world.converge()
    queue = world.ctrl.queue
    await api.settle()
    while len(queue):
        queue.done(await queue.get())

    def heartbeat(n: Obj) -> None:
        n["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}

    api.edit(NODES.path(name="n1"), heartbeat)
    await api.settle()
    assert len(queue) == 0, "a node's heartbeat wakes nobody"
    start_drain(api, "n1")
    await api.settle()
    assert [await queue.get() for _ in range(len(queue))] == ["ns/a"]


# -- at-most-one --------------------------------------------------------------------------------


async def test_an_evicted_at_most_one_pod_is_replaced_only_once_it_is_gone() -> None:
    api = Machines(FakeClock(T0))
    w = await create(api)
    try:
        await w.converge()
        api.schedule()  # web-e1 on n1
        await w.converge()
        api.put(NODES.path(name="n1"), {"metadata": {"name": "n1"}, "spec": {}})
        start_drain(api, "n1")
        await w.converge()
        assert names_of(api.pods(live=False)) == ["web-e1"], "an at-most-one pod is never surged"

        def disrupted(pod: Obj) -> None:
            pod["status"]["conditions"].append(
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
            )

        api.edit(PODS.path("ns", "web-e1"), disrupted)
        await api.delete(PODS.path("ns", "web-e1"))  # the Eviction API's graceful delete
        for _ in range(5):
            api.tick(10)
            await w.converge()
            assert names_of(api.pods(live=False)) == ["web-e1"], "replaced while terminating"
            assert len(api.live()) == 1
        api.kubelets()  # n1's kubelet finishes the termination
        await w.converge()
        [new] = api.pods(live=False)
        assert new["metadata"]["name"] == "web-e2" and api.epoch(new) == 2
        api.schedule()
        await w.converge()
        assert api.live() == ["web-e2"]
    finally:
        await w.stop()


def names_of(pods: list[Obj]) -> list[str]:
    return sorted(str(p["metadata"]["name"]) for p in pods)


async def test_a_workload_scaled_to_zero_during_a_drain_keeps_nothing(world: World) -> None:
    api = world.api
    await running(world, 2)
    start_drain(api, "n1")
    await world.converge()
    assert len(api.pods()) == 3
    api.edit(SW, lambda sw: sw["spec"].update(replicas=0))
    await world.converge()
    api.terminate()
    await world.converge()
    assert api.pods(live=False) == [], "no surge is kept for a workload of 0 replicas"
