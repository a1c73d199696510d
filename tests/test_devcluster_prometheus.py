"""The local Prometheus and kwok's usage emulation: the scrape configuration (checked by the
pinned promtool when it is built), the settings that reach the operator and Prometheus, its
least-privilege identity, and kwok's CRDs and documents."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from pilotfish import names, ports
from pilotfish.devcluster import (
    binaries,
    cluster,
    components,
    kwokusage,
    pki,
    prometheus,
    supervisor,
)
from pilotfish.devcluster.cluster import ClusterSpec
from pilotfish.devcluster.components import Layout, Ports

E2E = (
    ("PILOTFISH_PROMETHEUS_SCRAPE_INTERVAL", "5s"),
    ("PILOTFISH_RECLAIM_INTERVAL_SECONDS", "15"),
    ("PILOTFISH_RECLAIM_WINDOW", "2m"),
)


def _bins() -> Path:
    try:
        return binaries.bin_dir()
    except binaries.MissingBinaries:
        pytest.skip("binaries not built (devcluster/build.sh)")


def _job(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(j for j in doc["scrape_configs"] if j["job_name"] == name)


def _relabel(rules: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, str]:
    """Prometheus's `replace` relabelling (the only action used), enough to see where a
    discovered node's target ends up."""
    out = dict(labels)
    for r in rules:
        assert r.get("action", "replace") == "replace"
        value = ";".join(out.get(s, "") for s in r.get("source_labels", []))
        m = re.fullmatch(r.get("regex", "(.*)"), value)
        if m:
            groups = [m.group(0), *m.groups()]
            repl = r.get("replacement", "$1")
            for i, group in enumerate(groups):
                repl = repl.replace(f"${{{i}}}", group).replace(f"${i}", group)
            out[r["target_label"]] = repl
    return out


def test_port_is_the_documented_one_and_moves_with_the_offset() -> None:
    assert ports.PROMETHEUS == 16390
    assert Ports().shifted(2000).prometheus == 18390
    assert prometheus.url(Ports().shifted(7)) == "http://127.0.0.1:16397"


def test_each_kwok_node_is_scraped_at_kwoks_kubelet_path_labelled_node(tmp_path: Path) -> None:
    p = Ports().shifted(3)
    job = _job(prometheus.config(Layout(tmp_path), p), prometheus.KUBELET_JOB)
    [sd] = job["kubernetes_sd_configs"]
    assert sd["role"] == "node"
    assert sd["api_server"] == f"https://127.0.0.1:{p.apiserver}"
    assert sd["selectors"] == [{"role": "node", "label": f"{names.LABEL_FAKE_NODE}=true"}]
    assert sd["tls_config"]["cert_file"].endswith("pki/prometheus.crt")
    discovered = {"__address__": "10.250.0.1:10250", "__meta_kubernetes_node_name": "kwok-a-1"}
    target = _relabel(job["relabel_configs"], discovered)
    assert target["__address__"] == f"127.0.0.1:{p.kwok}"
    assert target["__metrics_path__"] == "/metrics/nodes/kwok-a-1/metrics/resource"
    assert target["node"] == "kwok-a-1"


def test_pilotfish_processes_are_scraped_by_component_with_a_client_certificate(
    tmp_path: Path,
) -> None:
    p = Ports().shifted(11)
    job = _job(prometheus.config(Layout(tmp_path), p), prometheus.PILOTFISH_JOB)
    seen = {
        sc["labels"]["component"]: (sc["targets"], sc["labels"]["__scheme__"])
        for sc in job["static_configs"]
    }
    assert seen == {
        "operator": ([f"127.0.0.1:{p.operator_metrics}"], "http"),
        "extender": ([f"127.0.0.1:{p.extender}"], "https"),
        "webhooks": ([f"127.0.0.1:{p.webhooks}"], "https"),
    }
    tls = job["tls_config"]
    assert tls["ca_file"].endswith("pki/ca.crt") and tls["key_file"].endswith("prometheus.key")


def test_scrape_and_evaluation_follow_the_setting(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    default = prometheus.config(layout, Ports())["global"]
    assert default == {
        "scrape_interval": "15s",
        "evaluation_interval": "15s",
        "scrape_timeout": "10s",
    }
    fast = prometheus.config(layout, Ports(), E2E, [tmp_path / "r.yaml"])
    assert fast["global"] == {
        "scrape_interval": "5s",
        "evaluation_interval": "5s",
        "scrape_timeout": "5s",
    }
    assert {j["scrape_interval"] for j in fast["scrape_configs"]} == {"5s"}
    assert fast["rule_files"] == [str(tmp_path / "r.yaml")]


def test_settings_come_from_the_callers_environment_over_the_saved_ones() -> None:
    environ = {
        "PILOTFISH_RECLAIM_WINDOW": "10m",
        "PILOTFISH_PROMETHEUS_SCRAPE_INTERVAL": "1m30s",
        "PILOTFISH_NODE_LIFECYCLE": "upstream",
        "HOME": "/root",
    }
    merged = dict(prometheus.merge_settings(E2E, environ))
    assert merged == {
        "PILOTFISH_PROMETHEUS_SCRAPE_INTERVAL": "1m30s",
        "PILOTFISH_RECLAIM_INTERVAL_SECONDS": "15",
        "PILOTFISH_RECLAIM_WINDOW": "10m",
    }
    assert prometheus.merge_settings(E2E, {}) == tuple(sorted(E2E))


@pytest.mark.parametrize("bad", ["", "5", "fast", "-5s", "0s", "5 s", "1s5m"])
def test_a_bad_scrape_interval_is_refused_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match=rf"PILOTFISH_PROMETHEUS_SCRAPE_INTERVAL={bad!r}: must"):
        prometheus.merge_settings((), {"PILOTFISH_PROMETHEUS_SCRAPE_INTERVAL": bad})


