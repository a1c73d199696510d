"""ReplicaFailure: a refused pod create is status, not only an Event.

Driven through the controller against the in-memory API of test_rollout_controller, with
an admission step in front of pod creates that refuses the way the team quota webhook (or
a namespace ResourceQuota) does, so the text in the condition is the text the API server
would send.
"""

from __future__ import annotations

import datetime
import random
from fractions import Fraction
from typing import Any

import pytest

from pilotfish.api.serviceworkload import PROGRESSING, STALLED
from pilotfish.kube.rest import ApiError
from pilotfish.operators.serviceworkload.controller import CreateFailed, ServiceWorkloadController
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
from pilotfish.webhooks import quota as quota_rules
from tests.test_rollout_controller import (
    KEY,
    Clock,
    FakeApi,
    Obj,
    condition,
    controller,
    sw_status,
    sync,
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


class Admission:
    """Refuses pod creates beyond `room` pods with `denial` (403, as the API server does)."""

    def __init__(self, api: FakeApi, room: int, denial: str) -> None:
        self.api, self.room, self.denial = api, room, denial

    async def create(self, path: str, body: Obj) -> Obj:
        if "/pods" in path and len(self.api.pods()) >= self.room:
            raise ApiError(403, "Forbidden", self.denial)
        return await FakeApi.create(self.api, path, body)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def api(clock: Clock) -> FakeApi:
    return FakeApi(clock)


def admit(api: FakeApi, room: int, denial: str = WEBHOOK_DENIAL) -> Admission:
    gate = Admission(api, room, denial)
    api.create = gate.create  # type: ignore[method-assign]
    return gate


def failure(api: FakeApi) -> dict[str, Any] | None:
    for c in sw_status(api).get("conditions") or []:
        if c["type"] == REPLICA_FAILURE:
            return dict(c)
    return None


def restarted(api: FakeApi, clock: Clock, seed: int) -> ServiceWorkloadController:
    """Another process: its own random pod names."""
    return ServiceWorkloadController(api, clock=clock, rng=random.Random(seed))  # type: ignore[arg-type]


async def refused_sync(ctrl: ServiceWorkloadController) -> None:
    with pytest.raises(CreateFailed):
        await sync(ctrl)


async def test_a_quota_refusal_is_a_replica_failure_until_creates_succeed(
    api: FakeApi, clock: Clock
) -> None:
    api.put("serviceworkloads", workload(replicas=6))
    gate = admit(api, room=3)
    ctrl = controller(api, clock)
    await refused_sync(ctrl)
    assert len(api.pods()) == 3
    got = failure(api)
    assert got is not None
    assert (got["status"], got["reason"], got["message"]) == (
        "True",
        REASON_QUOTA_EXCEEDED,
        WEBHOOK_DENIAL,
    )
    assert got["observedGeneration"] == 1
    status, reason = condition(api, PROGRESSING)
    assert (status, reason) == ("False", REASON_REPLICA_FAILURE)
    assert condition(api, STALLED) == ("False", REASON_REPLICA_FAILURE)
    assert "making progress" not in str(sw_status(api)["conditions"])

    # Still refused on the retry: the condition stays, its transition time too.
    clock.now += 5
    await refused_sync(ctrl)
    again = failure(api)
    assert again is not None and again["lastTransitionTime"] == got["lastTransitionTime"]

    gate.room = 6  # the quota is raised
    clock.now += 5
    await sync(ctrl)
    assert len(api.pods()) == 6
    assert failure(api) is None
    assert condition(api, PROGRESSING) == ("True", REASON_IN_PROGRESS)


async def test_any_other_refusal_is_failed_create_with_the_api_servers_text(
    api: FakeApi, clock: Clock
) -> None:
    api.put("serviceworkloads", workload(replicas=2))
    admit(api, room=1, denial=RESOURCE_QUOTA_DENIAL)
    await refused_sync(controller(api, clock))
    got = failure(api)
    assert got is not None
    assert (got["status"], got["reason"], got["message"]) == (
        "True",
        REASON_FAILED_CREATE,
        RESOURCE_QUOTA_DENIAL,
    )


async def test_a_restarted_controller_learns_the_failure_again_from_the_next_create(
    api: FakeApi, clock: Clock
) -> None:
    api.put("serviceworkloads", workload(replicas=2))
    gate = admit(api, room=1)
    await refused_sync(controller(api, clock))
    # A new process has no memory of the refusal: its first create is refused again.
    await refused_sync(restarted(api, clock, 8))
    got = failure(api)
    assert got is not None and got["reason"] == REASON_QUOTA_EXCEEDED
    gate.room = 2
    await sync(restarted(api, clock, 9))
    assert failure(api) is None


async def test_a_refusal_of_an_older_generation_is_not_reported(api: FakeApi, clock: Clock) -> None:
    api.put("serviceworkloads", workload(replicas=2))
    admit(api, room=1)
    ctrl = controller(api, clock)
    await refused_sync(ctrl)
    assert failure(api) is not None

    def scale_down(sw: Obj) -> None:
        sw["spec"]["replicas"] = 1
        sw["metadata"]["generation"] += 1

    api.edit("serviceworkloads", "web", scale_down)
    await sync(ctrl)  # nothing to create at the new generation: nothing refused
    assert failure(api) is None
    assert len(api.pods()) == 1


async def test_refusals_past_the_deadline_stall_and_say_why(api: FakeApi, clock: Clock) -> None:
    api.put("serviceworkloads", workload(replicas=2, strategy={"progressDeadlineSeconds": 60}))
    admit(api, room=1)
    ctrl = controller(api, clock)
    await refused_sync(ctrl)
    clock.now += 61
    await refused_sync(ctrl)
    assert condition(api, STALLED) == ("True", REASON_DEADLINE_EXCEEDED)
    assert condition(api, PROGRESSING) == ("False", REASON_DEADLINE_EXCEEDED)
    messages = {c["type"]: c["message"] for c in sw_status(api)["conditions"]}
    assert QUOTA_TEXT in messages[PROGRESSING]
    assert messages[REPLICA_FAILURE] == WEBHOOK_DENIAL
    assert ctrl.create_failures[KEY].reason == REASON_QUOTA_EXCEEDED


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
