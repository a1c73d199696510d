"""The gate controller end to end (`tests.gates_harness`) against the shared fake API
server's concurrency rules for our writes: resourceVersion preconditions (409), JSON-patch
`test` ops (422), strategic-merge deletion of one gate by name, delete preconditions, and
conditional TeamQuota status updates for quota reservations.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pilotfish import gates, metrics, timeutil
from pilotfish.kube.informer import Obj
from pilotfish.kube.rest import GATESIGNALS, NODES, PODS
from pilotfish.operators.gates.apply import (
    REASON_EXPIRED,
    REASON_RELEASED,
    REASON_RETRY,
    REASON_REVIEW,
    ROUND,
)
from pilotfish.operators.gates.model import ANNOTATION_RELEASED
from tests.gates_harness import Harness, running, seeded_api
from tests.test_gates_builders import at, pod, rec

DATA = "gates.pilotfish.io/data"
QUOTA_GATE = "gates.pilotfish.io/quota"


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    async with running(tmp_path) as harness:
        yield harness


def counter(metric: Any, *labels: str) -> float:
    return float(metric.labels(*labels)._value.get())


def rv(obj: Obj) -> str:
    return str(obj["metadata"]["resourceVersion"])


# --- release -------------------------------------------------------------------------------


async def test_release_is_one_conditional_patch_then_audit_and_event(h: Harness) -> None:
    """The gate patch is the release's only write to the pod: no State condition follows
    (the API server drops status from a pods patch, and the patch's release mark says it)."""
    gated = f"waiting for {DATA} (GateSignal data not Ready)"
    p = h.add(pod("p", {"data": rec()}, state=("False", gates.STATE_GATED, gated)))
    h.signal()
    before = counter(metrics.GATES_RELEASES, DATA, "team-a")
    await h.round()

    [first] = h.api.writes("/pods/p")
    assert (first.method, first.path) == ("PATCH", "/api/v1/namespaces/team-a/pods/p")
    body = json.loads(json.dumps(first.body))
    released = json.loads(body["metadata"].pop("annotations")[ANNOTATION_RELEASED])
    assert body == {
        "metadata": {"resourceVersion": rv(p)},
        "spec": {"schedulingGates": [{"name": DATA, "$patch": "delete"}]},
    }
    signal_rv = rv(h.api.obj(GATESIGNALS.path("team-a", "data")) or {})
    evidence = f"GateSignal team-a/data Ready (resourceVersion {signal_rv})"
    assert released == {
        DATA: {
            "at": "2030-01-01T12:00:00Z",
            "evidence": evidence,
            "decidedFrom": rv(p),
            "actor": "pilotfish-operator/gates/test-1",
        }
    }
    # The audit line names the version the release produced.
    [line] = h.lines()
    assert line["resourceVersion"] == rv(h.pod("p")) != rv(p)
    assert h.pod("p")["spec"]["schedulingGates"] == []
    [cond] = [c for c in h.pod("p")["status"]["conditions"] if c["type"] == gates.POD_CONDITION]
    assert cond["message"] == gated, "the gated phase's condition, left as it was"
    assert line == {
        "ts": "2030-01-01T12:00:00.000000Z",
        "pod": "team-a/p",
        "uid": "uid-p",
        "gate": DATA,
        "decision": "released",
        "evidence": evidence,
        "resourceVersion": line["resourceVersion"],
        "decidedFrom": rv(p),
        "actor": "pilotfish-operator/gates/test-1",
    }
    [event] = h.events()
    assert event["reason"] == REASON_RELEASED and event["regarding"]["name"] == "p"
    assert event["regarding"]["resourceVersion"] == line["resourceVersion"]
    assert event["note"] == (
        f"released {DATA} from pod p: {evidence}; no Pilotfish gate left, the pod goes to the "
        "scheduler"
    )
    assert event["reportingController"] == "pilotfish.io/gates" and event["type"] == "Normal"
    assert counter(metrics.GATES_RELEASES, DATA, "team-a") == before + 1
    # Converged: released pods get no further writes from the controller.
    n = len(h.api.writes())
    await h.round()
    assert len(h.api.writes()) == n


async def test_a_burst_is_one_write_per_pod_and_one_event_per_gate(h: Harness) -> None:
    """Releasing 12 pods in one round: 12 gate patches, no status write, 12 audit lines and
    one Event naming the count and the first pods in release order (oldest first)."""
    for i in range(12):
        h.add(pod(f"p{i:02d}", {"data": rec()}, age=100 - i))
    h.signal()
    await h.round()
    pod_writes = [w for w in h.api.writes() if "/pods/" in w.path]
    assert len(pod_writes) == 12
    assert all(w.method == "PATCH" and not w.path.endswith("/status") for w in pod_writes)
    assert sorted(r["pod"] for r in h.lines()) == [f"team-a/p{i:02d}" for i in range(12)]
    [event] = h.events()
    assert event["reason"] == REASON_RELEASED and event["regarding"]["name"] == "p00"
    signal_rv = rv(h.api.obj(GATESIGNALS.path("team-a", "data")) or {})
    assert event["note"] == (
        f"released {DATA} from 12 pods in one round: p00, p01, p02, p03, p04 and 7 more; "
        f"GateSignal team-a/data Ready (resourceVersion {signal_rv}); 12 go to the scheduler "
        "now (no Pilotfish gate left)"
    )


async def test_conflict_skips_the_pods_other_writes_and_retries_with_backoff(h: Harness) -> None:
    h.add(pod("p", {"data": rec()}))
    h.signal()
    await h.api.settle()
    h.lag()
    stale = h.pod("p")
    stale["metadata"]["labels"]["example.com/touched"] = "yes"
    h.add(stale)  # someone wrote the pod; our informer has not seen it yet
    before = counter(metrics.OPERATOR_CONFLICTS, "gates")
    result = await h.round(settle=False)
    assert result.retry, "the queue backs a conflict off; no retry policy of our own"
    assert [c.method for c in h.api.writes("/pods/p")] == ["PATCH"]  # refused; no status write
    assert h.lines() == []
    assert h.pod("p")["spec"]["schedulingGates"] == [{"name": DATA}]
    assert counter(metrics.OPERATOR_CONFLICTS, "gates") == before + 1
    # The watch delivers the fresh copy; the next round succeeds, audited once.
    await h.catch_up()
    assert not (await h.round()).retry
    assert h.pod("p")["spec"]["schedulingGates"] == []
    assert [entry["decision"] for entry in h.lines()] == ["released"]


async def test_rounds_before_the_watch_catches_up_wait_for_it(h: Harness) -> None:
    """A round right after a release must not decide from the informer's copy that still
    shows the pod gated: it would release the same quota again. It waits for the watch,
    whose event re-enqueues it."""
    for i in range(2):
        h.add(pod(f"p{i}", {"quota": rec("Quota")}, team="t", age=10 - i))
    h.quota("1")
    await h.api.settle()
    h.lag()
    await h.round(settle=False)
    assert h.pod("p0")["spec"]["schedulingGates"] == []
    assert not h.c.own.settled(ROUND)
    for _ in range(2):
        result = await h.round(settle=False)
        assert result.after == h.c.own.ttl and not result.retry
    await h.catch_up()
    assert h.c.own.settled(ROUND)
    await h.round()
    assert len(h.gate_patches("p0")) == 1 and h.gate_patches("p1") == []
    assert [(e["pod"], e["decision"]) for e in h.lines()] == [("team-a/p0", "released")]
    assert h.pod("p1")["spec"]["schedulingGates"] == [{"name": QUOTA_GATE}]


async def test_duplicate_removal_is_never_sent_when_the_answer_was_lost(h: Harness) -> None:
    """The removal committed but its answer was lost (an etcd timeout, a reset): the gate is
    already gone when the controller would remove it again. It reads the pod back instead of
    writing blind, waits for its watch, sends no second removal, leaves the other owner's
    gate alone, audits the release exactly once and says who still holds the pod."""
    h.add(pod("p", {"data": rec()}, other_gates=["example.com/x"]))
    h.signal()
    await h.api.settle()
    h.lag()
    h.api.fail_next("PATCH", "/pods/p", 504, commit_first=True)
    with pytest.raises(Exception, match="was lost"):
        await h.round(settle=False)
    assert h.pod("p")["spec"]["schedulingGates"] == [{"name": "example.com/x"}]
    result = await h.round(settle=False)  # reads the pod back: its own write, not yet seen
    assert result.after == h.c.own.ttl
    await h.catch_up()
    for _ in range(2):
        await h.round()
    assert len(h.gate_patches("p")) == 1, "one removal, never a second"
    assert h.pod("p")["spec"]["schedulingGates"] == [{"name": "example.com/x"}]
    [line] = h.lines()
    assert (line["gate"], line["decision"]) == (DATA, "released")
    assert "answer was lost" in line["evidence"]
    assert not [w for w in h.api.writes("/pods/p") if w.path.endswith("/status")]


async def test_gate_removed_by_someone_else_meanwhile_is_not_removed_or_audited(
    h: Harness,
) -> None:
    """On-call released the gate (`kubectl pilotfish gates release`) just before the
    controller's own removal: that lands as a conflict, and nothing of it is claimed."""
    h.add(pod("p", {"data": rec()}, other_gates=["example.com/x"]))
    h.signal()
    await h.api.settle()
    h.lag()
    gone = h.pod("p")
    gone["spec"]["schedulingGates"] = [{"name": "example.com/x"}]
    h.add(gone)
    assert (await h.round(settle=False)).retry
    assert len(h.gate_patches("p")) == 1  # refused: conditional on the version before
    await h.catch_up()
    await h.round()
    assert len(h.gate_patches("p")) == 1, "the gate is gone: nothing to remove"
    assert h.pod("p")["spec"]["schedulingGates"] == [{"name": "example.com/x"}]
    assert h.lines() == [] and not any(e["reason"] == REASON_RELEASED for e in h.events())


async def test_unanswered_release_counts_as_released_until_the_watch_says(h: Harness) -> None:
    """A release whose answer was lost may have committed. If the next round believed the
    stale cache, a higher-priority pod arriving meanwhile would get the same quota."""
    h.add(pod("p0", {"quota": rec("Quota")}, team="t", age=10))
    h.quota("1")
    await h.api.settle()
    h.lag()
    h.api.fail_next("PATCH", "/pods/p0", 504, commit_first=True)
    with pytest.raises(Exception, match="was lost"):
        await h.round(settle=False)
    assert h.pod("p0")["spec"]["schedulingGates"] == []  # it did commit
    assert (await h.round(settle=False)).after == h.c.own.ttl, "p0 is read back, then awaited"
    h.add(pod("p1", {"quota": rec("Quota")}, team="t", priority=100))
    await h.catch_up()
    await h.round()
    assert h.gate_patches("p1") == [], "p1 must wait: p0 holds the quota"
    assert h.pod("p1")["spec"]["schedulingGates"] == [{"name": QUOTA_GATE}]


async def test_watch_ahead_of_the_write_response_wins(h: Harness) -> None:
    """The scheduler writes a just-released pod within milliseconds: its newer version may
    reach the informer before our write's answer does. The older answer must then not hold
    the rounds back (every one would wait for a version the watch already passed)."""
    h.add(pod("p", {"data": rec()}))
    h.signal()
    await h.api.settle()
    real = h.api.request

    async def scheduler_first(method: str, path: str, **kw: Any) -> dict[str, Any]:
        out = await real(method, path, **kw)
        if method == "PATCH" and path.endswith("/pods/p"):
            newer = h.pod("p")
            newer["status"]["conditions"].append(
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
                | {"message": "0/3 nodes are available"}
            )
            h.api.put(PODS.path("team-a", "p") + "/status", newer)
            await h.api.settle()
        return out

    h.api.request = scheduler_first  # type: ignore[method-assign]
    assert not (await h.round(settle=False)).retry
    h.api.request = real  # type: ignore[method-assign]
    assert h.c.own.settled(ROUND), "the informer holds the release or later: nothing to wait for"
    n = len(h.api.writes())
    result = await h.round()
    assert result.after != h.c.own.ttl
    assert len(h.api.writes()) == n, "the scheduler's condition speaks for the released pod"
    assert not any(c["type"] == gates.POD_CONDITION for c in h.pod("p")["status"]["conditions"])


async def test_release_committed_but_not_audited_is_audited_once_after_restart(
    h: Harness, tmp_path: Path
) -> None:
    """kill -9 between the API's answer and the audit line: the next process finds the
    release recorded on the pod and writes the missing line, exactly once."""
    h.add(pod("p", {"data": rec()}))
    h.add(pod("q", {"data": rec()}))
    h.signal()
    h.c.audit.record = lambda **kw: {}  # type: ignore[method-assign]  # dies before writing
    await h.round()
    assert h.lines() == []
    assert all(h.pod(n)["spec"]["schedulingGates"] == [] for n in ("p", "q"))
    await h.stop()
    for i in range(2):  # a new process (twice: a restart after the restart adds nothing)
        fresh = Harness(h.api, tmp_path, identity=f"test-{i + 2}")
        await fresh.start()
        await fresh.round()
        await fresh.round()
        await fresh.stop()
    got = sorted((r["pod"], r["gate"], r["decision"]) for r in h.lines())
    assert got == [("team-a/p", DATA, "released"), ("team-a/q", DATA, "released")]
    assert all("without its line being written" in r["evidence"] for r in h.lines())
    assert all(r["actor"] == "pilotfish-operator/gates/test-2" for r in h.lines())


async def test_run_decides_nothing_before_every_view_synced(tmp_path: Path) -> None:
    h = Harness(seeded_api(), tmp_path)
    h.add(pod("p", {"data": rec()}))
    h.signal()
    released = asyncio.Event()
    h.c.pods.add_handler(
        lambda _kind, obj, _old: None if obj["spec"].get("schedulingGates") else released.set()
    )
    run = asyncio.ensure_future(h.c.run())
    for _ in range(20):
        await asyncio.sleep(0)
    assert h.api.writes() == [], "informers not running: no round"
    informers = asyncio.ensure_future(h.rt.factory.run())
    try:
        await asyncio.wait_for(released.wait(), 10)
    finally:
        for task in (run, informers):
            task.cancel()
        await asyncio.gather(run, informers, return_exceptions=True)


# --- expiry --------------------------------------------------------------------------------


async def test_expiry_fail_condition_then_conditional_delete_then_audit_and_event(
    h: Harness,
) -> None:
    seen: list[str] = []
    h.c.pods.add_handler(lambda kind, obj, _old: seen.append(rv(obj)))
    h.add(pod("p", {"data": rec(deadline=-1, on_expiry="Fail")}))
    h.signal(ready="False")
    await h.round()
    await h.api.settle()
    calls = [(c.method, c.path.rsplit("/", 1)[-1]) for c in h.api.writes("/pods/p")]
    assert calls == [("PATCH", "status"), ("DELETE", "p")]
    pre = h.api.writes("/pods/p")[1].body["preconditions"]
    assert pre["uid"] == "uid-p"
    assert pre["resourceVersion"] == seen[-2], "conditional on the condition write's version"
    assert h.api.obj(PODS.path("team-a", "p")) is None
    [event] = h.events()
    assert (event["reason"], event["type"]) == (REASON_EXPIRED, "Warning")
    [line] = h.lines()
    assert line["decision"] == "expired-fail" and "not Ready" in line["evidence"]


async def test_expiry_retry_is_a_guarded_json_patch_of_the_record(h: Harness) -> None:
    p = h.add(pod("p", {"data": rec(deadline=-1, on_expiry="Retry", initial=5)}))
    h.signal(ready="False")
    result = await h.round()
    first = h.api.writes("/pods/p")[0]
    assert first.method == "PATCH"
    assert first.body[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": rv(p)}
    assert first.body[1]["path"] == "/metadata/annotations/gates.pilotfish.io~1record"
    record = gates.read_record(h.pod("p"))
    assert record is not None and record.gates[DATA].attempts == 1
    assert record.gates[DATA].deadline == timeutil.format_time(at(5))
    assert [e["reason"] for e in h.events()] == [REASON_RETRY]
    assert [e["decision"] for e in h.lines()] == ["expired-retry"]
    assert h.pod("p")["spec"]["schedulingGates"] == [{"name": DATA}]
    assert result.after == 5, "woken up at the new deadline"


async def test_expiry_review_labels_the_pod_and_keeps_the_gate(h: Harness) -> None:
    h.add(pod("p", {"data": rec(deadline=-1, on_expiry="Review")}))
    h.signal(ready="False")
    await h.round()
    obj = h.pod("p")
    assert obj["metadata"]["labels"][gates.LABEL_REVIEW] == "required"
    assert obj["spec"]["schedulingGates"] == [{"name": DATA}]
    [cond] = obj["status"]["conditions"][-1:]
    assert cond["reason"] == gates.STATE_EXPIRED
    assert [e["reason"] for e in h.events()] == [REASON_REVIEW]
    # Converged: another round with the labelled pod writes nothing more.
    n = len(h.api.writes())
    await h.round()
    assert len(h.api.writes()) == n
    assert [e["decision"] for e in h.lines()] == ["expired-review"]


# --- observation ---------------------------------------------------------------------------


async def test_node_heartbeats_do_not_start_rounds(h: Harness) -> None:
    def node(heartbeat: str, images: list[str]) -> Obj:
        return {
            "metadata": {"name": "n"},
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": heartbeat}],
                "images": [{"names": images, "sizeBytes": 1}],
            },
        }

    async def drained() -> int:
        await h.api.settle()
        n = len(h.c.queue)
        while len(h.c.queue):
            h.c.queue.done(await h.c.queue.get())
        return n

    h.api.put(NODES.path(None, "n"), node("t1", ["app:1"]))
    await drained()
    h.api.put(NODES.path(None, "n"), node("t2", ["app:1"]))
    assert await drained() == 0
    h.api.put(NODES.path(None, "n"), node("t3", ["app:1", "app:2"]))
    assert await drained() == 1


async def test_gauges_drop_label_sets_that_are_gone(h: Harness) -> None:
    p = h.add(pod("p", {"data": rec()}, age=30))
    h.signal(ready="False")
    await h.round()
    assert metrics.GATES_GATED_PODS.labels(DATA, "team-a")._value.get() == 1
    assert metrics.GATES_OLDEST_GATED_AGE.labels(DATA, "team-a")._value.get() == 30
    record = gates.read_record(p)
    assert record is not None
    timeout = metrics.GATES_TIMEOUT.labels(DATA, "team-a")._value.get()
    assert timeout == float(record.gates[DATA].timeout_seconds)
    h.api.remove(PODS.path("team-a", "p"))
    await h.round()
    samples = [s for m in metrics.GATES_GATED_PODS.collect() for s in m.samples]
    assert not any(s.labels == {"gate": DATA, "namespace": "team-a"} for s in samples)
