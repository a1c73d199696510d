"""The real ServiceWorkload controller on the shared in-memory API (`tests.fakeapi`): its
real informers and factory, conditional writes, own writes waited for (a lagging watch or a
lost answer never doubles a create or a drain), restarts, drains, the progress deadline,
the status it writes and the queue's backoff of refused writes. The harness (a watch that
can lag, a graceful kubelet, rounds until quiet) is `tests.rollout_harness`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from pilotfish.api.serviceworkload import AVAILABLE, PROGRESSING, STALLED
from pilotfish.kube.rest import PODS, SERVICEWORKLOADS
from pilotfish.operators.serviceworkload.apply import created_note
from pilotfish.operators.serviceworkload.pdb import PDBS
from pilotfish.operators.serviceworkload.progress import (
    REASON_COMPLETE,
    REASON_DEADLINE_EXCEEDED,
    REASON_IN_PROGRESS,
    REASON_PAUSED,
)
from pilotfish.operators.serviceworkload.revisions import template_hash
from pilotfish.timeutil import FakeClock, format_micro_time
from pilotfish.workloads import (
    ANNOTATION_DRAINED,
    LABEL_REVISION,
    LABEL_WORKLOAD,
    PROPAGATION_SECONDS,
)
from tests.rollout_harness import (
    KEY,
    SW,
    T0,
    Lagging,
    World,
    condition,
    draining,
    revisions_of,
    set_template,
    start,
    status,
    template,
    workload,
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def api() -> Lagging:
    return Lagging()


@pytest.fixture
async def world(api: Lagging, clock: FakeClock) -> AsyncIterator[World]:
    w = await start(api, clock)
    yield w
    await w.stop()


# -- replicas ------------------------------------------------------------------------------


async def test_creates_the_replicas_a_revision_a_pdb_and_reports_them(world: World) -> None:
    api, clock = world.api, world.clock
    api.put(SERVICEWORKLOADS.path("ns"), workload())
    await world.converge()
    pods = api.pods()
    h = template_hash(template())
    assert len(pods) == 3
    for p in pods:
        assert p["metadata"]["name"].startswith(f"web-{h}-")
        assert p["metadata"]["labels"][LABEL_WORKLOAD] == "web"
        assert p["metadata"]["labels"][LABEL_REVISION] == h
        assert p["metadata"]["ownerReferences"][0]["name"] == "web"
    (rev,) = api.revisions()
    assert (rev["metadata"]["name"], rev["revision"], rev["data"]) == (f"web-{h}", 1, template())
    pdb = api.obj(PDBS.path("ns", "web"))
    assert pdb is not None and pdb["spec"]["maxUnavailable"] == 1
    assert condition(api, PROGRESSING) == ("True", REASON_IN_PROGRESS)
    assert condition(api, AVAILABLE)[0] == "False"
    assert status(api)["replicas"] == 3, "status counts the pods the informer shows"

    clock.advance(2)
    api.make_ready(clock)
    await world.converge()
    s = status(api)
    assert (s["readyReplicas"], s["availableReplicas"]) == (3, 3)
    assert (s["currentRevision"], s["updateRevision"]) == (h, h)
    assert s["observedGeneration"] == 1
    assert condition(api, AVAILABLE) == ("True", "MinimumReplicasAvailable")
    assert condition(api, PROGRESSING) == ("True", REASON_COMPLETE)
    assert condition(api, STALLED) == ("False", REASON_COMPLETE)
    events = await world.events()
    complete = [e for e in events if e["reason"] == REASON_COMPLETE]
    assert [e["regarding"]["kind"] for e in complete] == ["ServiceWorkload"]
    (created,) = [e for e in events if e["reason"] == "SuccessfulCreate"]
    assert created["regarding"]["kind"] == "ServiceWorkload", "a round's creates: one Event"
    names_ = ", ".join(sorted(p["metadata"]["name"] for p in pods))
    assert created["note"] == f"created 3 pods of revision {h}: {names_}"


async def test_a_lagging_watch_never_doubles_the_creates(world: World) -> None:
    api = world.api
    api.put(SERVICEWORKLOADS.path("ns"), workload())
    await world.step()  # records the revision
    async with api.lag():
        await world.ctrl.reconcile(KEY)
        assert len(api.pods()) == 3
        for _ in range(3):
            result = await world.ctrl.reconcile(KEY)  # the informer has not seen them all
            assert result.after is not None and not result.retry, "waits, no retry storm"
        assert len(api.pods()) == 3
    await world.converge()
    assert len(api.pods()) == 3


async def test_a_restarted_controller_lists_before_it_creates(
    world: World, api: Lagging, clock: FakeClock
) -> None:
    api.put(SERVICEWORKLOADS.path("ns"), workload(strategy={"maxSurge": 1}))
    await world.converge()
    await world.stop()  # the old process dies; the new one has no memory of what it created
    again = await start(api, clock, seed=8)
    try:
        await again.converge()
    finally:
        await again.stop()
    assert len(api.pods()) == 3


async def test_a_create_whose_answer_is_lost_is_waited_for_not_repeated(world: World) -> None:
    api = world.api
    api.put(SERVICEWORKLOADS.path("ns"), workload())
    await world.step()
    api.fail_next("POST", "/pods", 504, commit_first=True)
    async with api.lag():
        result = await world.ctrl.reconcile(KEY)  # slow start: the first create "times out"
        assert result.retry
        assert len(api.pods()) == 1
        await world.ctrl.reconcile(KEY)  # the watch has not shown it: it is waited for
        assert len(api.pods()) == 1
    await world.converge()
    assert len(api.pods()) == 3


async def test_refused_creates_are_retried_with_backoff_and_reported(world: World) -> None:
    api = world.api
    api.put(SERVICEWORKLOADS.path("ns"), workload())
    await world.step()
    api.fail_next("POST", "/pods", 403, times=50)
    result = await world.step()
    assert result.retry and "403" in result.why
    assert api.pods() == []
    assert len(api.writes("/pods")) == 1, "slow start: one refused call, not three"
    await world.converge(rounds=3)
    failure = next(c for c in status(api)["conditions"] if c["type"] == "ReplicaFailure")
    assert failure["status"] == "True" and "injected 403" in failure["message"]


async def test_failed_and_deleted_pods_are_replaced(world: World) -> None:
    api, clock = world.api, world.clock
    api.put(SERVICEWORKLOADS.path("ns"), workload())
    await world.converge()
    api.make_ready(clock)
    await world.converge()
    first, second, _ = sorted(p["metadata"]["name"] for p in api.pods())
    api.edit(PODS.path("ns", first), lambda p: p["status"].update(phase="Failed", reason="X"))
    api.remove(PODS.path("ns", second))
    await world.converge()
    names = {p["metadata"]["name"] for p in api.pods()}
    assert len(names) == 3 and first not in names and second not in names
    gone = api.obj(PODS.path("ns", first))
    assert gone is not None and gone["metadata"].get("deletionTimestamp"), "deleted, graceful"


async def test_pods_of_another_owner_are_never_counted(world: World) -> None:
    api = world.api
    api.put(SERVICEWORKLOADS.path("ns"), workload(replicas=1))
    stray = {"metadata": {"name": "stray", "labels": {LABEL_WORKLOAD: "web"}}, "spec": {}}
    api.put(PODS.path("ns"), stray)
    await world.converge()
    assert len(api.pods()) == 2
    assert "stray" in {p["metadata"]["name"] for p in api.pods()}


# -- rollouts --------------------------------------------------------------------------------


async def ready_workload(world: World, **spec: Any) -> None:
    world.api.put(SERVICEWORKLOADS.path("ns"), workload(**spec))
    await world.converge()
    world.clock.advance(1)
    world.api.make_ready(world.clock)
    await world.converge()
    assert condition(world.api, PROGRESSING) == ("True", REASON_COMPLETE)


async def test_rollout_drains_before_deleting_and_never_drains_twice_on_a_stale_view(
    world: World,
) -> None:
    api, clock = world.api, world.clock
    await ready_workload(world, replicas=2, service={"ports": [{"name": "http", "port": 80}]})
    old, new = template_hash(template()), template_hash(template("app:2"))
    set_template(api, template("app:2"))
    await world.converge()
    assert revisions_of(api.pods()) == sorted([old, old, new])
    clock.advance(1)
    api.make_ready(clock, revision=new)
    async with api.lag():
        await world.ctrl.reconcile(KEY)
        assert len(draining(api)) == 1
        assert draining(api)[0]["metadata"]["labels"][LABEL_REVISION] == old
        await world.ctrl.reconcile(KEY)  # the drain annotation has not come back yet
        assert len(draining(api)) == 1, "a stale view must not drain a second available pod"
    assert len(api.pods()) == 3, "the draining pod still counts toward the surge"

    victim = draining(api)[0]["metadata"]["name"]
    stamp = format_micro_time(clock.now())
    api.edit(
        PODS.path("ns", victim),
        lambda p: p["metadata"]["annotations"].update({ANNOTATION_DRAINED: stamp}),
    )
    result = await world.converge()
    pod = api.obj(PODS.path("ns", victim))
    assert pod is not None and not pod["metadata"].get("deletionTimestamp")
    assert result.after is not None and 0 < result.after <= PROPAGATION_SECONDS + 0.1
    clock.advance(PROPAGATION_SECONDS)
    await world.converge()
    pod = api.obj(PODS.path("ns", victim))
    assert pod is not None and pod["metadata"].get("deletionTimestamp")
    reasons = {e["reason"]: e["regarding"]["name"] for e in await world.events()}
    assert reasons["DrainRequested"] == victim and reasons["PodDrained"] == victim


async def test_a_never_ready_rollout_stalls_at_its_deadline(world: World) -> None:
    api, clock = world.api, world.clock
    await ready_workload(world, strategy={"progressDeadlineSeconds": 60})
    set_template(api, template("broken:1"))
    result = await world.converge()
    assert len(api.pods()) == 4, "the surge, and no more"
    assert result.after is not None and 59 < result.after <= 61, "a wake-up, not polling"
    clock.advance(30)
    await world.converge()
    assert condition(api, STALLED) == ("False", REASON_IN_PROGRESS)
    clock.advance(31)
    await world.converge()
    assert condition(api, STALLED) == ("True", REASON_DEADLINE_EXCEEDED)
    assert condition(api, PROGRESSING) == ("False", REASON_DEADLINE_EXCEEDED)
    assert condition(api, AVAILABLE)[0] == "True", "the old pods keep serving"
    assert len(api.pods()) == 4
    stalled = [e for e in await world.events() if e["reason"] == REASON_DEADLINE_EXCEEDED]
    assert len(stalled) == 1 and stalled[0]["type"] == "Warning"

    # Undo by spec: the old template again reuses its revision, renumbered.
    set_template(api, template())
    await world.converge()
    clock.advance(1)
    api.terminate()
    await world.converge()
    numbers = {r["metadata"]["name"]: r["revision"] for r in api.revisions()}
    assert numbers[f"web-{template_hash(template())}"] == 3
    assert numbers[f"web-{template_hash(template('broken:1'))}"] == 2
    assert set(revisions_of(api.pods())) == {template_hash(template())}
    assert condition(api, PROGRESSING) == ("True", REASON_COMPLETE)


async def test_paused_workloads_roll_nothing_but_still_scale(world: World) -> None:
    api = world.api
    await ready_workload(world, strategy={"paused": True})
    set_template(api, template("app:2"))
    await world.converge()
    assert set(revisions_of(api.pods())) == {template_hash(template())}
    assert condition(api, PROGRESSING) == ("Unknown", REASON_PAUSED)
    api.edit(SW, lambda sw: sw["spec"].update(replicas=4))
    await world.converge()
    assert len(api.pods()) == 4
    assert set(revisions_of(api.pods())) == {template_hash(template())}, (
        "paused: replacements and scale-ups run the stable revision"
    )


async def test_status_writes_are_conditional_on_the_version_read(world: World) -> None:
    api, clock = world.api, world.clock
    api.put(SERVICEWORKLOADS.path("ns"), workload())
    await world.converge()
    clock.advance(1)
    api.make_ready(clock)
    await api.settle()  # the informer sees the pods ready; the status does not say so yet
    async with api.lag():
        api.edit(SW, lambda sw: sw["spec"].update(replicas=5))
        result = await world.ctrl.reconcile(KEY)  # decided from replicas=3
        assert result.retry, "the status write was refused"
        assert status(api)["availableReplicas"] == 0, "still what the refused round read"
    await world.converge()
    assert status(api)["observedGeneration"] == 2
    assert len(api.pods()) == 5


async def test_history_beyond_the_limit_is_pruned(world: World) -> None:
    api, clock = world.api, world.clock
    await ready_workload(world, replicas=1, strategy={"revisionHistoryLimit": 1})
    for image in ("app:2", "app:3", "app:4"):
        set_template(api, template(image))
        for _ in range(4):
            clock.advance(1)
            api.make_ready(clock)
            await world.converge()
            api.terminate()
    assert sorted(r["revision"] for r in api.revisions()) == [3, 4], "update and one old"


async def test_a_persistently_refused_write_backs_off_in_the_queue(world: World) -> None:
    """The controller returns RETRY and keeps no backoff of its own: the queue's per-key
    backoff grows while the refusals continue and is forgotten once the write succeeds."""
    api = world.api
    await ready_workload(world)
    api.edit(PDBS.path("ns", "web"), lambda pdb: pdb["spec"].update(maxUnavailable=7))
    api.fail_next("PATCH", "poddisruptionbudgets", 422, times=4)
    queue = world.ctrl.queue
    delays = []
    for _ in range(4):
        result = await world.step()
        assert result.retry
        delays.append(queue.settle(KEY, result))
    assert delays == [0.005, 0.01, 0.02, 0.04]
    result = await world.converge()
    queue.settle(KEY, result)
    assert queue.failures(KEY) == 0
    pdb = api.obj(PDBS.path("ns", "web"))
    assert pdb is not None and pdb["spec"]["maxUnavailable"] == 1


async def test_a_revision_is_visible_before_any_pod_of_it_exists(world: World) -> None:
    api = world.api
    api.put(SERVICEWORKLOADS.path("ns"), workload())
    async with api.lag():
        await world.ctrl.reconcile(KEY)
        assert [r["revision"] for r in api.revisions()] == [1]
        await world.ctrl.reconcile(KEY)
        assert api.pods() == [], "pods of a revision the informer does not show yet wait"
    await world.converge()
    assert len(api.pods()) == 3


def test_a_large_rounds_note_names_five_pods_and_counts_the_rest() -> None:
    made = [f"web-h-{i:02d}" for i in range(100)]
    note = created_note(made, "h")
    assert note == (
        "created 100 pods of revision h: web-h-00, web-h-01, web-h-02, web-h-03, web-h-04 "
        "and 95 more"
    )
    assert created_note(["web-h-a"], "h") == "created 1 pod of revision h: web-h-a"
