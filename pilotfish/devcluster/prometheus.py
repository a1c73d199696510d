"""The local cluster's Prometheus: the usage store the reclaim controller queries.

It scrapes two jobs. `kubelet-resource`: every kwok node found through the API server
(kubernetes_sd, role node, as its own least-privilege client), at kwok's kubelet-style
`/metrics/nodes/<node>/metrics/resource`, labelled `node`, the series a real kubelet's
`/metrics/resource` serves. `pilotfish`: the host processes' own /metrics, labelled
`component`; the extender and the webhooks demand client certificates, so Prometheus
presents its own. Its rules are the chart's PrometheusRules, so the alerts a platform team
installs are the ones e2e makes fire.

Pure apart from `ensure_rbac` and `write_config`: tests read the documents without starting
anything.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from pilotfish import names
from pilotfish.devcluster import pki
from pilotfish.devcluster.components import Component, Health, Layout, Ports

if TYPE_CHECKING:
    from kubernetes import client as k8s

NAME = "prometheus"
# The pki client identity Prometheus lists nodes as (`pki.CLIENTS`) and its RBAC.
IDENTITY = "prometheus"
USER = pki.CLIENTS[IDENTITY][0]
CLUSTER_ROLE = "pilotfish-dev-prometheus"
SCRAPE_INTERVAL_ENV = "PILOTFISH_PROMETHEUS_SCRAPE_INTERVAL"
DEFAULT_SCRAPE_INTERVAL = "15s"
# The reclaim controller's settings; the caller's values reach the operator unchanged.
RECLAIM_ENV_PREFIX = "PILOTFISH_RECLAIM_"
URL_ENV = "PILOTFISH_PROMETHEUS_URL"
# Long enough for the reclaim window a developer may set (1 h by default), short enough that
# a state directory does not grow without bound.
RETENTION = "6h"
KUBELET_JOB = "kubelet-resource"
PILOTFISH_JOB = "pilotfish"
# Prometheus durations: one or more number-unit pairs, largest unit first ("1m30s").
_DURATION = re.compile(r"^(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?$")


def check_duration(name: str, value: str) -> str:
    if not value or not _DURATION.match(value) or not re.search(r"[1-9]", value):
        raise ValueError(
            f"{name}={value!r}: must be a positive Prometheus duration such as 15s, 1m or 1m30s"
        )
    return value


def is_setting(name: str) -> bool:
    return name == SCRAPE_INTERVAL_ENV or name.startswith(RECLAIM_ENV_PREFIX)


def merge_settings(
    saved: tuple[tuple[str, str], ...], environ: Mapping[str, str]
) -> tuple[tuple[str, str], ...]:
    """The cluster's reclaim and scrape settings: what was saved, overridden by the
    caller's environment, checked here so a bad interval fails `up`, not Prometheus."""
    merged = dict(saved) | {k: v for k, v in environ.items() if is_setting(k)}
    if SCRAPE_INTERVAL_ENV in merged:
        check_duration(SCRAPE_INTERVAL_ENV, merged[SCRAPE_INTERVAL_ENV])
    return tuple(sorted(merged.items()))


def scrape_interval(settings: tuple[tuple[str, str], ...]) -> str:
    return dict(settings).get(SCRAPE_INTERVAL_ENV, DEFAULT_SCRAPE_INTERVAL)


def url(p: Ports) -> str:
    return f"http://127.0.0.1:{p.prometheus}"


