"""The act layer of the gate controller against a fake API server that enforces what the real
one does with our writes: resourceVersion preconditions (409), JSON-patch `test` ops,
strategic-merge deletion of one gate by name, delete preconditions.

The informers are not run: their stores are filled by hand and marked synced, so each test
states exactly what the controller saw and checks exactly what it wrote.
"""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from pilotfish import gates, metrics, names, timeutil
from pilotfish.kube.informer import object_key
from pilotfish.kube.rest import JSON_PATCH, STRATEGIC_MERGE_PATCH, ApiError, Rest
from pilotfish.operators.gates import audit
from pilotfish.operators.gates.controller import (
    REASON_EXPIRED,
    REASON_RELEASED,
    REASON_RETRY,
    REASON_REVIEW,
    ROUND,
    GateController,
    UsageIndex,
    usage_projection,
)
from pilotfish.operators.gates.model import ANNOTATION_RELEASED
from tests.test_gates_builders import NOW, at, gate_policy, pod, rec

DATA = "gates.pilotfish.io/data"
HONEST = {"data": {"type": "GateSignal", "signalName": "data"}, "quota": {"type": "Quota"}}


def _unescape(seg: str) -> str:
    return seg.replace("~1", "/").replace("~0", "~")


class FakeApi(Rest):
    """Pods and Events in memory, with the API server's concurrency rules for our writes."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.events: dict[str, dict[str, Any]] = {}
        self.rv = 100
        self.calls: list[tuple[str, str, Any]] = []
        self.fail_next: dict[str, ApiError] = {}
        self.lose_response: set[str] = set()  # paths whose next write commits, then errs

    def add(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.pods[object_key(obj)] = obj
        return copy.deepcopy(obj)

    def touch(self, key: str) -> dict[str, Any]:
        """Someone else wrote the pod: a new resourceVersion."""
        obj = self.pods[key]
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(obj)

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return {"kind": "Pod", **copy.deepcopy(obj)}

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        request_timeout: float | None = 30.0,
    ) -> dict[str, Any]:
        del params, request_timeout
        self.calls.append((method, path, copy.deepcopy(body)))
        if path in self.fail_next:
            raise self.fail_next.pop(path)
        parts = path.strip("/").split("/")
        if "events" in parts:
            return self._event(method, parts, body)
        ns, name = parts[3], parts[5]
        key = f"{ns}/{name}"
        obj = self.pods.get(key)
        if obj is None:
            raise ApiError(404, "NotFound", f"pods {name} not found")
        rv = obj["metadata"]["resourceVersion"]
        if method == "DELETE":
            pre = (body or {}).get("preconditions") or {}
            if pre.get("resourceVersion") not in (None, rv) or pre.get("uid") not in (
                None,
                obj["metadata"]["uid"],
            ):
                raise ApiError(409, "Conflict", "precondition failed")
            del self.pods[key]
            return {"kind": "Status", "status": "Success"}
        assert method == "PATCH"
        if path in self.lose_response:
            self.lose_response.discard(path)
            await self.request(method, path, body=body, content_type=content_type)
            raise ApiError(504, "Timeout", "the response was lost after the write committed")
        if content_type == JSON_PATCH:
            for op in body:
                segs = [_unescape(s) for s in op["path"].strip("/").split("/")]
                if op["op"] == "test":
                    if obj["metadata"]["resourceVersion"] != op["value"]:
                        raise ApiError(422, "Invalid", "test operation failed")
                    continue
                target = obj
                for s in segs[:-1]:
                    target = target[s]
                target[segs[-1]] = op["value"]
            return self._bump(obj)
        assert content_type == STRATEGIC_MERGE_PATCH
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want is not None and want != rv:
            raise ApiError(409, "Conflict", "the object has been modified")
        if parts[-1] == "status":
            conds = obj.setdefault("status", {}).setdefault("conditions", [])
            for c in body["status"]["conditions"]:
                conds[:] = [x for x in conds if x["type"] != c["type"]] + [c]
        else:
            annotations = (body.get("metadata") or {}).get("annotations") or {}
            obj["metadata"].setdefault("annotations", {}).update(annotations)
            drop = {
                g["name"] for g in body["spec"]["schedulingGates"] if g.get("$patch") == "delete"
            }
            held = obj["spec"].get("schedulingGates") or []
            obj["spec"]["schedulingGates"] = [g for g in held if g["name"] not in drop]
        return self._bump(obj)

    def _event(self, method: str, parts: list[str], body: Any) -> dict[str, Any]:
        if method == "POST":
            self.events[body["metadata"]["name"]] = copy.deepcopy(body)
            return dict(body)
        name = parts[-1]
        if name not in self.events:
            raise ApiError(404, "NotFound", "event not found")
        self.events[name].update(copy.deepcopy(body))
        return self.events[name]

    def writes(self, kind: str = "") -> list[tuple[str, str, Any]]:
        return [c for c in self.calls if c[0] != "GET" and kind in c[1]]


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime.datetime:
        return self.now


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def controller(api: FakeApi, clock: Clock, tmp_path: Path) -> GateController:
    c = GateController(api, identity="test-1", audit_log=tmp_path / "audit.jsonl", clock=clock)
    for inf in (*c.required, c.signals):
        inf.synced.set()
    c.namespaces.store["team-a"] = {
        "metadata": {"name": "team-a", "resourceVersion": "1", "labels": {names.LABEL_TEAM: "t"}}
    }
    # The GatePolicy that gave the tests' pods their gates (`rec()` names it).
    c.policies.store["team-a/policy"] = gate_policy("policy", HONEST)
    return c


def observe(c: GateController, *objs: dict[str, Any]) -> None:
    """What the watch delivers: the pods' current versions."""
    for o in objs:
        c._on_pod("MODIFIED", o, None)
        c.pods.store[object_key(o)] = o


