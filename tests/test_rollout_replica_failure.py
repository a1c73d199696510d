"""ReplicaFailure: a refused pod create is status, not only an Event.

Driven through the real controller on the shared in-memory API (the harness of
test_rollout_controller), with an admission step in front of pod creates that refuses the
way the team quota webhook (or a namespace ResourceQuota) does, so the text in the
condition is the text the API server would send.
"""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator, Mapping
from fractions import Fraction
from typing import Any

import pytest

from pilotfish.api.serviceworkload import PROGRESSING, STALLED
from pilotfish.kube.rest import SERVICEWORKLOADS, ApiError
from pilotfish.operators.serviceworkload.progress import (
    REASON_COMPLETE,
    REASON_DEADLINE_EXCEEDED,
    REASON_IN_PROGRESS,
    Progress,
)
from pilotfish.operators.serviceworkload.status import (
    REASON_FAILED_CREATE,
    REASON_QUOTA_EXCEEDED,
    REASON_REPLICA_FAILURE,
    REPLICA_FAILURE,
    compute_status,
    replica_failure,
)
from pilotfish.quota import Excess, describe
from pilotfish.timeutil import FakeClock
from pilotfish.webhooks import quota as quota_rules
from tests.rollout_harness import (
    KEY,
    SW,
    T0,
    Lagging,
    World,
    condition,
    start,
    status,
    workload,
)
from tests.test_rollout_status import pod, want

QUOTA_TEXT = describe(
    "payments", "production", Excess("cpu", Fraction(18, 10), Fraction(2), Fraction(1, 2))
)
WEBHOOK_DENIAL = f'admission webhook "pods.pilotfish.io" denied the request: {QUOTA_TEXT}'
RESOURCE_QUOTA_DENIAL = (
    'pods "web-x" is forbidden: exceeded quota: pods-one, requested: pods=1, used: pods=1, '
    "limited: pods=1"
)


class Admission(Lagging):
    """Refuses pod creates beyond `room` pods with `denial` (403, as the API server does)."""

    room = 1_000_000
    denial = WEBHOOK_DENIAL

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
        if method == "POST" and path.endswith("/pods") and len(self.pods()) >= self.room:
            raise ApiError(403, "Forbidden", self.denial)
        return await super().request(
            method,
            path,
            params=params,
            body=body,
            content_type=content_type,
            request_timeout=request_timeout,
        )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def api() -> Admission:
    return Admission()


@pytest.fixture
async def world(api: Admission, clock: FakeClock) -> AsyncIterator[World]:
    w = await start(api, clock)
    yield w
    await w.stop()


def admit(api: Admission, room: int, denial: str = WEBHOOK_DENIAL) -> Admission:
    api.room, api.denial = room, denial
    return api


def failure(api: Lagging) -> dict[str, Any] | None:
    for c in status(api).get("conditions") or []:
        if c["type"] == REPLICA_FAILURE:
            return dict(c)
    return None


async def refused(world: World) -> None:
    """Rounds until the refusal shows in status; every round with a create is refused."""
    result = await world.converge(rounds=6)
    assert result.retry, result


async def test_a_quota_refusal_is_a_replica_failure_until_creates_succeed(
    world: World, api: Admission
) -> None:
    api.put(SERVICEWORKLOADS.path("ns"), workload(replicas=6))
    gate = admit(api, room=3)
    await refused(world)
    assert len(api.pods()) == 3
    got = failure(api)
    assert got is not None
    assert (got["status"], got["reason"], got["message"]) == (
        "True",
        REASON_QUOTA_EXCEEDED,
        WEBHOOK_DENIAL,
    )
    assert got["observedGeneration"] == 1
    assert condition(api, PROGRESSING) == ("False", REASON_REPLICA_FAILURE)
    assert condition(api, STALLED) == ("False", REASON_REPLICA_FAILURE)
    assert "making progress" not in str(status(api)["conditions"])
    events = [e for e in await world.events() if e["reason"] == "FailedCreate"]
    assert events and events[0]["type"] == "Warning" and QUOTA_TEXT in events[0]["note"]

    # Still refused on the retry: the condition stays, its transition time too.
    world.clock.advance(5)
    await refused(world)
    again = failure(api)
    assert again is not None and again["lastTransitionTime"] == got["lastTransitionTime"]

    gate.room = 6  # the quota is raised
    world.clock.advance(5)
    await world.converge()
    assert len(api.pods()) == 6
    assert failure(api) is None
    assert condition(api, PROGRESSING) == ("True", REASON_IN_PROGRESS)