def operator_env(p: Ports, settings: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """What the operator is told about Prometheus and reclaim: the local Prometheus's URL and
    the caller's PILOTFISH_RECLAIM_* settings."""
    reclaim = tuple((k, v) for k, v in settings if k.startswith(RECLAIM_ENV_PREFIX))
    return ((URL_ENV, url(p)), *reclaim)


def data_dir(layout: Layout) -> Path:
    return layout.root / "prometheus-data"


def config_file(layout: Layout) -> Path:
    return layout.config / "prometheus.yaml"


def rules_dir(layout: Layout) -> Path:
    return layout.config / "prometheus-rules"


def _tls(layout: Layout) -> dict[str, str]:
    pki = layout.pki
    return {
        "ca_file": str(pki.ca_cert),
        "cert_file": str(pki.cert(IDENTITY)),
        "key_file": str(pki.key(IDENTITY)),
    }


def kubelet_job(layout: Layout, p: Ports, interval: str) -> dict[str, Any]:
    """kwok's nodes as kubelets: one target per node, all served by kwok's one server."""
    return {
        "job_name": KUBELET_JOB,
        "scrape_interval": interval,
        "scheme": "http",
        "kubernetes_sd_configs": [
            {
                "role": "node",
                "api_server": f"https://127.0.0.1:{p.apiserver}",
                "tls_config": _tls(layout),
                "selectors": [{"role": "node", "label": f"{names.LABEL_FAKE_NODE}=true"}],
            }
        ],
        "relabel_configs": [
            {"source_labels": ["__meta_kubernetes_node_name"], "target_label": "node"},
            {"source_labels": ["__meta_kubernetes_node_name"], "target_label": "instance"},
            {"target_label": "__address__", "replacement": f"127.0.0.1:{p.kwok}"},
            {
                "source_labels": ["__meta_kubernetes_node_name"],
                "regex": "(.+)",
                "target_label": "__metrics_path__",
                "replacement": "/metrics/nodes/${1}/metrics/resource",
            },
        ],
    }


def pilotfish_job(layout: Layout, p: Ports, interval: str) -> dict[str, Any]:
    """The host processes' /metrics: the operator's plain port, the extender's and the
    webhooks' mutual-TLS ports (the scheme is per target)."""
    targets = (
        ("operator", p.operator_metrics, "http"),
        ("extender", p.extender, "https"),
        ("webhooks", p.webhooks, "https"),
    )
    return {
        "job_name": PILOTFISH_JOB,
        "scrape_interval": interval,
        "metrics_path": "/metrics",
        "tls_config": _tls(layout),
        "static_configs": [
            {
                "targets": [f"127.0.0.1:{port}"],
                "labels": {"component": component, "__scheme__": scheme},
            }
            for component, port, scheme in targets
        ],
    }


def config(
    layout: Layout,
    p: Ports,
    settings: tuple[tuple[str, str], ...] = (),
    rule_files: list[Path] | None = None,
) -> dict[str, Any]:
    """prometheus.yml: rules are evaluated as often as targets are scraped, so an alert's
    `for` is the only delay a test waits for."""
    interval = scrape_interval(settings)
    return {
        "global": {
            "scrape_interval": interval,
            "evaluation_interval": interval,
            "scrape_timeout": _timeout(interval),
        },
        "rule_files": [str(f) for f in rule_files or []],
        "scrape_configs": [kubelet_job(layout, p, interval), pilotfish_job(layout, p, interval)],
    }


def _timeout(interval: str) -> str:
    """Prometheus refuses a scrape timeout above the interval; 10 s is its default."""
    seconds = _seconds(interval)
    return interval if seconds < 10 else "10s"


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+)(ms|[smhdwy])", duration))


def component(layout: Layout, p: Ports, bin_dir: Path) -> Component:
    return Component(
        NAME,
        (
            str(bin_dir / "prometheus"),
            f"--config.file={config_file(layout)}",
            f"--storage.tsdb.path={data_dir(layout)}",
            f"--storage.tsdb.retention.time={RETENTION}",
            f"--web.listen-address=127.0.0.1:{p.prometheus}",
            "--log.level=warn",
        ),
        Health(f"{url(p)}/-/ready"),
        p.prometheus,
    )


def render_rules(layout: Layout) -> list[Path]:
    """The chart's PrometheusRules as rule files (`promrules`), freshly rendered."""
    try:
        promrules = importlib.import_module("pilotfish.devcluster.promrules")
    except ImportError:  # a tree without the chart's rules renderer: no rules to load
        return []
    out = rules_dir(layout)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*"):
        old.unlink()
    files: list[Path] = promrules.render_rule_files(out)
    return files


def write_config(layout: Layout, p: Ports, settings: tuple[tuple[str, str], ...]) -> Path:
    layout.config.mkdir(parents=True, exist_ok=True)
    path = config_file(layout)
    doc = config(layout, p, settings, render_rules(layout))
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def rbac_objects() -> list[dict[str, Any]]:
    """Read-only access to nodes for Prometheus's service discovery, nothing else."""
    rule = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": CLUSTER_ROLE},
            "rules": [rule],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": CLUSTER_ROLE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": CLUSTER_ROLE,
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
        },
    ]


def ensure_rbac(api: k8s.ApiClient) -> None:
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    rbac = k8s.RbacAuthorizationV1Api(api)
    role, binding = rbac_objects()
    for create, body in (
        (rbac.create_cluster_role, role),
        (rbac.create_cluster_role_binding, binding),
    ):
        try:
            create(body)
        except ApiException as e:
            if e.status != 409:
                raise
