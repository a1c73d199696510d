"""`kubectl pilotfish gates`: listing, and the planning and retry logic of release and cancel.

No cluster: the pure functions get pods as the API returns them, and the commands run on the
in-memory API (`tests.fakeapi`), whose conflicts are real: another writer's change between
the command's read and its write (`FakeApi.before`) makes the conditional write fail.
"""

from __future__ import annotations

import datetime
import io
import json
from dataclasses import asdict
from typing import Any

import pytest

from pilotfish import gates, timeutil
from pilotfish.cli import gates_cmd, gates_list, gates_plan, kubectl_plugin
from pilotfish.cli.connect import Identity
from pilotfish.cli.gates_plan import Refused
from pilotfish.cli.output import human_duration, table
from pilotfish.kube.rest import EVENTS, PODS, STRATEGIC_MERGE_PATCH, ApiError
from pilotfish.timeutil import FakeClock
from tests.fakeapi import FakeApi

NOW = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)
ALICE = Identity("alice", ("pilotfish:gate-releasers", "system:authenticated"))
MALLORY = Identity("mallory", ("system:authenticated",))
SIGNAL = "gates.pilotfish.io/data-ready"
GANG = "gates.pilotfish.io/gang"


def at(seconds: float) -> str:
    return timeutil.format_time(NOW + datetime.timedelta(seconds=seconds))


def record(
    condition: dict[str, Any] | None = None, timeout: int = 600, created: float = -60, **kw: Any
) -> gates.GateRecord:
    return gates.GateRecord(
        policy=kw.pop("policy", "nightly"),
        generation=kw.pop("generation", 3),
        condition=condition or {"type": "GateSignal", "signalName": "data-ready"},
        timeout_seconds=timeout,
        deadline=at(created + timeout),
        **kw,
    )


def pod(
    name: str = "p1",
    namespace: str = "team-a",
    held: tuple[str, ...] = (SIGNAL,),
    records: dict[str, gates.GateRecord] | None = None,
    created: float = -60,
    labels: dict[str, str] | None = None,
    state: str | None = None,
    rv: str = "100",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}",
        "resourceVersion": rv,
        "creationTimestamp": at(created),
        "labels": {gates.LABEL_GATED: "true", **(labels or {})},
        "annotations": {},
    }
    if records is not None:
        meta["annotations"][gates.ANNOTATION_RECORD] = gates.PodGates(
            created=at(created), gates=records
        ).encode()
        meta["annotations"][gates.ANNOTATION_CREATED] = at(created)
    status: dict[str, Any] = {"phase": "Pending", "conditions": []}
    if state:
        status["conditions"].append(
            {"type": gates.POD_CONDITION, "status": "False", "reason": state, "message": "m"}
        )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "containers": [{"name": "app", "image": "example/app:1"}],
            "schedulingGates": [{"name": g} for g in held],
        },
        "status": status,
    }


# --- output helpers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "0s"),
        (0, "0s"),
        (45, "45s"),
        (119, "119s"),
        (120, "2m"),
        (252, "4m12s"),
        (600, "10m"),
        (179 * 60, "179m"),
        (3 * 3600 + 5 * 60, "3h5m"),
        (5 * 3600, "5h"),
        (30 * 3600, "30h"),
        (3 * 86400 + 4 * 3600, "3d4h"),
        (40 * 86400, "40d"),
        (365 * 2 * 86400 + 30 * 86400, "2y30d"),
        (365 * 9 * 86400, "9y"),
    ],
)
def test_human_duration_matches_kubectl(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text


def test_table_pads_columns_three_spaces_apart_without_trailing_blanks() -> None:
    out = table(["A", "LONGER"], [["xyz", "1"], ["q", ""]])
    assert out.splitlines() == ["A     LONGER", "xyz   1", "q"]


# --- listing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "text"),
    [
        ({"type": "GateSignal", "signalName": "warehouse-export"}, "GateSignal(warehouse-export)"),
        ({"type": "Gang", "size": 8}, "Gang(size=8)"),
        ({"type": "Image", "minNodes": 2}, "Image(minNodes=2)"),
        ({"type": "Image"}, "Image"),
        ({"type": "Quota"}, "Quota"),
        (None, "-"),
    ],
)
def test_condition_text(condition: dict[str, Any] | None, text: str) -> None:
    assert gates_list.condition_text(condition) == text


