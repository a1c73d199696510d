"""The chart's nodeLifecycle values reach the processes that read them, as the environment
`SilenceSettings.from_env` parses, and default to upstream mode (real clusters run upstream's
node lifecycle controller)."""

from __future__ import annotations

from typing import Any

import pytest

from pilotfish.nodesilence import MODE_PILOTFISH, MODE_UPSTREAM, SilenceSettings
from tests.test_chart_values import load_schema, load_values, needs_helm, render, schema_errors


def env_of(docs: list[dict[str, Any]], deployment: str) -> dict[str, str]:
    (dep,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == deployment]
    env = dep["spec"]["template"]["spec"]["containers"][0]["env"]
    return {e["name"]: e["value"] for e in env if "value" in e}


def test_defaults() -> None:
    assert load_values()["nodeLifecycle"] == {
        "mode": MODE_UPSTREAM,
        "unreachableSeconds": 40,
        "evictionWaitSeconds": 60,
        "atMostOneMarginSeconds": 15,
    }


@pytest.mark.parametrize(
    ("key", "value"),
    [("mode", "off"), ("unreachableSeconds", 0), ("evictionWaitSeconds", -1), ("mode", None)],
)
def test_bad_values_are_rejected(key: str, value: Any) -> None:
    values = load_values()
    values["nodeLifecycle"][key] = value
    assert schema_errors(values, load_schema()), f"nodeLifecycle.{key}={value!r} accepted"


@needs_helm
def test_the_operator_and_webhooks_get_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(
        "nodeLifecycle.mode=pilotfish",
        "nodeLifecycle.unreachableSeconds=30",
        "nodeLifecycle.evictionWaitSeconds=90",
    )
    operator = env_of(docs, "pilotfish-operator")
    for name, value in operator.items():
        if name.startswith("PILOTFISH_"):
            monkeypatch.setenv(name, value)
    assert SilenceSettings.from_env() == SilenceSettings(
        unreachable_after=30, eviction_wait=90, at_most_one_margin=15, mode=MODE_PILOTFISH
    )
    assert env_of(docs, "pilotfish-webhooks")["PILOTFISH_EVICTION_WAIT_SECONDS"] == "90"
    assert env_of(render(), "pilotfish-operator")["PILOTFISH_NODE_LIFECYCLE"] == MODE_UPSTREAM
