"""The Event writer (series instead of floods, spam filter, best effort) and the audit log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pilotfish.kube.events import EventRecorder, object_reference
from pilotfish.operators.gates.audit import AuditLog, read, released_keys
from pilotfish.timeutil import FakeClock, format_micro_time
from tests.fakeapi import FakeApi
from tests.test_gates_builders import NOW

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "namespace": "team-a", "uid": "u1", "resourceVersion": "9"},
}


def events(api: FakeApi) -> list[dict[str, Any]]:
    return list(api.store("events.k8s.io/v1", "events").values())


def recorder(api: FakeApi, clock: FakeClock, **kw: Any) -> EventRecorder:
    return EventRecorder(api, "pilotfish.io/gates", "host-1", clock=clock, **kw)


async def test_event_body_is_a_valid_events_k8s_io_v1_event() -> None:
    api, clock = FakeApi(), FakeClock(NOW)
    assert await recorder(api, clock).emit(POD, "GateReleased", "released x", action="Release") == (
        "created"
    )
    [call] = api.writes()
    assert (call.method, call.path) == ("POST", "/apis/events.k8s.io/v1/namespaces/team-a/events")
    body = call.body
    assert body["eventTime"] == format_micro_time(NOW) == "2030-01-01T12:00:00.000000Z"
    assert body["regarding"] == object_reference(POD)
    assert body["regarding"]["uid"] == "u1"
    for field in ("reportingController", "reportingInstance", "action", "reason", "note", "type"):
        assert body[field], field
    assert body["metadata"]["namespace"] == "team-a"


async def test_repeats_become_a_series_written_at_most_once_per_interval() -> None:
    api, clock = FakeApi(), FakeClock(NOW)
    rec = recorder(api, clock, series_interval=30.0)
    outcomes = []
    for _ in range(5):
        outcomes.append(await rec.emit(POD, "GateRetry", "same", action="Retry"))
        clock.advance(10)
    assert outcomes == ["created", "pending", "pending", "series", "pending"]
    [event] = events(api)
    assert event["series"]["count"] == 4
    assert len(api.writes()) == 2  # one create, one series patch: not five writes


async def test_a_different_note_is_a_different_event() -> None:
    api, clock = FakeApi(), FakeClock(NOW)
    rec = recorder(api, clock)
    await rec.emit(POD, "GateReleased", "a", action="Release")
    await rec.emit(POD, "GateReleased", "b", action="Release")
    assert len(events(api)) == 2


async def test_spam_filter_caps_events_per_object() -> None:
    api, clock = FakeApi(), FakeClock(NOW)
    rec = recorder(api, clock, burst=3, refill_seconds=60.0)
    got = [await rec.emit(POD, "GateRetry", f"n{i}", action="Retry") for i in range(5)]
    assert got == ["created", "created", "created", "dropped", "dropped"]
    other = {**POD, "metadata": {**POD["metadata"], "name": "q", "uid": "u2"}}
    assert await rec.emit(other, "GateRetry", "n0", action="Retry") == "created"
    clock.advance(60)
    assert await rec.emit(POD, "GateRetry", "n9", action="Retry") == "created"


async def test_expired_series_event_is_created_again() -> None:
    api, clock = FakeApi(), FakeClock(NOW)
    rec = recorder(api, clock, series_interval=1.0)
    await rec.emit(POD, "GateRetry", "same", action="Retry")
    api.store("events.k8s.io/v1", "events").clear()  # the Event's TTL ran out on the server
    clock.advance(2)
    assert await rec.emit(POD, "GateRetry", "same", action="Retry") == "created"
    assert len(events(api)) == 1


async def test_a_failed_write_is_reported_not_raised() -> None:
    api, clock = FakeApi(), FakeClock(NOW)
    api.fail_next("POST", "/apis/events.k8s.io/v1/namespaces/team-a/events", 403)
    assert await recorder(api, clock).emit(POD, "GateReleased", "x", action="Release") is None


def test_audit_line_format(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "audit.jsonl"
    log = AuditLog(path, "pilotfish-operator/gates/host-1")
    for decision in ("released", "expired-retry"):
        log.record(
            ts=NOW,
            namespace="team-a",
            name="p",
            uid="u1",
            gate="gates.pilotfish.io/data",
            decision=decision,
            evidence="GateSignal team-a/data Ready",
            resource_version="12",
            decided_from="11",
        )
    raw = path.read_text().splitlines()
    assert len(raw) == 2
    first = json.loads(raw[0])
    assert first == {
        "ts": "2030-01-01T12:00:00.000000Z",
        "pod": "team-a/p",
        "uid": "u1",
        "gate": "gates.pilotfish.io/data",
        "decision": "released",
        "evidence": "GateSignal team-a/data Ready",
        "resourceVersion": "12",
        "decidedFrom": "11",
        "actor": "pilotfish-operator/gates/host-1",
    }
    # Flushed at once: readable while the writer still holds the file open.
    assert [r["decision"] for r in read(path)] == ["released", "expired-retry"]
    log.close()


def test_audit_without_a_file_still_logs(tmp_path: Path) -> None:
    line = AuditLog(None, "a").record(
        ts=NOW,
        namespace="n",
        name="p",
        uid="u",
        gate="g",
        decision="expired-fail",
        evidence="e",
        resource_version="1",
    )
    assert line["decision"] == "expired-fail"
    assert list(tmp_path.iterdir()) == []


def test_audit_reader_skips_an_unfinished_last_line_and_garbage(tmp_path: Path) -> None:
    """After a kill -9 (or while the writer is mid-line) the file may end in half a line;
    the controller reads the file on start and must not choke on it."""
    path = tmp_path / "audit.jsonl"
    good = {"uid": "u1", "gate": "g", "decision": "released"}
    path.write_text(json.dumps(good) + "\nnot json\n" + json.dumps(good)[:20])
    assert read(path) == [good]
    assert released_keys(path) == {("u1", "g")}
    assert read(tmp_path / "missing.jsonl") == []
