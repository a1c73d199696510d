"""The usage pipeline the reclaim controller reads: kwok emulates each pod's usage from its
annotations and serves it kubelet-style per node; the local Prometheus scrapes every node
(labelled `node`) and Pilotfish's own /metrics, loads the chart's rules, and survives being
stopped and started again."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from e2e import prom
from e2e.conftest import Env, wait_until
from pilotfish import names
from pilotfish.devcluster.kwokusage import ANNOTATION_USAGE_CPU, ANNOTATION_USAGE_MEMORY

ROOT = Path(__file__).resolve().parent.parent
# One sample line of the text exposition format, and one label pair of it.
SAMPLE = re.compile(r"^(?P<name>\w+)\{(?P<labels>[^}]*)\} (?P<value>\S+)", re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')


def _fake_nodes(env: Env) -> set[str]:
    listed = k8s.CoreV1Api(env.api).list_node(label_selector=f"{names.LABEL_FAKE_NODE}=true")
    return {n.metadata.name for n in listed.items}


@pytest.fixture
def usage_pod(env: Env, namespace: str) -> Iterator[tuple[str, str]]:
    """A running pod that uses 400m cpu and 300Mi memory by its annotations: (name, node)."""
    core = k8s.CoreV1Api(env.api)
    body = {
        "metadata": {
            "name": "busy",
            "annotations": {ANNOTATION_USAGE_CPU: "400m", ANNOTATION_USAGE_MEMORY: "300Mi"},
        },
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "example/app:1",
                    "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
                }
            ]
        },
    }
    core.create_namespaced_pod(namespace, body)

    def running() -> str | None:
        pod = core.read_namespaced_pod("busy", namespace)
        return pod.spec.node_name if pod.status.phase == "Running" else None

    node = wait_until("the pod running on a kwok node", running, timeout=60)
    yield "busy", node


def test_prometheus_scrapes_every_kwok_node_and_every_pilotfish_process(env: Env) -> None:
    assert prom.ready(env)
    nodes = _fake_nodes(env)

    def healthy() -> dict[str, set[str]] | None:
        up: dict[str, set[str]] = {}
        for t in prom.targets(env):
            if t["health"] == "up":
                labels = t["labels"]
                up.setdefault(labels["job"], set()).add(labels.get("node") or labels["component"])
        ok = up.get("kubelet-resource") == nodes
        return up if ok and up.get("pilotfish") == {"operator", "extender", "webhooks"} else None

    wait_until("every node and every Pilotfish process scraped", healthy, timeout=60)


def test_a_pods_annotated_cpu_is_its_usage_rate_on_its_node(
    env: Env, namespace: str, usage_pod: tuple[str, str]
) -> None:
    pod, node = usage_pod
    sel = f'namespace="{namespace}",pod="{pod}"'
    rate = f"rate(pod_cpu_usage_seconds_total{{{sel}}}[20s])"

    def near(target: float) -> Any:
        return lambda result: len(result) == 1 and abs(prom.value(result[0]) - target) < 0.02

    [sample] = prom.wait_for_series(env, rate, deadline=90, check=near(0.4))
    assert sample["metric"]["node"] == node
    assert sample["metric"]["job"] == "kubelet-resource"
    [memory] = prom.wait_for_series(env, f"pod_memory_working_set_bytes{{{sel}}}", deadline=30)
    assert prom.value(memory) == 300 * 2**20
    assert memory["metric"]["node"] == node

    # A running pod's usage follows its annotation: what a test raises, Prometheus sees.
    k8s.CoreV1Api(env.api).patch_namespaced_pod(
        pod, namespace, {"metadata": {"annotations": {ANNOTATION_USAGE_CPU: "1500m"}}}
    )
    fast = f"irate(pod_cpu_usage_seconds_total{{{sel}}}[30s])"
    prom.wait_for_series(env, fast, deadline=60, check=near(1.5))


def test_kwok_serves_the_usage_kubelet_style(
    env: Env, namespace: str, usage_pod: tuple[str, str]
) -> None:
    """The endpoint Prometheus scrapes: the pod's cumulative cpu grows at 0.4 s a second."""
    pod, node = usage_pod
    assert env.spec is not None
    url = f"http://127.0.0.1:{env.spec.ports.kwok}/metrics/nodes/{node}/metrics/resource"
    labels = {"namespace": namespace, "pod": pod}

    def counter() -> tuple[float, float] | None:
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        for found in SAMPLE.finditer(text):
            if (
                found["name"] == "pod_cpu_usage_seconds_total"
                and labels.items() <= dict(LABEL.findall(found["labels"])).items()
            ):
                return time.monotonic(), float(found["value"])
        return None

    t0, c0 = wait_until(f"the pod's counter at {url}", counter, timeout=30)
    wait_until("a few seconds of usage", lambda: time.monotonic() - t0 > 3, timeout=10)
    t1, c1 = wait_until("the counter again", counter, timeout=10)
    assert (c1 - c0) / (t1 - t0) == pytest.approx(0.4, abs=0.05)


def test_the_operators_own_metrics_are_scraped(env: Env) -> None:
    [leader] = prom.wait_for_series(
        env, 'pilotfish_operator_leader{job="pilotfish",component="operator"}', deadline=60
    )
    assert prom.value(leader) == 1


def test_the_charts_rules_are_loaded_and_evaluate(env: Env) -> None:
    def evaluated() -> list[dict[str, Any]] | None:
        groups = prom.rule_groups(env)
        rules = [r for g in groups for r in g["rules"]]
        done = all(not r.get("lastEvaluation", "0001").startswith("0001") for r in rules)
        return groups if rules and done else None

    groups = wait_until("the chart's rule groups evaluated", evaluated, timeout=60)
    rules = [r for g in groups for r in g["rules"]]
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []
    names_ = {r["name"] for r in rules}
    assert {a["labels"]["alertname"] for a in prom.alerts(env)} <= names_


def test_a_bad_query_fails_with_prometheus_reason(env: Env) -> None:
    with pytest.raises(prom.PrometheusError, match="parse error"):
        prom.query(env, "rate(up[")


def test_prometheus_stopped_and_started_again_keeps_its_data(env: Env) -> None:
    expr = 'count_over_time(up{job="pilotfish",component="operator"}[1h])'
    [before] = prom.wait_for_series(env, expr, deadline=30)
    env.kill("prometheus")
    assert not prom.ready(env)
    with pytest.raises(prom.PrometheusError):
        prom.query(env, "up")
    env.restart("prometheus")
    assert prom.ready(env)
    # Samples from before the stop are still there, and scraping resumed.
    prom.wait_for_series(
        env, expr, deadline=60, check=lambda r: prom.value(r[0]) > prom.value(before)
    )


def test_prometheus_and_promtool_are_the_pinned_release(env: Env) -> None:
    versions = dict(
        line.split("=", 1)
        for line in (ROOT / "devcluster" / "versions.env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    # Prometheus 3.x is published as Go module v0.3xx.y: v0.316.0 is 3.16.0.
    minor, patch = versions["PROMETHEUS_VERSION"].removeprefix("v0.").split(".")
    release = f"{minor[0]}.{int(minor[1:])}.{patch}"
    for tool in ("prometheus", "promtool"):
        out = subprocess.run(
            [str(env.bins / tool), "--version"], capture_output=True, text=True, check=True
        ).stdout
        assert out.startswith(f"{tool}, version {release} "), out