def test_rows_list_only_pilotfish_gates_one_row_each_sorted() -> None:
    pods = [
        pod(
            "b",
            held=(GANG, "example.com/other", SIGNAL),
            records={SIGNAL: record(), GANG: record({"type": "Gang", "size": 4})},
        ),
        pod("a", held=(SIGNAL,), records={SIGNAL: record()}),
        pod("released", held=(), records={SIGNAL: record()}),
        pod("foreign", held=("example.com/other",)),
    ]
    rows = gates_list.gate_rows(pods)
    assert [(r.pod, r.gate) for r in rows] == [("a", SIGNAL), ("b", SIGNAL), ("b", GANG)]
    assert rows[2].record is not None and rows[2].record.condition == {"type": "Gang", "size": 4}


def test_table_shows_condition_age_deadline_expiry_review_and_state() -> None:
    live = pod("live", records={SIGNAL: record(timeout=600, created=-60)}, state="SchedulingGated")
    late = pod(
        "late",
        records={SIGNAL: record(timeout=60, created=-300, on_expiry="Review")},
        created=-300,
        labels={gates.LABEL_REVIEW: "required"},
        state="Expired",
    )
    bare = pod("bare", records=None, created=-30)
    out = gates_list.render_table(gates_list.gate_rows([live, late, bare]), NOW)
    header, *lines = out.splitlines()
    assert header.split() == list(gates_list.HEADER)
    by_pod = {line.split()[1]: line for line in lines}
    assert by_pod["live"].split() == [
        "team-a",
        "live",
        SIGNAL,
        "GateSignal(data-ready)",
        "60s",
        "in",
        "9m",
        "Fail",
        "-",
        "SchedulingGated",
    ]
    assert "EXPIRED 4m ago" in by_pod["late"]
    assert by_pod["late"].split()[-3:] == ["Review", "required", "Expired"]
    # A gate nobody recorded is listed, with what is unknown shown as unknown.
    assert by_pod["bare"].split() == ["team-a", "bare", SIGNAL, "-", "30s", "-", "-", "-", "-"]


def test_wide_adds_absolute_deadline_and_policy() -> None:
    rows = gates_list.gate_rows([pod(records={SIGNAL: record(timeout=600, created=-60)})])
    out = gates_list.render_table(rows, NOW, wide=True)
    header, line = out.splitlines()
    assert header.split()[-2:] == ["DEADLINE-AT", "POLICY"]
    assert line.split()[-2:] == [at(540), "nightly@3"]


def test_json_has_absolute_times_and_expiry_as_data() -> None:
    pods = [
        pod("live", records={SIGNAL: record(timeout=600, created=-60)}),
        pod("late", records={SIGNAL: record(timeout=60, created=-300)}, created=-300),
    ]
    items = gates_list.rows_json(gates_list.gate_rows(pods), NOW)["items"]
    late, live = items
    assert live["deadline"] == at(540) and live["remainingSeconds"] == 540
    assert live["expired"] is False and live["ageSeconds"] == 60
    assert live["condition"] == {"type": "GateSignal", "signalName": "data-ready"}
    assert late["expired"] is True and late["remainingSeconds"] == -240
    json.dumps(items)  # serialisable as is


# --- planning ------------------------------------------------------------------------------


def test_resolve_gate_accepts_the_bare_condition_for_pilotfish_gates() -> None:
    assert gates_plan.resolve_gate("data-ready", [SIGNAL]) == SIGNAL
    assert gates_plan.resolve_gate(SIGNAL, [GANG, SIGNAL]) == SIGNAL


def test_resolve_gate_refuses_a_gate_not_held_naming_the_held_ones() -> None:
    with pytest.raises(Refused) as e:
        gates_plan.resolve_gate("gates.pilotfish.io/nope", [SIGNAL, "example.com/x"])
    assert "does not hold gate gates.pilotfish.io/nope" in str(e.value)
    assert f"it holds: {SIGNAL}, example.com/x" in str(e.value)
    with pytest.raises(Refused, match="holds: no scheduling gates"):
        gates_plan.resolve_gate(SIGNAL, [])


def test_resolve_gate_refuses_other_owners_gates_even_when_held() -> None:
    with pytest.raises(Refused, match="not a Pilotfish gate"):
        gates_plan.resolve_gate("example.com/x", ["example.com/x"])


