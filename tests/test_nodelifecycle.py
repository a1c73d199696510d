"""Node scheduling taints follow the Ready condition; other owners' taints are kept.

`decide` is checked alone; the controller runs on the in-memory API (`tests.fakeapi`) with
the real factory, informer and queue, so a conflict is a real failed JSON-patch `test` and
the backoff is the queue's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from pilotfish.kube.rest import NODES
from pilotfish.kube.runtime import Runtime
from pilotfish.kube.workqueue import DONE
from pilotfish.operators.nodelifecycle import NodeLifecycleController
from pilotfish.operators.nodelifecycle.apply import taint_patch
from pilotfish.operators.nodelifecycle.decide import decide
from pilotfish.operators.nodelifecycle.model import (
    TAINT_NOT_READY,
    TAINT_UNREACHABLE,
    node_view,
)
from tests.fakeapi import FakeApi

OTHER = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
NOT_READY = {"key": TAINT_NOT_READY, "effect": "NoSchedule"}
UNREACHABLE = {"key": TAINT_UNREACHABLE, "effect": "NoSchedule"}
EVICT = {"key": TAINT_UNREACHABLE, "effect": "NoExecute"}
PATH = NODES.path(name="n")


def node(ready: str | None, taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    conds = [] if ready is None else [{"type": "Ready", "status": ready}]
    spec = {} if taints is None else {"taints": taints}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n", "resourceVersion": "7"},
        "spec": spec,
        "status": {"conditions": conds},
    }


@pytest.mark.parametrize(
    ("ready", "taints", "want"),
    [
        ("True", None, None),
        ("True", [NOT_READY], []),
        ("True", [OTHER, NOT_READY], [OTHER]),
        ("False", None, [NOT_READY]),
        ("False", [NOT_READY], None),
        ("Unknown", [NOT_READY], [UNREACHABLE]),
        (None, [OTHER], [OTHER, UNREACHABLE]),
        ("True", [EVICT], None),  # NoExecute is eviction's, not this rule's
    ],
)
def test_decide(
    ready: str | None, taints: list[dict[str, Any]] | None, want: list[dict[str, Any]] | None
) -> None:
    plan = decide(node_view(node(ready, taints)))
    assert (None if plan is None else list(plan.taints)) == want


def test_patch_is_conditional_on_the_version_decided_from() -> None:
    plan = decide(node_view(node("True", [NOT_READY])))
    assert plan is not None
    ops = taint_patch(plan)
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert ops[1] == {"op": "replace", "path": "/spec/taints", "value": []}
    fresh = decide(node_view(node("False")))
    assert fresh is not None and taint_patch(fresh)[1]["op"] == "add"


# --- the controller on the in-memory API ------------------------------------------------


def taints(api: FakeApi) -> list[dict[str, Any]]:
    current = api.obj(PATH)
    assert current is not None
    return list(current["spec"].get("taints") or [])


def patches(api: FakeApi) -> int:
    return sum(1 for c in api.writes(PATH) if c.method == "PATCH")


async def until(what: str, check: Callable[[], bool], api: FakeApi, within: float = 5.0) -> None:
    """Until `check()` holds, looking again whenever the informers caught up."""
    try:
        async with asyncio.timeout(within):
            while not check():
                await api.settle()
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out after {within}s waiting for {what}") from None


@pytest.fixture
async def api() -> FakeApi:
    return FakeApi()


@pytest.fixture
async def informed(api: FakeApi) -> AsyncIterator[NodeLifecycleController]:
    """The controller with its informers running and synced, its queue not (the test turns
    it one key at a time)."""
    api.put(PATH, node("True", [OTHER, NOT_READY]))
    controller = NodeLifecycleController(Runtime.build(api))
    factory = asyncio.create_task(controller.rt.factory.run())
    await asyncio.wait_for(controller.rt.factory.wait_synced(), 5)
    await api.settle()
    yield controller
    factory.cancel()
    await asyncio.gather(factory, return_exceptions=True)


async def test_taints_follow_ready_and_keep_other_owners_taints(api: FakeApi) -> None:
    api.put(PATH, node("True", [OTHER, NOT_READY]))
    controller = NodeLifecycleController(Runtime.build(api))
    running = asyncio.gather(controller.rt.factory.run(), controller.run())
    try:
        await until("not-ready lifted", lambda: taints(api) == [OTHER], api)
        api.put(PATH, {**node("False"), "spec": {"taints": taints(api)}})  # the kubelet
        await until("not-ready put back", lambda: taints(api) == [OTHER, NOT_READY], api)
        api.put(PATH, {**node("Unknown"), "spec": {"taints": taints(api)}})
        await until("unreachable instead", lambda: taints(api) == [OTHER, UNREACHABLE], api)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_a_conflict_backs_off_in_the_queue_and_keeps_the_other_writers_taint(
    api: FakeApi, informed: NodeLifecycleController
) -> None:
    controller = informed
    late = {"key": "example.com/late", "effect": "NoSchedule"}
    # Between the controller's read (the informer's copy) and its patch, someone adds a taint.
    api.before("PATCH", PATH, lambda: api.put(PATH, node("True", [OTHER, NOT_READY, late])))
    controller.queue.add("n")
    await controller.queue.process_one(controller.reconcile)
    assert controller.queue.failures("n") == 1, "a conflict is a failure the queue backs off"
    assert controller.queue.scheduled("n") is not None
    assert taints(api) == [OTHER, NOT_READY, late]
    await api.settle()  # the informer sees the other write; the next try decides from it
    controller.queue.add("n")
    await controller.queue.process_one(controller.reconcile)
    assert taints(api) == [OTHER, late]
    assert controller.queue.failures("n") == 0


async def test_no_second_decision_from_a_cache_older_than_our_write(
    api: FakeApi, informed: NodeLifecycleController
) -> None:
    controller = informed
    controller.queue.add("n")
    await controller.queue.process_one(controller.reconcile)
    assert patches(api) == 1 and taints(api) == [OTHER]
    # The informer has not delivered our write yet: its copy still shows not-ready.
    assert controller.nodes.get("n") is not None
    result = await controller.reconcile("n")
    assert result.after is not None and not result.retry, "waits for its own write"
    assert patches(api) == 1
    await api.settle()
    assert await controller.reconcile("n") == DONE
    assert patches(api) == 1


async def test_a_deleted_node_is_left_alone(
    api: FakeApi, informed: NodeLifecycleController
) -> None:
    api.remove(PATH)
    await api.settle()
    assert await informed.reconcile("n") == DONE
    assert patches(api) == 0
