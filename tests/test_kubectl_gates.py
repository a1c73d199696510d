"""`kubectl pilotfish gates`: listing, and the planning and retry logic of release and cancel.

No cluster: the pure functions get pods as the API returns them, and the orchestration runs
against a scripted fake of the REST client that records every request it was sent.
"""

from __future__ import annotations

import copy
import datetime
import io
import json
from dataclasses import asdict
from typing import Any

import pytest

from pilotfish import gates, timeutil
from pilotfish.cli import gates_cmd, kubectl_plugin
from pilotfish.cli.connect import Identity
from pilotfish.cli.gates_cmd import Refused
from pilotfish.cli.output import human_duration, table
from pilotfish.kube.rest import STRATEGIC_MERGE_PATCH, ApiError

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
    assert gates_cmd.condition_text(condition) == text


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
    rows = gates_cmd.gate_rows(pods)
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
    out = gates_cmd.render_table(gates_cmd.gate_rows([live, late, bare]), NOW)
    header, *lines = out.splitlines()
    assert header.split() == list(gates_cmd.HEADER)
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
    rows = gates_cmd.gate_rows([pod(records={SIGNAL: record(timeout=600, created=-60)})])
    out = gates_cmd.render_table(rows, NOW, wide=True)
    header, line = out.splitlines()
    assert header.split()[-2:] == ["DEADLINE-AT", "POLICY"]
    assert line.split()[-2:] == [at(540), "nightly@3"]


def test_json_has_absolute_times_and_expiry_as_data() -> None:
    pods = [
        pod("live", records={SIGNAL: record(timeout=600, created=-60)}),
        pod("late", records={SIGNAL: record(timeout=60, created=-300)}, created=-300),
    ]
    items = gates_cmd.rows_json(gates_cmd.gate_rows(pods), NOW)["items"]
    late, live = items
    assert live["deadline"] == at(540) and live["remainingSeconds"] == 540
    assert live["expired"] is False and live["ageSeconds"] == 60
    assert live["condition"] == {"type": "GateSignal", "signalName": "data-ready"}
    assert late["expired"] is True and late["remainingSeconds"] == -240
    json.dumps(items)  # serialisable as is


# --- planning ------------------------------------------------------------------------------


def test_resolve_gate_accepts_the_bare_condition_for_pilotfish_gates() -> None:
    assert gates_cmd.resolve_gate("data-ready", [SIGNAL]) == SIGNAL
    assert gates_cmd.resolve_gate(SIGNAL, [GANG, SIGNAL]) == SIGNAL


def test_resolve_gate_refuses_a_gate_not_held_naming_the_held_ones() -> None:
    with pytest.raises(Refused) as e:
        gates_cmd.resolve_gate("gates.pilotfish.io/nope", [SIGNAL, "example.com/x"])
    assert "does not hold gate gates.pilotfish.io/nope" in str(e.value)
    assert f"it holds: {SIGNAL}, example.com/x" in str(e.value)
    with pytest.raises(Refused, match="holds: no scheduling gates"):
        gates_cmd.resolve_gate(SIGNAL, [])


def test_resolve_gate_refuses_other_owners_gates_even_when_held() -> None:
    with pytest.raises(Refused, match="not a Pilotfish gate"):
        gates_cmd.resolve_gate("example.com/x", ["example.com/x"])


def test_release_plan_deletes_one_gate_conditionally_and_records_who_and_why() -> None:
    p = pod(held=(GANG, "example.com/other", SIGNAL), records={SIGNAL: record()}, rv="4711")
    plan = gates_cmd.plan_release(p, "data-ready", ALICE, "  warehouse\n is late ", NOW, "inst")
    assert plan.gate == SIGNAL and plan.resource_version == "4711"
    assert plan.remaining == (GANG, "example.com/other")
    assert plan.patch["spec"] == {"schedulingGates": [{"name": SIGNAL, "$patch": "delete"}]}
    assert plan.patch["metadata"]["resourceVersion"] == "4711"
    note = json.loads(plan.patch["metadata"]["annotations"][gates_cmd.ANNOTATION_MANUAL_RELEASE])
    assert note == {"gate": SIGNAL, "by": "alice", "reason": "warehouse is late", "at": at(0)}
    ev = plan.event
    assert ev["apiVersion"] == "events.k8s.io/v1" and ev["reason"] == "GateManuallyReleased"
    assert ev["regarding"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "team-a",
        "name": "p1",
        "uid": "uid-p1",
        "resourceVersion": "4711",
    }
    assert ev["metadata"] == {"name": f"p1.{int(NOW.timestamp() * 1e9):x}", "namespace": "team-a"}
    assert "alice" in ev["note"] and "warehouse is late" in ev["note"] and SIGNAL in ev["note"]
    assert ev["eventTime"] == "2026-03-01T12:00:00.000000Z"
    assert ev["reportingController"] == "pilotfish.io/kubectl-pilotfish"