def test_release_plan_deletes_one_gate_conditionally_and_records_who_and_why() -> None:
    p = pod(held=(GANG, "example.com/other", SIGNAL), records={SIGNAL: record()}, rv="4711")
    plan = gates_plan.plan_release(p, "data-ready", ALICE, "  warehouse\n is late ", NOW)
    assert plan.gate == SIGNAL and plan.resource_version == "4711"
    assert plan.remaining == (GANG, "example.com/other")
    assert plan.patch["spec"] == {"schedulingGates": [{"name": SIGNAL, "$patch": "delete"}]}
    assert plan.patch["metadata"]["resourceVersion"] == "4711"
    note = json.loads(plan.patch["metadata"]["annotations"][gates_plan.ANNOTATION_MANUAL_RELEASE])
    assert note == {"gate": SIGNAL, "by": "alice", "reason": "warehouse is late", "at": at(0)}
    assert (plan.event.reason, plan.event.action) == ("GateManuallyReleased", "ReleaseGate")
    assert "alice" in plan.event.note and "warehouse is late" in plan.event.note
    assert SIGNAL in plan.event.note


@pytest.mark.parametrize(
    ("mutate", "gate", "reason", "message"),
    [
        (lambda p: p, SIGNAL, "   ", "--reason must say why"),
        (
            lambda p: p["metadata"].update(deletionTimestamp=at(0)),
            SIGNAL,
            "r",
            "is being deleted",
        ),
        (lambda p: p, "gates.pilotfish.io/other", "r", f"it holds: {SIGNAL}"),
    ],
)
def test_release_plan_refusals(mutate: Any, gate: str, reason: str, message: str) -> None:
    p = pod()
    mutate(p)
    with pytest.raises(Refused, match=message):
        gates_plan.plan_release(p, gate, ALICE, reason, NOW)


def test_cancel_plan_deletes_with_uid_and_version_preconditions() -> None:
    plan = gates_plan.plan_cancel(pod(held=(SIGNAL, "example.com/x"), rv="9"), ALICE, "dup")
    assert plan.delete_options["preconditions"] == {"uid": "uid-p1", "resourceVersion": "9"}
    assert plan.held == (SIGNAL,)
    assert plan.event.reason == "GateCancelled" and "dup" in plan.event.note


def test_cancel_plan_refuses_pods_not_gated_by_pilotfish() -> None:
    with pytest.raises(Refused, match=r"holds no Pilotfish gates \(it holds: example.com/x\)"):
        gates_plan.plan_cancel(pod(held=("example.com/x",)), ALICE, "r")
    with pytest.raises(Refused, match="no scheduling gates"):
        gates_plan.plan_cancel(pod(held=()), ALICE, "r")


# --- the commands, on the in-memory API ---------------------------------------------------

POD = PODS.path("team-a", "p1")


def api_with(*pods: dict[str, Any]) -> FakeApi:
    api = FakeApi()
    for p in pods:
        meta = p["metadata"]
        api.put(PODS.path(meta["namespace"], meta["name"]), p)
    return api


def version(api: FakeApi) -> str:
    current = api.obj(POD)
    assert current is not None
    return str(current["metadata"]["resourceVersion"])


def changed_by_someone_else(api: FakeApi, **kw: Any) -> Any:
    """Another writer's update of the pod: a new version, optionally with other gates."""
    return lambda: api.put(POD, pod(**kw))


def events(api: FakeApi) -> list[dict[str, Any]]:
    return list(api.store("events.k8s.io/v1", "events").values())


def requests(api: FakeApi) -> list[str]:
    return [
        f"{c.method} {'event' if c.path.startswith(EVENTS.path('team-a')) else 'pod'}"
        for c in api.calls
    ]


def body_of(api: FakeApi, method: str) -> list[Any]:
    return [c.body for c in api.calls if c.method == method and c.path == POD]


def whoami_as(identity: Identity) -> Any:
    async def whoami(_: Any) -> Identity:
        return identity

    return whoami


DENIED = {
    "kind": "Status",
    "status": "Failure",
    "reason": "Invalid",
    "code": 422,
    "message": "pods \"p1\" is invalid: : ValidatingAdmissionPolicy 'pilotfish-gate-removal' "
    "with binding 'pilotfish-gate-removal' denied request: only the Pilotfish operator or "
    "members of pilotfish:gate-releasers may remove gates.pilotfish.io/ gates",
}


