"""The chart's reclaim values reach the operator and the webhooks as the environment their
own parsers read (`ReclaimSettings.from_env`, `reclaim.default_from_env`); a bad value is
refused by the schema, and reclaim on without a Prometheus is refused by name. The
ServiceMonitor selects the operator's, the extender's and the webhooks' metrics ports."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from operators.reclaim.settings import ReclaimSettings
from pilotfish import names
from pilotfish.webhooks import reclaim
from tests.test_chart_values import (
    CHART,
    helm,
    load_schema,
    load_values,
    needs_helm,
    render,
    schema_errors,
)


def env_of(docs: list[dict[str, Any]], deployment: str) -> dict[str, str]:
    (dep,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == deployment]
    env = dep["spec"]["template"]["spec"]["containers"][0]["env"]
    return {e["name"]: e["value"] for e in env if "value" in e}


def test_defaults_are_the_reclaim_controllers() -> None:
    values = load_values()["reclaim"]
    assert values == {
        "enabled": False,
        "prometheusUrl": "",
        "intervalSeconds": 60,
        "window": "1h",
        "margin": 0.10,
        "staleAfterSeconds": 180,
    }
    d = ReclaimSettings()
    assert (d.interval, d.window, d.margin, d.stale_after) == (60, "1h", 0.10, 180)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("enabled", "yes"),
        ("prometheusUrl", "prometheus:9090"),
        ("intervalSeconds", 0),
        ("window", "30s"),
        ("window", "an hour"),
        ("margin", 1),
        ("margin", -0.1),
        ("margin", "1.5"),
        ("margin", "ten percent"),
        ("staleAfterSeconds", 0),
    ],
)
def test_bad_values_are_rejected(key: str, value: Any) -> None:
    values = load_values()
    values["reclaim"][key] = value
    assert schema_errors(values, load_schema()), f"reclaim.{key}={value!r} accepted"


def test_good_values_validate() -> None:
    values = load_values()
    values["reclaim"] |= {"prometheusUrl": "https://prom.monitoring:9090/", "window": "2h30m"}
    assert schema_errors(values, load_schema()) == []


@needs_helm
def test_the_operator_and_the_webhooks_get_the_settings() -> None:
    docs = render(
        "reclaim.enabled=true",
        "reclaim.prometheusUrl=http://prometheus.monitoring:9090",
        "reclaim.intervalSeconds=30",
        "reclaim.window=2h",
        "reclaim.margin=0.2",
        "reclaim.staleAfterSeconds=300",
    )
    operator = env_of(docs, "pilotfish-operator")
    assert ReclaimSettings.from_env(operator) == ReclaimSettings(
        prometheus_url="http://prometheus.monitoring:9090",
        interval=30,
        window="2h",
        margin=0.2,
        stale_after=300,
    )
    assert reclaim.default_from_env(env_of(docs, "pilotfish-webhooks")) is True


@needs_helm
def test_by_default_reclaim_is_off_in_both() -> None:
    docs = render()
    operator = env_of(docs, "pilotfish-operator")
    assert "PILOTFISH_PROMETHEUS_URL" not in operator
    assert ReclaimSettings.from_env(operator) == ReclaimSettings()
    webhooks = env_of(docs, "pilotfish-webhooks")
    assert webhooks[reclaim.ENV] == "off"
    assert reclaim.default_from_env(webhooks) is False
    # A Prometheus alone: the controller measures, namespaces opt in by label.
    measured = render("reclaim.prometheusUrl=http://p:9090")
    assert ReclaimSettings.from_env(env_of(measured, "pilotfish-operator")).enabled
    assert env_of(measured, "pilotfish-webhooks")[reclaim.ENV] == "off"


@needs_helm
def test_reclaim_on_without_a_prometheus_is_refused_by_name() -> None:
    res = helm(
        "template",
        "t",
        str(CHART),
        "-n",
        names.SYSTEM_NAMESPACE,
        "--set",
        "reclaim.enabled=true",
        check=False,
    )
    assert res.returncode != 0
    assert "reclaim.enabled=true needs reclaim.prometheusUrl" in res.stderr


@needs_helm
def test_the_servicemonitor_scrapes_every_components_metrics_port() -> None:
    out = helm(
        "template",
        "t",
        str(CHART),
        "-n",
        names.SYSTEM_NAMESPACE,
        "--api-versions",
        "monitoring.coreos.com/v1",
        "--set",
        "metrics.serviceMonitor.enabled=true",
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if isinstance(d, dict)]
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    sel = monitor["spec"]["selector"]
    [expr] = sel["matchExpressions"]
    ports = {e["port"] for e in monitor["spec"]["endpoints"]}

    def selected(svc: dict[str, Any]) -> bool:
        labels = svc["metadata"].get("labels", {})
        match = all(labels.get(k) == v for k, v in sel["matchLabels"].items())
        return match and labels.get(expr["key"]) in expr["values"]

    services = [d for d in docs if d["kind"] == "Service" and selected(d)]
    components = {s["metadata"]["labels"]["app.kubernetes.io/component"] for s in services}
    assert components == {"operator", "extender", "webhooks"}
    for svc in services:
        named = {p["name"] for p in svc["spec"]["ports"]}
        assert ports & named, f"{svc['metadata']['name']} has no port {ports}"
    # Each metrics port reaches a container port that serves /metrics over plain HTTP.
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    for svc in services:
        (port,) = [p for p in svc["spec"]["ports"] if p["name"] in ports]
        target = port["targetPort"]
        pods = [
            d
            for d in deployments.values()
            if all(
                d["spec"]["template"]["metadata"]["labels"].get(k) == v
                for k, v in svc["spec"]["selector"].items()
            )
        ]
        assert pods, svc["metadata"]["name"]
        container_ports = {
            p["name"] for c in pods[0]["spec"]["template"]["spec"]["containers"] for p in c["ports"]
        }
        assert target in container_ports, (svc["metadata"]["name"], target)
