"""The shared fake keeps the API server's rules the controllers depend on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pilotfish.kube import projections
from pilotfish.kube.factory import InformerFactory
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import JSON_PATCH, MERGE_PATCH, PODS, STRATEGIC_MERGE_PATCH, ApiError
from tests.fakeapi import FakeApi

NS = "/api/v1/namespaces/a/pods"


def pod(name: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"schedulingGates": [{"name": "g1"}, {"name": "g2"}], "containers": []},
    }


async def test_stale_writes_conflict_and_write_nothing() -> None:
    api = FakeApi()
    created = await api.create(NS, pod("p"))
    rv = created["metadata"]["resourceVersion"]
    await api.patch(f"{NS}/p", {"metadata": {"labels": {"x": "1"}}}, MERGE_PATCH)
    with pytest.raises(ApiError) as e:
        await api.patch(f"{NS}/p", {"metadata": {"resourceVersion": rv, "labels": {"x": "2"}}})
    assert e.value.conflict
    with pytest.raises(ApiError) as e:
        await api.patch(
            f"{NS}/p",
            [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}],
            JSON_PATCH,
        )
    assert e.value.status == 422
    with pytest.raises(ApiError) as e:
        await api.delete(f"{NS}/p", {"preconditions": {"resourceVersion": rv}})
    assert e.value.conflict
    assert (api.obj(f"{NS}/p") or {})["metadata"]["labels"] == {"x": "1"}


async def test_strategic_delete_of_one_gate_keeps_the_others() -> None:
    api = FakeApi()
    await api.create(NS, pod("p"))
    patch = {"spec": {"schedulingGates": [{"name": "g1", "$patch": "delete"}]}}
    await api.patch(f"{NS}/p", patch, STRATEGIC_MERGE_PATCH)
    await api.patch(f"{NS}/p", patch, STRATEGIC_MERGE_PATCH)
    assert (api.obj(f"{NS}/p") or {})["spec"]["schedulingGates"] == [{"name": "g2"}]


async def test_status_subresource_and_generation() -> None:
    api = FakeApi()
    await api.create(NS, pod("p"))
    await api.patch(f"{NS}/p/status", {"status": {"phase": "Running"}, "spec": {"x": 1}})
    got = api.obj(f"{NS}/p") or {}
    assert got["status"] == {"phase": "Running"} and "x" not in got["spec"]
    assert got["metadata"]["generation"] == 1
    await api.patch(f"{NS}/p", {"spec": {"nodeName": "n"}, "status": {"phase": "Failed"}})
    got = api.obj(f"{NS}/p") or {}
    assert got["metadata"]["generation"] == 2 and got["status"] == {"phase": "Running"}


async def test_real_informers_follow_writes_and_relist_after_gone() -> None:
    api = FakeApi()
    factory = InformerFactory(api)
    inf = factory.informer(PODS, projection=projections.pod)
    tracker = OwnWrites("t")
    tracker.watch(inf)
    runner = asyncio.create_task(factory.run())
    try:
        await factory.wait_synced()
        written = await api.create(NS, pod("p", app="web"))
        tracker.wrote("a/p", written, owner="web")
        assert not tracker.settled("web")
        await api.settle()
        assert "a/p" in inf.store and tracker.settled("web")
        lists = len([c for c in api.calls if c.method == "GET"])
        await api.close_watches()
        api.remove(f"{NS}/p")
        api.put(f"{NS}/q", pod("q"))
        api.compact()  # the informer resumes from a version the server no longer has
        await asyncio.wait_for(_until(lambda: set(inf.store) == {"a/q"}), 10)
        assert len([c for c in api.calls if c.method == "GET"]) > lists, "it relisted"
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_injected_faults() -> None:
    api = FakeApi()
    api.fail_next("POST", "/pods", 500)
    with pytest.raises(ApiError):
        await api.create(NS, pod("p"))
    assert api.obj(f"{NS}/p") is None
    api.fail_next("POST", "/pods", 504, commit_first=True)
    with pytest.raises(ApiError):
        await api.create(NS, pod("p"))
    assert api.obj(f"{NS}/p") is not None


async def _until(cond: Any) -> None:
    while not cond():  # noqa: ASYNC110 - the informer task runs between checks
        await asyncio.sleep(0.01)