def raise_signal(c: GateController, name: str = "data", ready: str = "True") -> None:
    c.signals.store[f"team-a/{name}"] = {
        "metadata": {"name": name, "namespace": "team-a", "resourceVersion": "7"},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }


def set_quota(c: GateController, cpu: str) -> None:
    c.quotas.store["t"] = {
        "metadata": {"name": "t"},
        "spec": {"team": "t", "bands": {"batch": {"cpu": cpu}}},
    }


def lines(tmp_path: Path) -> list[dict[str, Any]]:
    return audit.read(tmp_path / "audit.jsonl")


def counter(metric: Any, *labels: str) -> float:
    return float(metric.labels(*labels)._value.get())


# --- release -------------------------------------------------------------------------------


async def test_release_is_one_conditional_patch_then_audit_event_and_condition(
    api: FakeApi, clock: Clock, tmp_path: Path
) -> None:
    c = controller(api, clock, tmp_path)
    p = api.add(pod("p", {"data": rec()}))
    observe(c, p)
    raise_signal(c)
    before = counter(metrics.GATES_RELEASES, DATA, "team-a")
    await c.sync(ROUND)

    pod_writes = api.writes("/pods/")
    method, path, body = pod_writes[0]
    assert (method, path) == ("PATCH", "/api/v1/namespaces/team-a/pods/p")
    released = json.loads(body["metadata"].pop("annotations")[ANNOTATION_RELEASED])
    assert body == {
        "metadata": {"resourceVersion": p["metadata"]["resourceVersion"]},
        "spec": {"schedulingGates": [{"name": DATA, "$patch": "delete"}]},
    }
    assert released == {
        DATA: {
            "at": "2030-01-01T12:00:00Z",
            "evidence": "GateSignal team-a/data Ready (resourceVersion 7)",
            "decidedFrom": p["metadata"]["resourceVersion"],
            "actor": "pilotfish-operator/gates/test-1",
        }
    }
    # The condition is written after, conditional on the version the release produced.
    method, path, body = pod_writes[1]
    assert path.endswith("/pods/p/status")
    assert body["metadata"]["resourceVersion"] == str(int(p["metadata"]["resourceVersion"]) + 1)
    [cond] = body["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        gates.POD_CONDITION,
        "True",
        gates.STATE_READY,
    )
    assert api.pods["team-a/p"]["spec"]["schedulingGates"] == []

    [line] = lines(tmp_path)
    assert line == {
        "ts": "2030-01-01T12:00:00.000Z",
        "pod": "team-a/p",
        "uid": "uid-p",
        "gate": DATA,
        "decision": "released",
        "evidence": "GateSignal team-a/data Ready (resourceVersion 7)",
        "resourceVersion": str(int(p["metadata"]["resourceVersion"]) + 1),
        "decidedFrom": p["metadata"]["resourceVersion"],
        "actor": "pilotfish-operator/gates/test-1",
    }
    [event] = api.events.values()
    assert event["reason"] == REASON_RELEASED and event["regarding"]["name"] == "p"
    assert event["reportingController"] == "pilotfish.io/gates" and event["type"] == "Normal"
    assert counter(metrics.GATES_RELEASES, DATA, "team-a") == before + 1


