"""Bands and quota composed into the pod reviews (mutate, validate, quota verdict)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from datetime import UTC, datetime
from typing import Any

import jsonpatch

from pilotfish.gates import read_record, scheduling_gates
from pilotfish.kube.factory import InformerFactory
from pilotfish.kube.rest import NAMESPACES, TEAMQUOTAS
from pilotfish.webhooks import pods
from pilotfish.webhooks.admission import Decision
from pilotfish.webhooks.gateview import GateView
from pilotfish.webhooks.quota import QUOTA_GATE
from pilotfish.webhooks.teamview import TeamCache, TeamSnapshot
from tests.fakeapi import FakeApi

NOW = datetime(2026, 1, 1, tzinfo=UTC)
TEAM = {"pilotfish.io/team": "payments"}


def request(band: str | None, cpu: str = "8", **spec: Any) -> dict[str, Any]:
    labels = {"app": "x"} if band is None else {"pilotfish.io/band": band}
    pod = {
        "metadata": {"name": "p", "namespace": "shop", "uid": "u1", "labels": labels},
        "spec": {
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
            "priority": 0,
            **spec,
        },
    }
    return {
        "uid": "r",
        "operation": "CREATE",
        "namespace": "shop",
        "kind": {"kind": "Pod"},
        "object": pod,
    }


def team(used: str = "96") -> TeamSnapshot:
    tq = {
        "metadata": {"name": "payments", "generation": 2, "resourceVersion": "7"},
        "spec": {"team": "payments", "bands": {b: {"cpu": "100"} for b in ("production", "batch")}},
        "status": {"used": {b: {"cpu": used} for b in ("production", "batch")}},
    }
    return TeamSnapshot({"shop": {"pilotfish.io/team": "payments"}}, (tq,))


def mutated(req: dict[str, Any], snapshot: TeamSnapshot) -> dict[str, Any]:
    decision = pods.mutate(req, GateView(), NOW, snapshot, "pilotfish-scheduler")
    assert decision.allowed
    out: dict[str, Any] = jsonpatch.apply_patch(
        copy.deepcopy(req["object"]), list(decision.patch or [])
    )
    return out


def test_batch_over_quota_is_admitted_behind_the_quota_gate_with_its_terms() -> None:
    pod = mutated(request("batch"), team("96"))
    assert scheduling_gates(pod) == [QUOTA_GATE]
    record = read_record(pod)
    assert record is not None
    assert record.gates[QUOTA_GATE].condition == {"type": "Quota"}
    assert record.gates[QUOTA_GATE].on_expiry == "Review"
    assert pod["spec"]["priorityClassName"] == "pilotfish-batch"
    assert "priority" not in pod["spec"], "the Priority plugin recomputes it from the class"
    assert pod["spec"]["schedulerName"] == "pilotfish-scheduler"
    # ... and the validating review accepts the gate it put there.
    assert pods.validate({**request("batch"), "object": pod}, GateView(), team("96")).allowed


def test_batch_within_quota_gets_its_band_but_no_gate() -> None:
    pod = mutated(request("batch", cpu="1"), team("96"))
    assert scheduling_gates(pod) == []
    assert pod["metadata"]["labels"]["pilotfish.io/band"] == "batch"


def test_production_over_quota_is_refused_naming_the_amounts() -> None:
    pod = mutated(request("production"), team("96"))
    verdict = pods.quota_verdict({**request("production"), "object": pod}, team("96"), NOW)
    assert isinstance(verdict, Decision) and not verdict.allowed
    assert verdict.message == "team payments, production cpu: 96 of 100 used, pod asks 8"


def test_production_within_quota_is_admitted_once_reserved() -> None:
    req = request("production", cpu="2")
    verdict = pods.quota_verdict({**req, "object": mutated(req, team())}, team(), NOW)
    assert isinstance(verdict, pods.Reserve)
    assert verdict.admit.quota_name == "payments" and verdict.band == "production"
    dry = pods.quota_verdict({**req, "dryRun": True}, team(), NOW)
    assert isinstance(dry, Decision) and dry.allowed, "a dry run reserves nothing"


def test_contradicting_priority_class_is_refused() -> None:
    req = request("batch", priorityClassName="pilotfish-production")
    decision = pods.validate(req, GateView(), team())
    assert not decision.allowed
    assert "contradicts the pod's band 'batch'" in (decision.message or "")


def test_a_pod_naming_no_band_is_batch_and_charged_to_its_team() -> None:
    pod = mutated(request(None), team("96"))
    assert pod["metadata"]["labels"]["pilotfish.io/band"] == "batch"
    assert pod["metadata"]["labels"]["pilotfish.io/team"] == "payments"
    assert pod["spec"]["priorityClassName"] == "pilotfish-batch"
    assert scheduling_gates(pod) == [QUOTA_GATE], "over its batch quota: it waits"
    within = mutated(request(None, cpu="1"), team("96"))
    verdict = pods.quota_verdict({**request(None), "object": within}, team("96"), NOW)
    assert isinstance(verdict, pods.Reserve) and verdict.band == "batch"


def test_a_pod_naming_no_band_in_a_team_without_batch_quota_is_refused() -> None:
    snapshot = team()
    tq = copy.deepcopy(dict(snapshot.quotas[0]))
    del tq["spec"]["bands"]["batch"]
    only_production = TeamSnapshot(snapshot.namespace_labels, (tq,))
    req = {**request(None), "object": mutated(request(None), only_production)}
    verdict = pods.quota_verdict(req, only_production, NOW)
    assert isinstance(verdict, Decision) and not verdict.allowed
    assert "team payments has no batch quota" in verdict.message


def test_a_production_class_without_a_band_label_is_charged_to_production() -> None:
    req = request(None, priorityClassName="pilotfish-production")
    pod = mutated(req, team("96"))
    assert pod["metadata"]["labels"]["pilotfish.io/band"] == "production"
    verdict = pods.quota_verdict({**req, "object": pod}, team("96"), NOW)
    assert isinstance(verdict, Decision) and not verdict.allowed
    assert verdict.message == "team payments, production cpu: 96 of 100 used, pod asks 8"


def test_a_band_granted_without_limits_admits_without_a_reservation() -> None:
    tq = {
        "metadata": {"name": "payments", "resourceVersion": "1"},
        "spec": {"team": "payments", "bands": {"production": {}}},
    }
    snapshot = TeamSnapshot({"shop": {"pilotfish.io/team": "payments"}}, (tq,))
    req = request("production", cpu="1000")
    verdict = pods.quota_verdict({**req, "object": mutated(req, snapshot)}, snapshot, NOW)
    assert verdict == Decision.allow()


def test_without_a_team_view_bands_and_quota_are_not_judged() -> None:
    req = request(None)
    assert pods.mutate(req, GateView(), NOW).patch == ()
    assert pods.validate(req, GateView()).allowed
    assert pods.quota_verdict(req, None, NOW) == Decision.allow()


async def test_the_validating_review_reserves_through_the_one_ledger_write() -> None:
    """The real team view on the fake API server: the verdict's reservation is written to
    the TeamQuota status conditionally, and the next pod is judged with it counted."""
    api = FakeApi()
    api.put(NAMESPACES.path(name="shop"), {"metadata": {"name": "shop", "labels": TEAM}})
    body = dict(team("90").quotas[0])
    body["metadata"] = {"name": "payments"}
    api.put(TEAMQUOTAS.path(name="payments"), body)
    factory = InformerFactory(api)
    teams = TeamCache(factory)
    task = asyncio.ensure_future(factory.run())
    try:
        await asyncio.wait_for(factory.wait_synced(), 5)
        first = request("production", cpu="6")
        verdict = pods.quota_verdict(first, teams.snapshot(), NOW)
        assert isinstance(verdict, pods.Reserve)
        refused = await teams.reserve(
            verdict.pod, verdict.namespace_labels, verdict.band, verdict.admit, NOW
        )
        assert refused is None
        stored = api.obj(TEAMQUOTAS.path(name="payments"))
        assert stored is not None
        assert [r["uid"] for r in stored["status"]["reservations"]] == ["u1"]
        # A second pod decided from a snapshot taken before the reservation landed.
        second = request("production", cpu="6")
        second["object"]["metadata"]["uid"] = "u2"
        late = pods.quota_verdict(second, team("90"), NOW)
        assert isinstance(late, pods.Reserve)
        refused = await teams.reserve(late.pod, late.namespace_labels, late.band, late.admit, NOW)
        assert refused == "team payments, production cpu: 96 of 100 used, pod asks 6"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
