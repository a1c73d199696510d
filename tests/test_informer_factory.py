"""The factory shares one informer per view."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from pilotfish.kube import projections
from pilotfish.kube.factory import InformerFactory
from pilotfish.kube.rest import NODES, PODS, Rest
from pilotfish.tasks import TaskDied
from tests.fakeapi import FakeApi


def test_same_view_same_informer_other_view_other_informer() -> None:
    f = InformerFactory(cast(Rest, object()))
    a = f.informer(PODS, label_selector="x=y")
    assert f.informer(PODS, label_selector="x=y") is a
    assert f.informer(PODS) is not a
    assert f.informer(NODES) is not f.informer(PODS)
    assert a.resync_seconds == f.resync_seconds


def test_one_view_has_one_projection() -> None:
    f = InformerFactory(cast(Rest, object()))
    f.informer(PODS, projection=projections.pod)
    assert f.informer(PODS, projection=projections.pod) is f.informer(
        PODS, projection=projections.pod
    )
    with pytest.raises(ValueError, match="one view, one projection"):
        f.informer(PODS, projection=projections.node)


async def test_waiting_for_sync_fails_when_an_informer_dies() -> None:
    """A view that will never sync must stop the wait (and the process), not hang it."""

    async def dies() -> None:
        raise RuntimeError("a bug in a transform")

    f = InformerFactory(cast(Rest, object()))
    f.informer(PODS).run = dies  # type: ignore[method-assign]
    runner = asyncio.create_task(f.run())
    with pytest.raises(RuntimeError, match="stopped before they synced"):
        await asyncio.wait_for(f.wait_synced(), 5)
    with pytest.raises(TaskDied, match="pods"):
        await runner


def test_informer_replays_list_differences_as_events() -> None:
    inf = InformerFactory(cast(Rest, object())).informer(PODS)
    seen: list[tuple[str, str]] = []
    inf.add_handler(lambda kind, obj, _old: seen.append((kind, obj["metadata"]["name"])))

    def pod(name: str, rv: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "n", "resourceVersion": rv}}

    inf._apply({"type": "ADDED", "object": pod("a", "1")})
    inf._apply({"type": "MODIFIED", "object": pod("a", "2")})
    inf._apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}})
    inf._apply({"type": "DELETED", "object": pod("a", "3")})
    assert seen == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    assert inf.resource_version == "3" and inf.store == {}


async def test_relist_after_gone_emits_what_changed_meanwhile() -> None:
    api = FakeApi()

    def pod(name: str, image: str = "a:1") -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {"containers": [{"image": image}]}}

    api.put(PODS.path("n", "a"), pod("a"))
    api.put(PODS.path("n", "b"), pod("b"))
    inf = InformerFactory(api).informer(PODS)
    seen: list[tuple[str, str]] = []
    inf.add_handler(lambda kind, obj, _old: seen.append((kind, obj["metadata"]["name"])))
    await inf.relist()
    # While no watch ran: a deleted, b changed, c added.
    api.remove(PODS.path("n", "a"))
    api.put(PODS.path("n", "b"), pod("b", "a:2"))
    api.put(PODS.path("n", "c"), pod("c"))
    await inf.relist()
    assert seen == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("MODIFIED", "b"),
        ("ADDED", "c"),
        ("DELETED", "a"),
    ]
    assert set(inf.store) == {"n/b", "n/c"} and inf.synced.is_set()