async def release(api: FakeApi, who: Identity = ALICE, **kw: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = await gates_cmd.release_gate(
        api,
        "team-a",
        "p1",
        kw.pop("gate", SIGNAL),
        kw.pop("reason", "warehouse late"),
        whoami=kw.pop("whoami", whoami_as(who)),
        clock=FakeClock(NOW),
        out=out,
        err=err,
        **kw,
    )
    return code, out.getvalue(), err.getvalue()


async def cancel(api: FakeApi, who: Identity = ALICE, **kw: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = await gates_cmd.cancel_pod(
        api,
        "team-a",
        "p1",
        "duplicate batch",
        whoami=whoami_as(who),
        clock=FakeClock(NOW),
        out=out,
        err=err,
        **kw,
    )
    return code, out.getvalue(), err.getvalue()


async def test_release_patches_then_records_the_event_about_the_version_read() -> None:
    api = api_with(pod(held=(SIGNAL, GANG), records={SIGNAL: record()}))
    read = version(api)
    code, out, _ = await release(api)
    assert code == 0
    assert requests(api) == ["GET pod", "PATCH pod", "POST event"]
    (patch,) = [c for c in api.calls if c.method == "PATCH"]
    assert patch.content_type == STRATEGIC_MERGE_PATCH and patch.params == {}
    assert patch.body["metadata"]["resourceVersion"] == read
    after = api.obj(POD)
    assert after is not None and gates.scheduling_gates(after) == [GANG]
    who = json.loads(after["metadata"]["annotations"][gates_plan.ANNOTATION_MANUAL_RELEASE])
    assert who == {"gate": SIGNAL, "by": "alice", "reason": "warehouse late", "at": at(0)}
    assert f"keeps {GANG}" in out
    (ev,) = events(api)
    assert ev["reason"] == "GateManuallyReleased" and ev["action"] == "ReleaseGate"
    assert ev["regarding"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "team-a",
        "name": "p1",
        "uid": "uid-p1",
        "resourceVersion": read,
    }
    assert ev["eventTime"] == "2026-03-01T12:00:00.000000Z"
    assert ev["reportingController"] == "pilotfish.io/kubectl-pilotfish"
    assert ev["reportingInstance"].startswith("kubectl-pilotfish/alice@")
    assert "alice" in ev["note"] and "warehouse late" in ev["note"] and SIGNAL in ev["note"]


async def test_release_keeps_the_event_within_the_api_limits() -> None:
    api = api_with(pod())
    code, _, _ = await release(api, who=Identity("u" * 500), reason="x" * 5000)
    assert code == 0
    (ev,) = events(api)
    assert len(ev["note"]) <= 1024 and len(ev["reportingInstance"]) <= 128


async def test_release_conflict_rereads_and_retries_once_with_the_new_version() -> None:
    api = api_with(pod())
    first = version(api)
    api.before("PATCH", POD, changed_by_someone_else(api, labels={"other": "write"}))
    code, _, err = await release(api)
    assert code == 0
    assert requests(api) == ["GET pod", "PATCH pod", "GET pod", "PATCH pod", "POST event"]
    versions = [b["metadata"]["resourceVersion"] for b in body_of(api, "PATCH")]
    assert versions[0] == first and versions[1] != first
    assert f"changed since it was read (resourceVersion {first})" in err
    after = api.obj(POD)
    assert after is not None and gates.scheduling_gates(after) == []


async def test_release_gives_up_after_a_second_conflict_without_an_event() -> None:
    api = api_with(pod())
    api.before("PATCH", POD, changed_by_someone_else(api, labels={"n": "1"}))
    api.before("PATCH", POD, changed_by_someone_else(api, labels={"n": "2"}))
    code, _, err = await release(api)
    assert code == 1
    assert requests(api) == ["GET pod", "PATCH pod", "GET pod", "PATCH pod"]
    assert "changed again" in err and "nothing was changed" in err
    after = api.obj(POD)
    assert after is not None and gates.scheduling_gates(after) == [SIGNAL]
    assert events(api) == []


async def test_release_stops_when_the_gate_went_away_meanwhile() -> None:
    api = api_with(pod())
    api.before("PATCH", POD, changed_by_someone_else(api, held=(GANG,)))
    code, _, err = await release(api)
    assert code == 1
    assert requests(api) == ["GET pod", "PATCH pod", "GET pod"]
    assert f"does not hold gate {SIGNAL}; it holds: {GANG}" in err


async def test_release_prints_the_api_servers_denial_and_who_you_are() -> None:
    api = api_with(pod())
    api.fail_next("PATCH", POD, 422, body=DENIED)
    code, _, err = await release(api, who=MALLORY)
    assert code == 1 and events(api) == []
    assert "refused to release" in err and "(422 Invalid)" in err
    assert "ValidatingAdmissionPolicy 'pilotfish-gate-removal'" in err
    assert "you are mallory (groups: system:authenticated)" in err
    assert "group pilotfish:gate-releasers" in err


async def test_release_refuses_unknown_gates_before_writing() -> None:
    api = api_with(pod(held=(SIGNAL, "example.com/x")))
    code, _, err = await release(api, gate="gates.pilotfish.io/typo")
    assert code == 1 and requests(api) == ["GET pod"]
    assert f"it holds: {SIGNAL}, example.com/x" in err


async def test_release_client_dry_run_writes_nothing_and_prints_the_patch() -> None:
    api = api_with(pod())
    code, out, _ = await release(api, dry_run="client")
    assert code == 0 and requests(api) == ["GET pod"]
    assert "(dry run) release gate" in out and '"$patch": "delete"' in out
    assert "GateManuallyReleased" in out


async def test_release_server_dry_run_asks_the_server_but_changes_and_records_nothing() -> None:
    api = api_with(pod())
    before = api.obj(POD)
    code, out, _ = await release(api, dry_run="server")
    assert code == 0 and requests(api) == ["GET pod", "PATCH pod"]
    assert api.writes()[0].params == {"dryRun": "All"}
    assert "accepts this release" in out
    assert api.obj(POD) == before and events(api) == []


async def test_release_still_succeeds_when_the_event_cannot_be_written() -> None:
    api = api_with(pod())
    api.fail_next("POST", EVENTS.path("team-a"), 403)
    code, _, err = await release(api)
    assert code == 0
    assert "could not record Event GateManuallyReleased" in err
    after = api.obj(POD)
    assert after is not None and gates.scheduling_gates(after) == []


async def test_release_goes_on_when_the_server_will_not_say_who_you_are() -> None:
    async def refuse(_: Any) -> Identity:
        raise ApiError(403, "Forbidden", "selfsubjectreviews is forbidden")

    api = api_with(pod())
    code, _, err = await release(api, whoami=refuse)
    assert code == 0 and "cannot tell who you are" in err
    after = api.obj(POD)
    assert after is not None
    note = json.loads(after["metadata"]["annotations"][gates_plan.ANNOTATION_MANUAL_RELEASE])
    assert note["by"] == gates_plan.UNKNOWN_USER


async def test_cancel_records_the_event_before_deleting_with_preconditions() -> None:
    api = api_with(pod())
    read = version(api)
    code, out, _ = await cancel(api)
    assert code == 0
    assert requests(api) == ["GET pod", "POST event", "DELETE pod"]
    (ev,) = events(api)
    assert ev["reason"] == "GateCancelled" and ev["regarding"]["resourceVersion"] == read
    assert body_of(api, "DELETE")[0]["preconditions"] == {"uid": "uid-p1", "resourceVersion": read}
    assert api.obj(POD) is None and "cancelled" in out


async def test_cancel_conflict_with_a_released_pod_aborts_and_says_so_in_an_event() -> None:
    api = api_with(pod())
    api.before("DELETE", POD, changed_by_someone_else(api, held=()))
    code, _, err = await cancel(api)
    assert code == 1
    assert requests(api) == ["GET pod", "POST event", "DELETE pod", "GET pod", "POST event"]
    assert sorted(e["reason"] for e in events(api)) == ["GateCancelAborted", "GateCancelled"]
    assert "holds no Pilotfish gates" in err
    assert api.obj(POD) is not None, "a pod that is now the scheduler's was deleted"


async def test_cancel_conflict_on_a_still_gated_pod_retries_without_a_second_event() -> None:
    api = api_with(pod())
    api.before("DELETE", POD, changed_by_someone_else(api, labels={"other": "write"}))
    code, _, _ = await cancel(api)
    assert code == 0
    assert requests(api) == ["GET pod", "POST event", "DELETE pod", "GET pod", "DELETE pod"]
    assert [e["reason"] for e in events(api)] == ["GateCancelled"]
    assert api.obj(POD) is None


async def test_cancel_dry_run_writes_nothing() -> None:
    api = api_with(pod())
    code, out, _ = await cancel(api, dry_run="client")
    assert code == 0 and requests(api) == ["GET pod"]
    assert "(dry run) cancel pod team-a/p1" in out


async def test_cancel_denial_names_the_user_without_the_gate_releasers_hint() -> None:
    api = api_with(pod())
    forbidden = {"reason": "Forbidden", "message": 'pods "p1" is forbidden: User "bob" cannot'}
    api.fail_next("DELETE", POD, 403, body=forbidden)
    code, _, err = await cancel(api, who=MALLORY)
    assert code == 1
    assert 'User "bob" cannot' in err and "you are mallory" in err
    assert "removing Pilotfish gates by hand" not in err
    assert [e["reason"] for e in events(api)][-1] == "GateCancelAborted"
    assert api.obj(POD) is not None


async def test_list_selects_gated_pods_by_label_and_prints_a_table() -> None:
    plain = pod("plain", held=())
    plain["metadata"]["labels"] = {}
    api = api_with(pod(records={SIGNAL: record()}), pod("elsewhere", namespace="team-b"), plain)
    out, err = io.StringIO(), io.StringIO()
    code = await gates_cmd.list_gates(api, "team-a", "table", FakeClock(NOW), out, err)
    assert code == 0
    (call,) = api.calls
    assert call.path == "/api/v1/namespaces/team-a/pods"
    assert call.params["labelSelector"] == "gates.pilotfish.io/gated=true"
    lines = out.getvalue().splitlines()
    assert [line.split()[:3] for line in lines[1:]] == [["team-a", "p1", SIGNAL]]


async def test_list_all_namespaces_and_empty_result() -> None:
    api = FakeApi()
    out, err = io.StringIO(), io.StringIO()
    code = await gates_cmd.list_gates(api, None, "table", FakeClock(NOW), out, err)
    assert code == 0 and api.calls[0].path == "/api/v1/pods"
    assert (
        out.getvalue() == "" and "No pods hold Pilotfish gates in any namespace" in err.getvalue()
    )


# --- command line --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["gates", "-n", "x"], {"namespace": "x", "gates_cmd": None, "all_namespaces": False}),
        (["-n", "x", "gates", "-A"], {"namespace": "x", "all_namespaces": True}),
        (["--kubeconfig", "k", "gates", "-o", "json"], {"kubeconfig": "k", "output": "json"}),
        (
            ["gates", "release", "p", "g", "--reason", "r", "-n", "y"],
            {"gates_cmd": "release", "pod": "p", "gate": "g", "namespace": "y", "dry_run": "none"},
        ),
        (
            ["-n", "z", "gates", "release", "p", "g", "--reason", "r", "--dry-run"],
            {"namespace": "z", "dry_run": "client"},
        ),
        (
            ["gates", "cancel", "p", "--reason", "r", "--dry-run=server"],
            {"gates_cmd": "cancel", "dry_run": "server", "namespace": None},
        ),
        (["why", "p", "--kubeconfig", "k"], {"pod": "p", "kubeconfig": "k"}),
    ],
)
def test_parser_takes_kubectl_flags_before_or_after_the_subcommand(
    argv: list[str], expected: dict[str, Any]
) -> None:
    args = vars(kubectl_plugin.parser().parse_args(argv))
    assert {k: args.get(k) for k in expected} == expected


def test_release_requires_a_reason() -> None:
    with pytest.raises(SystemExit):
        kubectl_plugin.parser().parse_args(["gates", "release", "p", "g"])


def test_record_round_trips_through_the_annotation() -> None:
    # The listing trusts gates.read_record; a record written by PodGates reads back equal.
    rec = record()
    p = pod(records={SIGNAL: rec})
    got = gates.read_record(p)
    assert got is not None and asdict(got.gates[SIGNAL]) == asdict(rec)