async def test_conflict_skips_the_pods_other_writes_and_decides_again(
    api: FakeApi, clock: Clock, tmp_path: Path
) -> None:
    c = controller(api, clock, tmp_path)
    stale = api.add(pod("p", {"data": rec()}))
    observe(c, stale)
    raise_signal(c)
    api.touch("team-a/p")  # someone wrote the pod after our informer saw it
    before = counter(metrics.OPERATOR_CONFLICTS, "gates")
    await c.sync(ROUND)
    assert [m for m, _, _ in api.writes("/pods/")] == ["PATCH"]  # refused; no status write
    assert lines(tmp_path) == []
    assert api.pods["team-a/p"]["spec"]["schedulingGates"] == [{"name": DATA}]
    assert counter(metrics.OPERATOR_CONFLICTS, "gates") == before + 1
    assert ROUND in c.queue._timers, "a conflict schedules another round"
    # The watch delivers the fresh copy; the next round succeeds, audited once.
    observe(c, copy.deepcopy(api.pods["team-a/p"]))
    await c.sync(ROUND)
    assert api.pods["team-a/p"]["spec"]["schedulingGates"] == []
    assert [entry["decision"] for entry in lines(tmp_path)] == ["released"]


async def test_rounds_before_the_watch_catches_up_do_not_release_twice(
    api: FakeApi, clock: Clock, tmp_path: Path
) -> None:
    """Duplicate events and a lagging watch: the write's own response stands in for the
    cached pod, so the next round neither re-patches nor re-audits, and counts it."""
    c = controller(api, clock, tmp_path)
    pods = [api.add(pod(f"p{i}", {"quota": rec("Quota")}, team="t", age=10 - i)) for i in range(2)]
    observe(c, *pods)
    set_quota(c, "1")
    await c.sync(ROUND)
    await c.sync(ROUND)  # the informer still holds the old, gated copy of p0
    await c.sync(ROUND)
    released = [json.dumps(b) for m, p, b in api.writes("/pods/") if not p.endswith("/status")]
    assert len(released) == 1 and '"p0"' not in released[0]
    assert [(e["pod"], e["decision"]) for e in lines(tmp_path)] == [("team-a/p0", "released")]
    assert api.pods["team-a/p1"]["spec"]["schedulingGates"] == [
        {"name": "gates.pilotfish.io/quota"}
    ]
    # Once the watch shows the write, the assumption is dropped and the truth is used.
    observe(c, copy.deepcopy(api.pods["team-a/p0"]))
    assert "team-a/p0" not in c._assumed


async def test_duplicate_removal_patch_is_harmless(
    api: FakeApi, clock: Clock, tmp_path: Path
) -> None:
    """The removal itself is idempotent: applied to a pod that lost the gate already, the
    same strategic-merge patch leaves the other gates alone."""
    obj = api.add(pod("p", {"data": rec()}, other_gates=["example.com/x"]))
    patch = gates.remove_gate_patch(DATA)
    for _ in range(2):
        await api.patch("/api/v1/namespaces/team-a/pods/p", patch, STRATEGIC_MERGE_PATCH)
    assert api.pods["team-a/p"]["spec"]["schedulingGates"] == [{"name": "example.com/x"}]
    assert obj["spec"]["schedulingGates"][0]["name"] == DATA