def test_release_plan_keeps_notes_within_the_event_limit() -> None:
    plan = gates_cmd.plan_release(pod(), SIGNAL, ALICE, "x" * 5000, NOW, "i" * 500)
    assert len(plan.event["note"]) <= gates_cmd.NOTE_MAX
    assert len(plan.event["reportingInstance"]) <= gates_cmd.INSTANCE_MAX


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
        gates_cmd.plan_release(p, gate, ALICE, reason, NOW, "i")


def test_cancel_plan_deletes_with_uid_and_version_preconditions() -> None:
    plan = gates_cmd.plan_cancel(
        pod(held=(SIGNAL, "example.com/x"), rv="9"), ALICE, "dup", NOW, "i"
    )
    assert plan.delete_options["preconditions"] == {"uid": "uid-p1", "resourceVersion": "9"}
    assert plan.held == (SIGNAL,)
    assert plan.event["reason"] == "GateCancelled" and "dup" in plan.event["note"]


def test_cancel_plan_refuses_pods_not_gated_by_pilotfish() -> None:
    with pytest.raises(Refused, match=r"holds no Pilotfish gates \(it holds: example.com/x\)"):
        gates_cmd.plan_cancel(pod(held=("example.com/x",)), ALICE, "r", NOW, "i")
    with pytest.raises(Refused, match="no scheduling gates"):
        gates_cmd.plan_cancel(pod(held=()), ALICE, "r", NOW, "i")


# --- orchestration against a scripted fake client -----------------------------------------


class FakeRest:
    """Answers requests from a script: GETs return the next pod version, writes may fail."""

    def __init__(
        self,
        reads: list[dict[str, Any] | ApiError],
        writes: list[ApiError | None] | None = None,
        event_error: ApiError | None = None,
    ) -> None:
        self.reads = list(reads)
        self.writes = list(writes or [])
        self.event_error = event_error
        self.calls: list[tuple[str, str, dict[str, Any], Any, str]] = []

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        request_timeout: float | None = 30.0,
    ) -> dict[str, Any]:
        self.calls.append((method, path, dict(params or {}), copy.deepcopy(body), content_type))
        if method == "GET":
            nxt = self.reads.pop(0)
            if isinstance(nxt, ApiError):
                raise nxt
            return copy.deepcopy(nxt)
        if "/events" in path:
            if self.event_error:
                raise self.event_error
            return {}
        failure = self.writes.pop(0) if self.writes else None
        if failure is not None:
            raise failure
        return {}

    async def list_pages(
        self, path: str, params: dict[str, Any] | None = None, page: int = 500
    ) -> tuple[list[dict[str, Any]], str]:
        self.calls.append(("LIST", path, dict(params or {}), None, ""))
        return [r for r in self.reads if isinstance(r, dict)], "1"

    def methods(self) -> list[str]:
        return [f"{m} {'event' if '/events' in p else 'pod'}" for m, p, *_ in self.calls]


def whoami_as(identity: Identity) -> Any:
    async def whoami(_: Any) -> Identity:
        return identity

    return whoami


CONFLICT = ApiError(409, "Conflict", "the object has been modified")
DENIED = ApiError(
    422,
    "Invalid",
    "pods \"p1\" is invalid: : ValidatingAdmissionPolicy 'pilotfish-gate-removal' with "
    "binding 'pilotfish-gate-removal' denied request: only the Pilotfish operator or members "
    "of pilotfish:gate-releasers may remove gates.pilotfish.io/ gates",
)


