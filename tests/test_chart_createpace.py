"""The chart's webhooks.teamPodCreates reaches each webhook replica as its share, in the
environment `PaceSettings.from_env` reads; bad values are refused by the schema."""

from __future__ import annotations

from typing import Any

import pytest

from pilotfish.webhooks.createpace import PaceSettings
from tests.test_chart_reclaim import env_of
from tests.test_chart_values import load_schema, load_values, needs_helm, render, schema_errors


def test_the_default_is_twenty_a_second_per_team() -> None:
    assert load_values()["webhooks"]["teamPodCreates"] == {"perSecond": 20, "burst": 200}


@pytest.mark.parametrize(
    ("key", "value"), [("perSecond", -1), ("perSecond", "fast"), ("burst", 0), ("burst", 2.5)]
)
def test_bad_values_are_rejected(key: str, value: Any) -> None:
    values = load_values()
    values["webhooks"]["teamPodCreates"][key] = value
    assert schema_errors(values, load_schema()), f"teamPodCreates.{key}={value!r} accepted"


@needs_helm
def test_each_replica_gets_its_share() -> None:
    env = env_of(render(), "pilotfish-webhooks")
    assert PaceSettings.from_env(env) == PaceSettings(per_second=10, burst=100)
    three = env_of(
        render("webhooks.replicas=3", "webhooks.teamPodCreates.perSecond=30"), "pilotfish-webhooks"
    )
    assert PaceSettings.from_env(three) == PaceSettings(per_second=10, burst=66)
    off = env_of(render("webhooks.teamPodCreates.perSecond=0"), "pilotfish-webhooks")
    assert not PaceSettings.from_env(off).enabled