async def test_unanswered_release_counts_as_released_until_the_watch_says(
    api: FakeApi, clock: Clock, tmp_path: Path
) -> None:
    """A release whose response was lost may have committed. If the next round believed the
    stale cache, a higher-priority pod arriving meanwhile would get the same quota."""
    c = controller(api, clock, tmp_path)
    p0 = api.add(pod("p0", {"quota": rec("Quota")}, team="t", age=10))
    observe(c, p0)
    set_quota(c, "1")
    api.lose_response.add("/api/v1/namespaces/team-a/pods/p0")
    with pytest.raises(ApiError):
        await c.sync(ROUND)
    assert api.pods["team-a/p0"]["spec"]["schedulingGates"] == []  # it did commit
    assert "team-a/p0" in c._assumed
    observe(c, api.add(pod("p1", {"quota": rec("Quota")}, team="t", priority=100)))
    await c.sync(ROUND)
    gate_writes = [b for _, path, b in api.writes("/pods/p1") if not path.endswith("/status")]
    assert gate_writes == [], "p1 must wait: p0 may hold the quota"
    assert api.pods["team-a/p1"]["spec"]["schedulingGates"] == [
        {"name": "gates.pilotfish.io/quota"}
    ]
    # The watch shows p0's real state: the guess is replaced by the truth.
    observe(c, copy.deepcopy(api.pods["team-a/p0"]))
    assert "team-a/p0" not in c._assumed


async def test_release_committed_but_not_audited_is_audited_once_after_restart(
    api: FakeApi, clock: Clock, tmp_path: Path
) -> None:
    """kill -9 between the API's answer and the audit line: the next process finds the
    release recorded on the pod and writes the missing line, exactly once."""
    c = controller(api, clock, tmp_path)
    observe(c, api.add(pod("p", {"data": rec()})), api.add(pod("q", {"data": rec()})))
    raise_signal(c)
    c.audit.record = lambda **kw: {}  # type: ignore[method-assign]  # dies before writing
    await c.sync(ROUND)
    assert lines(tmp_path) == []
    assert all(api.pods[k]["spec"]["schedulingGates"] == [] for k in ("team-a/p", "team-a/q"))

    for _ in range(2):  # a new process (twice: a restart after the restart adds nothing)
        fresh = controller(api, clock, tmp_path)
        observe(fresh, *(copy.deepcopy(o) for o in api.pods.values()))
        raise_signal(fresh)
        await fresh.sync(ROUND)
        await fresh.sync(ROUND)
        fresh.audit.close()
    got = sorted((r["pod"], r["gate"], r["decision"]) for r in lines(tmp_path))
    assert got == [("team-a/p", DATA, "released"), ("team-a/q", DATA, "released")]
    assert all("after a restart" in r["evidence"] for r in lines(tmp_path))
    assert all(r["ts"] == "2030-01-01T12:00:00.000Z" for r in lines(tmp_path))


async def test_not_synced_no_round(api: FakeApi, clock: Clock, tmp_path: Path) -> None:
    c = controller(api, clock, tmp_path)
    c.quotas.synced.clear()
    observe(c, api.add(pod("p", {"data": rec()})))
    raise_signal(c)
    await c.sync(ROUND)
    assert api.calls == []


# --- expiry --------------------------------------------------------------------------------