async def release(rest: FakeRest, who: Identity = ALICE, **kw: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = await gates_cmd.release_gate(
        rest,
        "team-a",
        "p1",
        kw.pop("gate", SIGNAL),
        "warehouse late",
        whoami=whoami_as(who),
        now=lambda: NOW,
        out=out,
        err=err,
        **kw,
    )
    return code, out.getvalue(), err.getvalue()


async def cancel(rest: FakeRest, who: Identity = ALICE, **kw: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = await gates_cmd.cancel_pod(
        rest,
        "team-a",
        "p1",
        "duplicate batch",
        whoami=whoami_as(who),
        now=lambda: NOW,
        out=out,
        err=err,
        **kw,
    )
    return code, out.getvalue(), err.getvalue()


async def test_release_patches_then_records_the_event() -> None:
    rest = FakeRest([pod(held=(SIGNAL, GANG), rv="7")])
    code, out, _ = await release(rest)
    assert code == 0
    assert rest.methods() == ["GET pod", "PATCH pod", "POST event"]
    _, path, params, body, ctype = rest.calls[1]
    assert path == "/api/v1/namespaces/team-a/pods/p1" and ctype == STRATEGIC_MERGE_PATCH
    assert params == {} and body["metadata"]["resourceVersion"] == "7"
    assert f"keeps {GANG}" in out


async def test_release_conflict_rereads_and_retries_once_with_the_new_version() -> None:
    rest = FakeRest([pod(rv="7"), pod(rv="8")], writes=[CONFLICT, None])
    code, _, err = await release(rest)
    assert code == 0
    assert rest.methods() == ["GET pod", "PATCH pod", "GET pod", "PATCH pod", "POST event"]
    assert [c[3]["metadata"]["resourceVersion"] for c in rest.calls if c[0] == "PATCH"] == [
        "7",
        "8",
    ]
    assert "changed since it was read (resourceVersion 7)" in err


async def test_release_gives_up_after_a_second_conflict_without_an_event() -> None:
    rest = FakeRest([pod(rv="7"), pod(rv="8")], writes=[CONFLICT, CONFLICT])
    code, _, err = await release(rest)
    assert code == 1
    assert "POST event" not in rest.methods()
    assert "changed again" in err and "nothing was changed" in err


async def test_release_stops_when_the_gate_went_away_meanwhile() -> None:
    rest = FakeRest([pod(rv="7"), pod(held=(GANG,), rv="8")], writes=[CONFLICT])
    code, _, err = await release(rest)
    assert code == 1
    assert rest.methods() == ["GET pod", "PATCH pod", "GET pod"]
    assert f"does not hold gate {SIGNAL}; it holds: {GANG}" in err


async def test_release_prints_the_api_servers_denial_and_who_you_are() -> None:
    rest = FakeRest([pod()], writes=[DENIED])
    code, _, err = await release(rest, who=MALLORY)
    assert code == 1
    assert "POST event" not in rest.methods()
    assert "refused to release" in err and "(422 Invalid)" in err
    assert "ValidatingAdmissionPolicy 'pilotfish-gate-removal'" in err
    assert "you are mallory (groups: system:authenticated)" in err
    assert "group pilotfish:gate-releasers" in err


async def test_release_refuses_unknown_gates_before_writing() -> None:
    rest = FakeRest([pod(held=(SIGNAL, "example.com/x"))])
    code, _, err = await release(rest, gate="gates.pilotfish.io/typo")
    assert code == 1 and rest.methods() == ["GET pod"]
    assert f"it holds: {SIGNAL}, example.com/x" in err


async def test_release_client_dry_run_writes_nothing_and_prints_the_patch() -> None:
    rest = FakeRest([pod(rv="7")])
    code, out, _ = await release(rest, dry_run="client")
    assert code == 0 and rest.methods() == ["GET pod"]
    assert "(dry run) release gate" in out and '"$patch": "delete"' in out
    assert "GateManuallyReleased" in out


async def test_release_server_dry_run_asks_the_server_but_records_nothing() -> None:
    rest = FakeRest([pod(rv="7")])
    code, out, _ = await release(rest, dry_run="server")
    assert code == 0 and rest.methods() == ["GET pod", "PATCH pod"]
    assert rest.calls[1][2] == {"dryRun": "All"}
    assert "accepts this release" in out


async def test_release_still_succeeds_when_the_event_cannot_be_written() -> None:
    rest = FakeRest([pod()], event_error=ApiError(403, "Forbidden", "cannot create events"))
    code, _, err = await release(rest)
    assert code == 0
    assert "could not record Event GateManuallyReleased" in err


async def test_cancel_records_the_event_before_deleting_with_preconditions() -> None:
    rest = FakeRest([pod(rv="5")])
    code, out, _ = await cancel(rest)
    assert code == 0
    assert rest.methods() == ["GET pod", "POST event", "DELETE pod"]
    assert rest.calls[1][3]["reason"] == "GateCancelled"
    assert rest.calls[2][3]["preconditions"] == {"uid": "uid-p1", "resourceVersion": "5"}
    assert "cancelled" in out


async def test_cancel_conflict_with_a_released_pod_aborts_and_says_so_in_an_event() -> None:
    rest = FakeRest([pod(rv="5"), pod(held=(), rv="6")], writes=[CONFLICT])
    code, _, err = await cancel(rest)
    assert code == 1
    assert rest.methods() == ["GET pod", "POST event", "DELETE pod", "GET pod", "POST event"]
    assert rest.calls[-1][3]["reason"] == "GateCancelAborted"
    assert "holds no Pilotfish gates" in err


async def test_cancel_conflict_on_a_still_gated_pod_retries_without_a_second_event() -> None:
    rest = FakeRest([pod(rv="5"), pod(rv="6")], writes=[CONFLICT, None])
    code, _, _ = await cancel(rest)
    assert code == 0
    assert rest.methods() == ["GET pod", "POST event", "DELETE pod", "GET pod", "DELETE pod"]
    assert rest.calls[-1][3]["preconditions"]["resourceVersion"] == "6"


async def test_cancel_dry_run_writes_nothing() -> None:
    rest = FakeRest([pod()])
    code, out, _ = await cancel(rest, dry_run="client")
    assert code == 0 and rest.methods() == ["GET pod"]
    assert "(dry run) cancel pod team-a/p1" in out


async def test_list_selects_gated_pods_by_label_and_prints_a_table() -> None:
    rest = FakeRest([pod(records={SIGNAL: record()})])
    out, err = io.StringIO(), io.StringIO()
    code = await gates_cmd.list_gates(rest, "team-a", "table", lambda: NOW, out, err)
    assert code == 0
    assert rest.calls[0][1] == "/api/v1/namespaces/team-a/pods"
    assert rest.calls[0][2] == {"labelSelector": "gates.pilotfish.io/gated=true"}
    assert out.getvalue().splitlines()[1].split()[:3] == ["team-a", "p1", SIGNAL]


async def test_list_all_namespaces_and_empty_result() -> None:
    rest = FakeRest([])
    out, err = io.StringIO(), io.StringIO()
    code = await gates_cmd.list_gates(rest, None, "table", lambda: NOW, out, err)
    assert code == 0 and rest.calls[0][1] == "/api/v1/pods"
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


async def test_release_goes_on_when_the_server_will_not_say_who_you_are() -> None:
    async def refuse(_: Any) -> Identity:
        raise ApiError(403, "Forbidden", "selfsubjectreviews is forbidden")

    rest = FakeRest([pod()])
    out, err = io.StringIO(), io.StringIO()
    code = await gates_cmd.release_gate(
        rest, "team-a", "p1", SIGNAL, "r", whoami=refuse, now=lambda: NOW, out=out, err=err
    )
    assert code == 0 and "cannot tell who you are" in err.getvalue()
    note = json.loads(
        rest.calls[1][3]["metadata"]["annotations"][gates_cmd.ANNOTATION_MANUAL_RELEASE]
    )
    assert note["by"] == gates_cmd.UNKNOWN_USER


async def test_cancel_denial_names_the_user_without_the_gate_releasers_hint() -> None:
    forbidden = ApiError(403, "Forbidden", 'pods "p1" is forbidden: User "bob" cannot delete')
    rest = FakeRest([pod()], writes=[forbidden])
    code, _, err = await cancel(rest, who=MALLORY)
    assert code == 1
    assert 'User "bob" cannot delete' in err and "you are mallory" in err
    assert "removing Pilotfish gates by hand" not in err
    assert rest.calls[-1][3]["reason"] == "GateCancelAborted"
