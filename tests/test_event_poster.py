"""The one Event writer: posting never blocks a reconcile, repeats become a series."""

from __future__ import annotations

import asyncio
import gc
import weakref

from prometheus_client import REGISTRY

from pilotfish.kube.events import EventPoster
from pilotfish.timeutil import FakeClock
from tests.fakeapi import FakeApi

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a", "uid": "u"}}


async def test_post_returns_at_once_and_run_writes_it() -> None:
    api = FakeApi()
    poster = EventPoster(api, "host-1", FakeClock())
    events = poster.scoped("pilotfish.io/gates")
    api.fail_next("POST", "/events", 500)  # a failing Events API must not reach the caller
    events.post(POD, "GateReleased", "released", action="Release")
    events.post(POD, "GateReleased", "released again", action="Release")
    assert api.writes("/events") == [], "post only queues"
    runner = asyncio.create_task(poster.run())
    try:
        while len(api.writes("/events")) < 2:  # noqa: ASYNC110 - the poster runs between
            await asyncio.sleep(0.01)
    finally:
        runner.cancel()
    stored = api.store("events.k8s.io/v1", "events")
    assert [e["note"] for e in stored.values()] == ["released again"]
    (event,) = stored.values()
    assert event["reportingController"] == "pilotfish.io/gates"
    assert event["reportingInstance"] == "host-1"


async def test_repeats_within_the_window_become_one_event_with_a_count() -> None:
    api = FakeApi()
    clock = FakeClock()
    poster = EventPoster(api, "host-1", clock)
    events = poster.scoped("pilotfish.io/gates")
    for _ in range(5):
        events.post(POD, "Waiting", "quota", action="Wait")
        await poster.flush()
        clock.advance(31)
    (event,) = api.store("events.k8s.io/v1", "events").values()
    assert event["series"]["count"] == 5


async def test_a_full_queue_drops_instead_of_growing() -> None:
    api = FakeApi()
    poster = EventPoster(api, "host-1", FakeClock(), capacity=3)
    for i in range(10):
        poster.post("c", POD, "R", f"n{i}", action="A")
    await poster.flush()
    assert len(api.writes("/events")) == 3


class _Pod(dict[str, object]):
    """A pod as the API returns it, that can be watched for being freed."""


async def test_a_queued_event_does_not_keep_its_object_alive() -> None:
    api = FakeApi()
    poster = EventPoster(api, "host-1", FakeClock())
    pod = _Pod(
        apiVersion="v1",
        kind="Pod",
        metadata={"name": "p", "namespace": "a", "uid": "u", "resourceVersion": "7"},
        spec={"containers": [{"name": "c", "image": "x", "env": [{"name": "E"}] * 100}]},
    )
    freed = weakref.ref(pod)
    poster.post("pilotfish.io/serviceworkload", pod, "Created", "created pod p", action="Create")
    del pod
    gc.collect()
    assert freed() is None, "the queued Event still holds the whole pod"
    await poster.flush()
    (event,) = api.store("events.k8s.io/v1", "events").values()
    assert event["regarding"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p",
        "namespace": "a",
        "uid": "u",
        "resourceVersion": "7",
    }


async def test_the_backlog_is_a_gauge() -> None:
    api = FakeApi()
    poster = EventPoster(api, "host-1", FakeClock())
    for i in range(3):
        poster.post("c", POD, "R", f"n{i}", action="A")
    assert REGISTRY.get_sample_value("pilotfish_events_queued") == 3
    await poster.flush()
    assert REGISTRY.get_sample_value("pilotfish_events_queued") == 0