async def test_any_other_refusal_is_failed_create_with_the_api_servers_text(
    world: World, api: Admission
) -> None:
    api.put(SERVICEWORKLOADS.path("ns"), workload(replicas=2))
    admit(api, room=1, denial=RESOURCE_QUOTA_DENIAL)
    await refused(world)
    got = failure(api)
    assert got is not None
    assert (got["status"], got["reason"], got["message"]) == (
        "True",
        REASON_FAILED_CREATE,
        RESOURCE_QUOTA_DENIAL,
    )


async def test_a_restarted_controller_learns_the_failure_again_from_the_next_create(
    world: World, api: Admission, clock: FakeClock
) -> None:
    api.put(SERVICEWORKLOADS.path("ns"), workload(replicas=2))
    gate = admit(api, room=1)
    await refused(world)
    await world.stop()
    # A new process has no memory of the refusal: its first create is refused again.
    second = await start(api, clock, seed=8)
    try:
        await refused(second)
        got = failure(api)
        assert got is not None and got["reason"] == REASON_QUOTA_EXCEEDED
    finally:
        await second.stop()
    gate.room = 2
    third = await start(api, clock, seed=9)
    try:
        await third.converge()
    finally:
        await third.stop()
    assert failure(api) is None


async def test_a_refusal_of_an_older_generation_is_not_reported(
    world: World, api: Admission
) -> None:
    api.put(SERVICEWORKLOADS.path("ns"), workload(replicas=2))
    admit(api, room=1)
    await refused(world)
    assert failure(api) is not None
    api.edit(SW, lambda sw: sw["spec"].update(replicas=1))
    await world.converge()  # nothing to create at the new generation: nothing refused
    assert failure(api) is None
    assert len(api.pods()) == 1


async def test_refusals_past_the_deadline_stall_and_say_why(world: World, api: Admission) -> None:
    api.put(
        SERVICEWORKLOADS.path("ns"), workload(replicas=2, strategy={"progressDeadlineSeconds": 60})
    )
    admit(api, room=1)
    await refused(world)
    world.clock.advance(61)
    await refused(world)
    assert condition(api, STALLED) == ("True", REASON_DEADLINE_EXCEEDED)
    assert condition(api, PROGRESSING) == ("False", REASON_DEADLINE_EXCEEDED)
    messages = {c["type"]: c["message"] for c in status(api)["conditions"]}
    assert QUOTA_TEXT in messages[PROGRESSING]
    assert messages[REPLICA_FAILURE] == WEBHOOK_DENIAL
    assert world.ctrl.failures[KEY].reason == REASON_QUOTA_EXCEEDED


# -- classification and status, pure -----------------------------------------------------


def test_every_team_quota_denial_is_recognised_as_quota() -> None:
    pod_ = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": []}}
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    no_grant = quota_rules.decide(pod_, {"pilotfish.io/team": "payments"}, "production", [], now)
    assert isinstance(no_grant, quota_rules.Refuse)
    two = "; ".join(
        describe("payments", "production", Excess(r, Fraction(1), Fraction(2), Fraction(2)))
        for r in ("cpu", "memory")
    )
    for text in (QUOTA_TEXT, two, no_grant.message):
        wrapped = f'admission webhook "pods.pilotfish.io" denied the request: {text}'
        assert replica_failure(3, wrapped).reason == REASON_QUOTA_EXCEEDED, text
    for other in (RESOURCE_QUOTA_DENIAL, "spec.containers[0].image: Required value", ""):
        assert replica_failure(3, other).reason == REASON_FAILED_CREATE, other


def test_a_complete_rollout_reports_no_failure() -> None:
    status = compute_status(
        name="web",
        generation=1,
        pods=[pod(f"n{i}", "new") for i in range(3)],
        desired=want(),
        progress=Progress("complete", 0.0),
        current_revision="new",
        previous=None,
        deadline_seconds=600,
        now=1_700_000_000.0,
        now_str="t",
        failure=replica_failure(1, WEBHOOK_DENIAL),
    )
    types = {c["type"]: c["reason"] for c in status["conditions"]}
    assert REPLICA_FAILURE not in types
    assert types[PROGRESSING] == REASON_COMPLETE