async def test_expiry_fail_condition_then_event_then_conditional_delete_then_audit(
    api: FakeApi, clock: Clock, tmp_path: Path
) -> None:
    c = controller(api, clock, tmp_path)
    observe(c, api.add(pod("p", {"data": rec(deadline=-1, on_expiry="Fail")})))
    raise_signal(c, ready="False")
    await c.sync(ROUND)
    calls = [(m, p.rsplit("/", 1)[-1]) for m, p, _ in api.calls]
    assert calls[0] == ("PATCH", "status")
    assert calls[1][0] == "POST"  # the Event
    assert calls[2] == ("DELETE", "p")
    delete_body = api.calls[2][2]
    assert delete_body["preconditions"]["uid"] == "uid-p"
    assert delete_body["preconditions"]["resourceVersion"] == str(api.rv)
    assert "team-a/p" not in api.pods
    [event] = api.events.values()
    assert (event["reason"], event["type"]) == (REASON_EXPIRED, "Warning")
    [line] = lines(tmp_path)
    assert line["decision"] == "expired-fail" and "not Ready" in line["evidence"]


async def test_expiry_retry_is_a_guarded_json_patch_of_the_record(
    api: FakeApi, clock: Clock, tmp_path: Path
) -> None:
    c = controller(api, clock, tmp_path)
    p = api.add(pod("p", {"data": rec(deadline=-1, on_expiry="Retry", initial=5)}))
    observe(c, p)
    raise_signal(c, ready="False")
    await c.sync(ROUND)
    method, _, ops = api.calls[0]
    assert method == "PATCH"
    assert ops[0] == {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": p["metadata"]["resourceVersion"],
    }
    assert ops[1]["path"] == "/metadata/annotations/gates.pilotfish.io~1record"
    record = gates.read_record(api.pods["team-a/p"])
    assert record is not None and record.gates[DATA].attempts == 1
    assert record.gates[DATA].deadline == timeutil.format_time(at(5))
    assert [e["reason"] for e in api.events.values()] == [REASON_RETRY]
    assert [e["decision"] for e in lines(tmp_path)] == ["expired-retry"]
    assert api.pods["team-a/p"]["spec"]["schedulingGates"] == [{"name": DATA}]
    assert ROUND in c.queue._timers  # woken up at the new deadline


async def test_expiry_review_labels_the_pod_and_keeps_the_gate(
    api: FakeApi, clock: Clock, tmp_path: Path
) -> None:
    c = controller(api, clock, tmp_path)
    observe(c, api.add(pod("p", {"data": rec(deadline=-1, on_expiry="Review")})))
    raise_signal(c, ready="False")
    await c.sync(ROUND)
    obj = api.pods["team-a/p"]
    assert obj["metadata"]["labels"][gates.LABEL_REVIEW] == "required"
    assert obj["spec"]["schedulingGates"] == [{"name": DATA}]
    [cond] = obj["status"]["conditions"][-1:]
    assert cond["reason"] == gates.STATE_EXPIRED
    assert [e["reason"] for e in api.events.values()] == [REASON_REVIEW]
    # Converged: another round with the labelled pod writes nothing more.
    observe(c, copy.deepcopy(obj))
    n = len(api.calls)
    await c.sync(ROUND)
    assert len(api.calls) == n
    assert [e["decision"] for e in lines(tmp_path)] == ["expired-review"]


# --- observation ---------------------------------------------------------------------------


