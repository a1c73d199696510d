"""The gate controller spends quota only through the one quota ledger: it reads what a
TeamQuota holds (used plus reservations) and reserves a pod's room, conditionally on the
TeamQuota's version, before it removes the pod's last gate (`pilotfish.reservations`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pilotfish.kube.rest import PODS, TEAMQUOTAS
from tests.gates_harness import Harness, running
from tests.test_gates_builders import pod, rec, reservation

QUOTA_GATE = "gates.pilotfish.io/quota"


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    async with running(tmp_path) as harness:
        yield harness


async def test_release_reserves_its_quota_before_the_gate_goes(h: Harness) -> None:
    """The room comes from the team's quota ledger (the TeamQuota's used and reserved), and
    the release spends it by reserving in that ledger first, with a write conditional on
    the TeamQuota's version: admission reading the same ledger cannot hand it out again."""
    h.add(pod("p", {"quota": rec("Quota")}, team="t"))
    h.add(pod("q", {"quota": rec("Quota")}, team="t", age=-1))
    h.quota("2")
    tq = h.api.obj(TEAMQUOTAS.path(None, "t"))
    assert tq is not None
    tq["status"] = {"used": {"batch": {"cpu": "1", "pods": 1}}}
    h.api.put(TEAMQUOTAS.path(None, "t") + "/status", tq)  # the quota controller counted 1
    await h.round()
    writes = [(c.method, c.path) for c in h.api.writes() if c.method != "POST"]
    reserve = ("PUT", TEAMQUOTAS.path(None, "t", sub="status"))
    assert writes[:2] == [reserve, ("PATCH", PODS.path("team-a", "p"))], "reserve, then release"
    [held] = (h.api.obj(TEAMQUOTAS.path(None, "t")) or {})["status"]["reservations"]
    assert (held["uid"], held["pod"], held["band"]) == ("uid-p", "team-a/p", "batch")
    assert h.gate_patches("q") == [], "q would take the second cpu again"
    for _ in range(2):  # later rounds see the reservation: q still waits, p is not re-reserved
        await h.round()
    assert h.gate_patches("q") == [] and len(h.gate_patches("p")) == 1
    assert len((h.api.obj(TEAMQUOTAS.path(None, "t")) or {})["status"]["reservations"]) == 1


async def test_quota_taken_before_the_reservation_lands_releases_nothing(h: Harness) -> None:
    """Admission (another process) reserved the last room after the round read the ledger:
    the release's conditional reservation sees it, removes no gate, and the round retries."""
    h.add(pod("p", {"quota": rec("Quota")}, team="t"))
    h.quota("1")
    await h.api.settle()
    tq = h.api.obj(TEAMQUOTAS.path(None, "t"))
    assert tq is not None
    tq["status"] = {"reservations": [reservation("uid-admitted", cpu="1", pods=1)]}
    h.lag()
    h.api.put(TEAMQUOTAS.path(None, "t") + "/status", tq)  # not yet seen by our informer
    result = await h.round(settle=False)
    assert result.retry
    assert h.gate_patches("p") == []
    assert h.pod("p")["spec"]["schedulingGates"] == [{"name": QUOTA_GATE}]