def test_the_operator_is_told_the_prometheus_url_and_the_reclaim_settings(
    tmp_path: Path,
) -> None:
    layout = Layout(tmp_path)
    spec = ClusterSpec(port_offset=40, settings=E2E)
    layout.cluster_file.write_text(json.dumps({"port_offset": 40, "settings": E2E}))
    assert cluster.load_spec(layout) == spec, "saved and read back"
    hosts = cluster.host_processes(layout, spec.ports)
    operator = next(c for c in hosts if c.name == "pilotfish-operator")
    assert dict(operator.env) == {
        "PILOTFISH_NODE_LIFECYCLE": "pilotfish",
        "PILOTFISH_PROMETHEUS_URL": f"http://127.0.0.1:{ports.PROMETHEUS + 40}",
        "PILOTFISH_RECLAIM_INTERVAL_SECONDS": "15",
        "PILOTFISH_RECLAIM_WINDOW": "2m",
    }
    assert all(not c.env for c in hosts if c is not operator)


def test_prometheus_runs_on_loopback_with_its_data_in_the_state_dir(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    layout.cluster_file.write_text(json.dumps({"port_offset": 9}))
    [c] = cluster.monitoring(layout, Path("/opt/bin"))
    assert c.name == "prometheus" and c.argv[0] == "/opt/bin/prometheus"
    flags = dict(a.removeprefix("--").split("=", 1) for a in c.argv[1:])
    assert flags["web.listen-address"] == f"127.0.0.1:{ports.PROMETHEUS + 9}"
    assert flags["storage.tsdb.path"] == str(tmp_path / "prometheus-data")
    assert flags["config.file"] == str(tmp_path / "config" / "prometheus.yaml")
    assert flags["storage.tsdb.retention.time"] == prometheus.RETENTION
    assert "web.enable-lifecycle" not in flags
    assert c.health.url == f"http://127.0.0.1:{ports.PROMETHEUS + 9}/-/ready"
    assert c.port == ports.PROMETHEUS + 9


def test_down_and_status_know_prometheus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = Layout(tmp_path)
    layout.cluster_file.write_text(json.dumps({"pilotfish": False}))
    stopped: list[str] = []

    def stop(layout: Layout, name: str) -> bool:
        stopped.append(name)
        return True

    monkeypatch.setattr(supervisor, "stop", stop)
    cluster.down(tmp_path)
    assert stopped.index("prometheus") < stopped.index("kube-apiserver")
    assert "prometheus" in cluster.status(tmp_path)["components"]


def test_its_identity_may_only_read_nodes(tmp_path: Path) -> None:
    role, binding = prometheus.rbac_objects()
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": prometheus.USER}
    ]
    made = pki.ensure(tmp_path)
    cert = x509.load_pem_x509_certificate(made.cert(prometheus.IDENTITY).read_bytes())
    assert cert.subject.rfc4514_string() == f"CN={prometheus.USER}", "no group: not an admin"


def test_kwok_enables_its_usage_crds() -> None:
    opts = components.kwok_options(Ports())
    assert opts["enableCRDs"] == ["Metric", "ClusterResourceUsage", "ResourceUsage"]
    assert "Stage" not in opts["enableCRDs"], "stages stay in kwok's --config"


def test_kwoks_documents_ship_beside_the_binaries() -> None:
    bins = _bins()
    crds = kwokusage.crd_documents(binaries.kwok_crd_dir(bins))
    kinds = {d["spec"]["names"]["kind"] for d in crds}
    assert kinds == set(kwokusage.CRDS)
    objs = dict(kwokusage.usage_objects(binaries.kwok_metrics_dir(bins)))
    assert objs["metrics"]["metadata"]["name"] == "metrics-resource"
    assert objs["metrics"]["spec"]["path"] == "/metrics/nodes/{nodeName}/metrics/resource"
    metric_names = {m["name"] for m in objs["metrics"]["spec"]["metrics"]}
    assert {
        "pod_cpu_usage_seconds_total",
        "pod_memory_working_set_bytes",
        "node_cpu_usage_seconds_total",
        "node_memory_working_set_bytes",
    } <= metric_names
    usage = objs["clusterresourceusages"]
    assert usage["metadata"]["name"] == "usage-from-annotation"
    assert kwokusage.ANNOTATION_USAGE_CPU in yaml.safe_dump(usage)


def test_promtool_accepts_the_generated_config_and_rules(tmp_path: Path) -> None:
    bins = _bins()
    layout = Layout(tmp_path)
    pki.ensure(layout.pki.root)
    path = prometheus.write_config(layout, Ports(), E2E)
    res = subprocess.run(
        [str(bins / "promtool"), "check", "config", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    rules = yaml.safe_load(path.read_text())["rule_files"]
    assert all(Path(r).parent == prometheus.rules_dir(layout) for r in rules)


def test_without_the_rules_renderer_prometheus_runs_without_rules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pilotfish.devcluster.promrules", None)
    assert prometheus.render_rules(Layout(tmp_path)) == []


def test_a_missing_prometheus_binary_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in binaries.REQUIRED:
        if name != "prometheus":
            (tmp_path / name).write_text("#!/bin/sh\n")
            (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PILOTFISH_BIN_DIR", str(tmp_path))
    with pytest.raises(binaries.MissingBinaries, match=r"missing prometheus; run .*build\.sh"):
        binaries.bin_dir()
