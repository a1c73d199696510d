"""The one write that spends quota (`pilotfish.reservations`), against the fake API server:
conditional, serial per TeamQuota, deciding again on every conflict."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import AsyncIterator, Sequence
from fractions import Fraction
from typing import Any

import pytest

from pilotfish.kube.informer import Informer
from pilotfish.kube.rest import TEAMQUOTAS
from pilotfish.ledger import Ledger, Reservation
from pilotfish.reservations import Refused, Release, Reserved, Reserver
from pilotfish.webhooks.quota import Admit
from pilotfish.webhooks.quota import decide as admission_decide
from tests.fakeapi import FakeApi

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
NS_LABELS = {"pilotfish.io/team": "t"}
PATH = TEAMQUOTAS.path(name="t")


def teamquota(limit: str = "10", used: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if used is not None:
        status["used"] = {"production": {"cpu": used}}
    return {
        "apiVersion": "pilotfish.io/v1alpha1",
        "kind": "TeamQuota",
        "metadata": {"name": "t"},
        "spec": {"team": "t", "bands": {"production": {"cpu": limit}}},
        "status": status,
    }


def pod(i: int, cpu: str = "1") -> dict[str, Any]:
    return {
        "metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
    }


def admission(p: dict[str, Any]) -> Any:
    def spend(book: Ledger) -> Sequence[Reservation] | str:
        out = admission_decide(p, NS_LABELS, "production", [book.source], NOW)
        if not isinstance(out, Admit):
            return out.message
        return [] if out.reservation is None else [out.reservation]

    return spend


class Setup:
    def __init__(self, api: FakeApi, informer: Informer, reserver: Reserver) -> None:
        self.api, self.informer, self.reserver = api, informer, reserver
        self.conflicts = 0

    def status(self) -> dict[str, Any]:
        obj = self.api.obj(PATH)
        assert obj is not None
        return dict(obj.get("status") or {})


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    api = FakeApi()
    api.put(PATH, teamquota())
    informer = Informer(api, TEAMQUOTAS)
    holder: list[Setup] = []
    reserver = Reserver(
        api, informer, "test-quota", on_conflict=lambda: setattr(holder[0], "conflicts", 1)
    )
    s = Setup(api, informer, reserver)
    holder.append(s)
    task = asyncio.ensure_future(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 5)
        yield s
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_concurrent_admissions_take_exactly_the_room_without_conflicts(
    setup: Setup,
) -> None:
    results = await asyncio.gather(
        *(setup.reserver.reserve("t", admission(pod(i))) for i in range(30))
    )
    admitted = [r for r in results if isinstance(r, Reserved)]
    refused = [r for r in results if isinstance(r, Refused)]
    assert len(admitted) == 10 and len(refused) == 20
    assert {r.message for r in refused} == {"team t, production cpu: 10 of 10 used, pod asks 1"}
    status = setup.status()
    assert len(status["reservations"]) == 10
    assert status["reserved"] == {"production": {"cpu": "10", "pods": 10}}
    # Each batch started from the copy the previous write returned: none lost a race. The
    # first spend went alone; the 29 that queued behind its write went in one group commit.
    assert setup.conflicts == 0
    assert len(setup.api.writes("teamquotas")) == 2


async def test_a_write_by_another_process_in_between_is_a_conflict_then_decided_again(
    setup: Setup,
) -> None:
    def other_admission() -> None:  # another webhook replica takes 9 cores meanwhile
        tq = setup.api.obj(PATH)
        assert tq is not None
        tq["status"] = {
            "reservations": [
                {
                    "pod": "ns/other",
                    "uid": "other",
                    "band": "production",
                    "resources": {"cpu": "9"},
                    "time": "2026-01-01T00:00:00Z",
                }
            ]
        }
        setup.api.put(PATH, tq)

    setup.api.before("PUT", "teamquotas", other_admission)
    out = await setup.reserver.reserve("t", admission(pod(1, "2")))
    assert out == Refused("team t, production cpu: 9 of 10 used, pod asks 2")
    assert setup.conflicts == 1
    assert [r["uid"] for r in setup.status()["reservations"]] == ["other"]


async def test_a_refusal_from_the_cache_is_confirmed_on_the_api_server_s_copy(
    setup: Setup,
) -> None:
    # The informer still shows the band full; the quota controller has since freed it.
    stale = teamquota(used="10")
    stale["metadata"]["resourceVersion"] = "stale"
    setup.informer.store["t"] = stale
    out = await setup.reserver.reserve("t", admission(pod(1)))
    assert isinstance(out, Reserved) and out.quota is not None
    assert [r["uid"] for r in setup.status()["reservations"]] == ["u1"]


async def test_a_release_reserves_a_gang_together_and_only_what_is_not_held(
    setup: Setup,
) -> None:
    ask = {"cpu": Fraction(4), "pods": Fraction(1)}
    gang = [Release(u, f"ns/{u}", "production", ask) for u in ("a", "b", "c")]
    out = await setup.reserver.release("t", gang, NOW)
    assert isinstance(out, Refused) and "pod asks 12" in out.message
    assert not setup.status().get("reservations"), "none of the gang holds room"
    assert isinstance(await setup.reserver.release("t", gang[:2], NOW), Reserved)
    writes = len(setup.api.writes("teamquotas"))
    again = await setup.reserver.release("t", gang[:2], NOW)
    assert again == Reserved(None), "a retried release holds its room already"
    assert len(setup.api.writes("teamquotas")) == writes
    assert await setup.reserver.release("nobody", gang, NOW) == Reserved(None)


async def test_a_teamquota_deleted_since_the_cache_saw_it_refuses_by_name(setup: Setup) -> None:
    setup.api.remove(PATH)
    await setup.api.settle()
    setup.informer.store["t"] = teamquota()  # a cache that has not seen the delete
    out = await setup.reserver.reserve("t", admission(pod(1)))
    assert out == Refused("TeamQuota t was deleted; no quota grants this pod")
