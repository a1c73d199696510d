"""Each team's pace of pod creates at admission (`pilotfish.webhooks.createpace`): the pure
bucket rule, the per-team pacer a replica keeps, and the validating pod review answering
429 with Retry-After through the HTTPS app."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from pilotfish import names, podmeta
from pilotfish.webhooks import createpace, server
from pilotfish.webhooks.createpace import (
    BURST_ENV,
    RATE_ENV,
    CreatePace,
    Hold,
    PaceSettings,
    Throttle,
    take,
)
from pilotfish.webhooks.gatecache import StaticViews
from pilotfish.webhooks.gateview import GateView
from pilotfish.webhooks.quota import Admit
from pilotfish.webhooks.teamview import TeamSnapshot

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SETTINGS = PaceSettings(per_second=10, burst=5, max_hold=2.0, max_held=100)
OPERATOR = podmeta.operator_username(names.SYSTEM_NAMESPACE)
BATCH = f"system:serviceaccount:{names.SYSTEM_NAMESPACE}:{names.SA_BATCH}"


# --- the rule ----------------------------------------------------------------------------


def run(times: list[float], settings: PaceSettings = SETTINGS) -> list[Hold | Throttle]:
    bucket = None
    out = []
    for t in times:
        bucket, outcome = take(bucket, t, settings)
        out.append(outcome)
    return out


def test_a_burst_passes_then_each_create_waits_its_turn_then_is_refused() -> None:
    outcomes = run([0.0] * 30)
    assert outcomes[:5] == [Hold(0.0)] * 5
    waits = [o.seconds for o in outcomes[5:] if isinstance(o, Hold)]
    assert waits == pytest.approx([0.1 * k for k in range(1, 21)])  # 2 s of holds at 10/s
    refused = outcomes[25:]
    assert all(isinstance(o, Throttle) for o in refused)
    assert refused[0] == Throttle(pytest.approx(2.1))  # type: ignore[arg-type]


def test_a_refused_create_takes_nothing() -> None:
    bucket, _ = take(None, 0.0, PaceSettings(per_second=1, burst=1, max_hold=0.5))
    for _ in range(10):
        bucket, outcome = take(bucket, 0.0, PaceSettings(per_second=1, burst=1, max_hold=0.5))
        assert isinstance(outcome, Throttle)
    _, outcome = take(bucket, 1.0, PaceSettings(per_second=1, burst=1, max_hold=0.5))
    assert outcome == Hold(0.0), "the token that came in that second is still there"


def test_a_team_holding_its_limit_is_refused_rather_than_held() -> None:
    settings = PaceSettings(per_second=10, burst=1, max_hold=2.0, max_held=3)
    bucket, first = take(None, 0.0, settings)
    assert first == Hold(0.0)
    bucket, outcome = take(bucket, 0.0, settings, held=2)
    assert isinstance(outcome, Hold) and outcome.seconds > 0
    _, outcome = take(bucket, 0.0, settings, held=3)
    assert isinstance(outcome, Throttle)
    _, outcome = take(bucket, 10.0, settings, held=3)
    assert outcome == Hold(0.0), "a create that need not wait is never refused for the others"


@given(
    gaps=st.lists(st.floats(min_value=0, max_value=0.5), min_size=1, max_size=300),
    rate=st.floats(min_value=0.5, max_value=100),
    burst=st.integers(min_value=1, max_value=50),
)
def test_admitted_creates_never_outrun_burst_plus_rate(
    gaps: list[float], rate: float, burst: int
) -> None:
    settings = PaceSettings(per_second=rate, burst=burst, max_hold=2.0, max_held=1000)
    now, bucket = 0.0, None
    admitted: list[float] = []  # when each admitted create goes through
    for gap in gaps:
        now += gap
        bucket, outcome = take(bucket, now, settings)
        if isinstance(outcome, Hold):
            assert 0 <= outcome.seconds <= settings.max_hold
            admitted.append(now + outcome.seconds)
        else:
            assert outcome.retry_after > settings.max_hold
    assert admitted == sorted(admitted), "held creates go through in the order they came"
    for k, at in enumerate(admitted):
        assert k + 1 <= burst + rate * at + 1e-6


def test_settings_from_the_environment_name_the_variable() -> None:
    assert PaceSettings.from_env({}) == PaceSettings()
    assert PaceSettings.from_env({RATE_ENV: "25.5", BURST_ENV: "100"}) == PaceSettings(25.5, 100)
    assert not PaceSettings.from_env({RATE_ENV: "0"}).enabled
    for env, fragment in (
        ({RATE_ENV: "fast"}, RATE_ENV),
        ({RATE_ENV: "-1"}, RATE_ENV),
        ({RATE_ENV: "nan"}, RATE_ENV),
        ({BURST_ENV: "0"}, BURST_ENV),
        ({BURST_ENV: "1.5"}, BURST_ENV),
        ({BURST_ENV: "²"}, BURST_ENV),
    ):
        with pytest.raises(ValueError, match=fragment):
            PaceSettings.from_env(env)


# --- the pacer of one replica ---------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def pacer(settings: PaceSettings = SETTINGS) -> tuple[CreatePace, Clock]:
    clock = Clock()
    exempt = podmeta.pilotfish_creators(names.SYSTEM_NAMESPACE)
    return CreatePace(settings, exempt, clock, clock.sleep), clock


def create(namespace: str = "shop", user: str = "alice", **extra: Any) -> dict[str, Any]:
    return {
        "operation": "CREATE",
        "namespace": namespace,
        "userInfo": {"username": user},
        "kind": {"kind": "Pod"},
    } | extra


PAYMENTS = {names.LABEL_TEAM: "payments"}


async def exhaust(pace: CreatePace, labels: Mapping[str, str], namespace: str = "shop") -> None:
    for _ in range(25):
        assert await pace.admit(create(namespace), labels) is None


async def test_a_team_is_held_then_refused_with_retry_after() -> None:
    pace, clock = pacer()
    await exhaust(pace, PAYMENTS)
    assert clock.slept == pytest.approx([0.1 * k for k in range(1, 21)])
    refused = await pace.admit(create(), PAYMENTS)
    assert refused is not None and not refused.allowed
    assert (refused.code, refused.reason, refused.retry_after) == (429, "TooManyRequests", 3)
    assert refused.message.startswith("team payments is creating pods faster than its pace")
    assert "10 a second with a burst of 5 at this webhook replica" in refused.message


async def test_namespaces_of_one_team_share_a_pace_and_teams_do_not() -> None:
    pace, _ = pacer()
    await exhaust(pace, PAYMENTS, "shop")
    assert await pace.admit(create("checkout"), PAYMENTS) is not None
    assert await pace.admit(create("search"), {names.LABEL_TEAM: "search"}) is None
    # A namespace without a team is paced on its own.
    await exhaust(pace, {}, "scratch")
    refused = await pace.admit(create("scratch"), {})
    assert refused is not None and refused.message.startswith("namespace scratch is creating")
    assert await pace.admit(create("scratch2"), {}) is None


@pytest.mark.parametrize(
    "request_",
    [
        create(user=OPERATOR),
        create(user=BATCH),
        create(user="system:kube-controller-manager"),
        create(user="system:serviceaccount:kube-system:job-controller"),
        create(user="admin", userInfo={"username": "admin", "groups": ["system:masters"]}),
        create(namespace="kube-system"),
        create(namespace=names.SYSTEM_NAMESPACE),
        create(dryRun=True),
        create(operation="UPDATE"),
        create(subResource="binding"),
    ],
    ids=[
        "operator",
        "batch",
        "controller-manager",
        "job-controller",
        "administrator",
        "kube-system",
        "pilotfish",
        "dry-run",
        "update",
        "subresource",
    ],
)
async def test_what_is_never_paced(request_: dict[str, Any]) -> None:
    pace, clock = pacer()
    await exhaust(pace, PAYMENTS)
    slept = len(clock.slept)
    assert await pace.admit(request_, PAYMENTS) is None
    assert len(clock.slept) == slept, "not held either"
    assert await pace.admit(create(user="system:serviceaccount:shop:bot"), PAYMENTS) is not None


async def test_full_buckets_are_dropped_at_most_once_per_refill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(createpace, "PRUNE_ABOVE", 2)
    pace, clock = pacer()  # burst 5 + 100 held at 10/s: 10.5 s to refill
    for team in ("a", "b", "c"):
        assert await pace.admit(create(), {names.LABEL_TEAM: team}) is None
    assert pace.tracked() == 3, "the first pass over the bound scans, finds none full"
    clock.now = 5.0
    assert await pace.admit(create(), {names.LABEL_TEAM: "d"}) is None
    assert pace.tracked() == 4, "not again before a bucket could refill"
    clock.now = 11.0
    assert await pace.admit(create(), {names.LABEL_TEAM: "e"}) is None
    assert pace.tracked() == 1, "a, b, c and d are full again: only e is kept"


async def test_pace_off_paces_nothing() -> None:
    pace, clock = pacer(PaceSettings(per_second=0))
    for _ in range(1000):
        assert await pace.admit(create(), PAYMENTS) is None
    assert clock.slept == []


async def test_held_creates_are_counted_while_they_wait() -> None:
    gate = asyncio.Event()

    async def sleep(seconds: float) -> None:
        await gate.wait()

    pace = CreatePace(PaceSettings(10, 1, 2.0, max_held=2), frozenset(), lambda: 0.0, sleep)
    assert await pace.admit(create(), PAYMENTS) is None
    waiting = [asyncio.create_task(pace.admit(create(), PAYMENTS)) for _ in range(2)]
    await asyncio.sleep(0)
    assert pace.held("team payments") == 2
    refused = await pace.admit(create(), PAYMENTS)
    assert refused is not None and refused.code == 429
    gate.set()
    assert await asyncio.gather(*waiting) == [None, None]
    assert pace.held("team payments") == 0


# --- through the HTTPS app --------------------------------------------------------------------


class OpenTeams:
    """Team payments owns namespace shop, its batch band granted without limits."""

    def snapshot(self) -> TeamSnapshot:
        tq = {
            "metadata": {"name": "payments", "generation": 1, "resourceVersion": "1"},
            "spec": {"team": "payments", "bands": {"batch": {}, "production": {}}},
            "status": {},
        }
        return TeamSnapshot({"shop": PAYMENTS}, (tq,))

    async def reserve(
        self,
        pod: Mapping[str, Any],
        namespace_labels: Mapping[str, str],
        band: str,
        first: Admit,
        now: datetime,
    ) -> str | None:
        raise AssertionError("an unlimited band reserves nothing")


def review(uid: str, user: str = "alice") -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": uid,
            "namespace": "shop",
            "labels": {names.LABEL_TEAM: "payments", names.LABEL_BAND: "batch"},
        },
        "spec": {
            "containers": [{"name": "c", "image": "x"}],
            "priorityClassName": names.PRIORITY_CLASS["batch"],
            "schedulerName": names.SCHEDULER_NAME,
        },
    }
    request = create(user=user) | {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": uid,
        "object": pod,
        "dryRun": False,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def throttled_total() -> float:
    return REGISTRY.get_sample_value("pilotfish_webhooks_pod_creates_throttled_total") or 0.0


async def test_the_validating_review_answers_429_with_retry_after() -> None:
    pace, _ = pacer(PaceSettings(per_second=1, burst=2, max_hold=0.5))
    reviews = server.bind_reviews(
        StaticViews(GateView()), lambda: NOW, OpenTeams(), names.SCHEDULER_NAME, pace=pace
    )
    before = throttled_total()
    async with TestClient(TestServer(server.make_app(reviews))) as client:
        answers = []
        for k in range(3):
            resp = await client.post("/validate/pods", json=review(f"p{k}"))
            assert resp.status == 200
            answers.append((await resp.json())["response"])
        operator = await client.post("/validate/pods", json=review("op", OPERATOR))
        assert (await operator.json())["response"]["allowed"] is True
    assert [a["allowed"] for a in answers] == [True, True, False]
    status = answers[2]["status"]
    assert status["code"] == 429 and status["reason"] == "TooManyRequests"
    assert status["details"] == {"retryAfterSeconds": 1}
    assert "team payments" in status["message"]
    assert throttled_total() == before + 1