def test_usage_projection_counts_only_quota_holding_ungated_pods() -> None:
    plain = pod("plain", None, team="t", cpu="2")
    plain["metadata"]["labels"].pop(gates.LABEL_GATED)
    gated = pod("g", {"data": rec()}, team="t")
    leaving = copy.deepcopy(plain)
    leaving["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    assert usage_projection(plain)["usage"] == ("team-a", "t", "batch")
    assert usage_projection(plain)["requests"]["cpu"] == 2
    assert usage_projection(gated)["usage"] is None  # the gated informer's copy counts it
    assert usage_projection(leaving)["usage"] is None


def test_usage_index_adds_updates_and_removes() -> None:
    idx = UsageIndex()

    def proj(name: str, cpu: str) -> dict[str, Any]:
        o = pod(name, None, team="t", cpu=cpu)
        o["metadata"]["labels"].pop(gates.LABEL_GATED)
        return usage_projection(o)

    assert idx.apply("ADDED", proj("a", "1"))
    assert idx.apply("ADDED", proj("b", "2"))
    assert idx.totals[("team-a", "t", "batch")] == {"cpu": 3, "pods": 2}
    assert not idx.apply("MODIFIED", proj("b", "2")), "same contribution: no change"
    assert idx.apply("MODIFIED", proj("b", "5"))
    assert idx.totals[("team-a", "t", "batch")]["cpu"] == 6
    assert idx.apply("DELETED", proj("a", "1"))
    assert idx.apply("DELETED", proj("b", "5"))
    assert idx.totals == {}


def test_node_heartbeats_do_not_start_rounds(api: FakeApi, clock: Clock, tmp_path: Path) -> None:
    c = controller(api, clock, tmp_path)
    kicks: list[int] = []
    c._kick = lambda: kicks.append(1)  # type: ignore[method-assign]
    c._wire()

    def node(rv: str, images: list[str]) -> dict[str, Any]:
        raw = {
            "metadata": {"name": "n", "resourceVersion": rv},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "images": [{"names": images}],
            },
        }
        return c.nodes.transform(raw)

    handlers: list[Callable[[str, Any, Any], None]] = c.nodes.handlers[-1:]
    [h] = handlers
    h("MODIFIED", node("2", ["app:1"]), node("1", ["app:1"]))
    assert kicks == []
    h("MODIFIED", node("3", ["app:1", "app:2"]), node("2", ["app:1"]))
    assert kicks == [1]


async def test_gauges_drop_label_sets_that_are_gone(
    api: FakeApi, clock: Clock, tmp_path: Path
) -> None:
    c = controller(api, clock, tmp_path)
    p = api.add(pod("p", {"data": rec()}, age=30))
    observe(c, p)
    raise_signal(c, ready="False")
    await c.sync(ROUND)
    assert metrics.GATES_GATED_PODS.labels(DATA, "team-a")._value.get() == 1
    assert metrics.GATES_OLDEST_GATED_AGE.labels(DATA, "team-a")._value.get() == 30
    timeout = metrics.GATES_TIMEOUT.labels(DATA, "team-a")._value.get()
    assert timeout == p_record_timeout(p)
    c.pods.store.clear()
    c._on_pod("DELETED", p, None)
    await c.sync(ROUND)
    samples = [s for m in metrics.GATES_GATED_PODS.collect() for s in m.samples]
    assert not any(s.labels == {"gate": DATA, "namespace": "team-a"} for s in samples)


async def test_watch_ahead_of_the_write_response_wins(
    api: FakeApi, clock: Clock, tmp_path: Path
) -> None:
    """The scheduler writes a just-released pod within milliseconds: its newer version may
    reach the informer before our write's response does. The older response must not then
    shadow the newer copy (every round would decide from it and hit a conflict)."""
    c = controller(api, clock, tmp_path)
    p = api.add(pod("p", {"data": rec()}))
    observe(c, p)
    raise_signal(c)
    await c.sync(ROUND)  # released and assumed at the write's version
    ours = api.pods["team-a/p"]["metadata"]["resourceVersion"]
    newer = api.touch("team-a/p")
    newer["status"]["conditions"].append(
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no"}
    )
    api.pods["team-a/p"] = copy.deepcopy(newer)
    # The watch delivered the newer version already; our assumption arrives late.
    c.pods.store["team-a/p"] = newer
    c._assume(
        "team-a/p",
        {
            "kind": "Pod",
            **api.pods["team-a/p"],
            "metadata": {**newer["metadata"], "resourceVersion": ours},
        },
        ours,
    )
    [view] = [v for v in c.world().pods if v.name == "p"]
    assert view.resource_version == newer["metadata"]["resourceVersion"]
    assert "team-a/p" not in c._assumed
    await c.sync(ROUND)
    assert api.pods["team-a/p"]["status"]["conditions"][-1]["reason"] == gates.STATE_UNSCHEDULABLE


def p_record_timeout(pod: Any) -> float:
    """The timeout the webhook's record gave the pod's gate (what the alert compares with)."""
    from pilotfish.gates import read_record

    record = read_record(pod)
    assert record is not None
    return float(record.gates[DATA].timeout_seconds)
