"""`pilotfish dev up | down | status | env`: one local cluster per state directory.

`up` is idempotent: each part that already runs healthy is left alone, anything missing is
started, so running it twice is a no-op and running it after a crash repairs the cluster.
Pilotfish itself is installed the way a platform team would, with the Helm chart (local
mode: webhooks and extender point at host processes), and its host processes authenticate
with tokens of the chart's ServiceAccounts, never with the admin certificate.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from kubernetes import client as k8s

from pilotfish import names
from pilotfish.devcluster import (
    binaries,
    components,
    kwokusage,
    nodes,
    pki,
    prometheus,
    realnode,
    supervisor,
)
from pilotfish.devcluster import kubeconfig as kcfg
from pilotfish.devcluster.components import Layout, Ports
from pilotfish.devcluster.hostprocs import HOST_PROCESSES, host_processes, monitoring
from pilotfish.devcluster.spec import DEFAULT_NODES, ClusterSpec, default_state_dir, load_spec

# The spec and host-process names are re-exported: callers know a local cluster by this module.
__all__ = [
    "DEFAULT_NODES",
    "HOST_PROCESSES",
    "RELEASE",
    "TOKEN_SECONDS",
    "ClusterSpec",
    "api_client",
    "chart_dir",
    "default_state_dir",
    "down",
    "env_lines",
    "host_processes",
    "install_pilotfish",
    "load_spec",
    "local_values",
    "monitoring",
    "ready_nodes",
    "resolve_spec",
    "running_cluster",
    "start_usage_pipeline",
    "status",
    "switch_node_lifecycle",
    "up",
    "wait_for",
]

log = logging.getLogger("pilotfish.dev")

TOKEN_SECONDS = 7 * 24 * 3600
RELEASE = "pilotfish"


# The synchronous client is imported where it is used: every Pilotfish process starts
# through `pilotfish.cli.main`, and the long-running ones (operator, webhooks, extender)
# never talk to a dev cluster, so they should not carry its ~15 MB of models.


def api_client(layout: Layout) -> k8s.ApiClient:
    from kubernetes import config as k8s_config

    return k8s_config.new_client_from_config(config_file=str(layout.admin_kubeconfig))


def _write_configs(layout: Layout, spec: ClusterSpec, bins: Path) -> None:
    p = spec.ports
    pk = pki.ensure(
        layout.pki.root, extra_server_ips=tuple(filter(None, [components.advertise_address()]))
    )
    server = f"https://127.0.0.1:{p.apiserver}"
    kcfg.write(
        layout.admin_kubeconfig,
        server,
        pk.ca_cert,
        "pilotfish-admin",
        client_cert=pk.cert("admin"),
        client_key=pk.key("admin"),
    )
    layout.kubeconfig("x").parent.mkdir(parents=True, exist_ok=True)
    for ident in ("kube-scheduler", "kube-controller-manager", "kwok"):
        kcfg.write(
            layout.kubeconfig(ident),
            server,
            pk.ca_cert,
            ident,
            client_cert=pk.cert(ident),
            client_key=pk.key(ident),
        )
    layout.config.mkdir(parents=True, exist_ok=True)
    (layout.config / "scheduler.yaml").write_text(
        yaml.safe_dump(components.scheduler_config(layout, p))
    )
    (layout.config / "kwok.yaml").write_text(
        yaml.safe_dump_all(components.kwok_config(binaries.kwok_stage_dir(bins), p, spec.nodes))
    )
    prometheus.write_config(layout, p, spec.settings)
    (layout.config / "audit-policy.yaml").write_text(yaml.safe_dump(components.AUDIT_POLICY))
    layout.admission_config.write_text(yaml.safe_dump(components.admission_config(layout)))
    layout.webhook_kubeconfig.write_text(yaml.safe_dump(components.webhook_kubeconfig(layout, p)))
    layout.cluster_file.write_text(json.dumps(dataclasses.asdict(spec), indent=2) + "\n")


def _ensure_nodes(api: k8s.ApiClient, count: int) -> None:
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    core = k8s.CoreV1Api(api)
    for node in nodes.fleet(count):
        try:
            core.create_node(node)
        except ApiException as e:
            if e.status != 409:
                raise


def wait_for(what: str, check: Any, timeout: float = 120.0, interval: float = 0.5) -> Any:
    """Poll `check()` until it returns something truthy or the deadline passes."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def ready_nodes(api: k8s.ApiClient) -> list[str]:
    from kubernetes import client as k8s

    out = []
    for n in k8s.CoreV1Api(api).list_node(label_selector=f"{names.LABEL_FAKE_NODE}=true").items:
        if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or [])):
            out.append(n.metadata.name)
    return out


def _helm(layout: Layout, bins: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(binaries.helm(bins)), "--kubeconfig", str(layout.admin_kubeconfig), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args[:2])} failed:\n{res.stderr.strip()}")
    return res


def chart_dir() -> Path:
    root = binaries.checkout_root()
    if root is None:
        raise RuntimeError("the local mode installs charts/pilotfish from a source checkout")
    return root / "charts" / "pilotfish"


def local_values(layout: Layout, p: Ports) -> list[str]:
    ca = base64.b64encode(layout.pki.ca_cert.read_bytes()).decode()
    return [
        "--set",
        "local.enabled=true",
        "--set",
        "local.host=127.0.0.1",
        "--set",
        f"local.webhookPort={p.webhooks}",
        "--set",
        f"local.extenderPort={p.extender}",
        "--set",
        f"local.caBundle={ca}",
    ]


def install_pilotfish(layout: Layout, spec: ClusterSpec, bins: Path) -> None:
    """Helm-install the chart in local mode, then run its parts as host processes."""
    _helm(
        layout,
        bins,
        "upgrade",
        "--install",
        RELEASE,
        str(chart_dir()),
        "--namespace",
        names.SYSTEM_NAMESPACE,
        "--create-namespace",
        *local_values(layout, spec.ports),
        "--wait",
        "--timeout",
        "2m",
    )
    from kubernetes import client as k8s

    api = api_client(layout)
    core = k8s.CoreV1Api(api)
    server = f"https://127.0.0.1:{spec.ports.apiserver}"
    for component, sa in names.COMPONENT_ACCOUNTS.items():
        tr = core.create_namespaced_service_account_token(
            sa,
            names.SYSTEM_NAMESPACE,
            {"spec": {"audiences": [], "expirationSeconds": TOKEN_SECONDS}},
        )
        kcfg.write(
            layout.kubeconfig(component),
            server,
            layout.pki.ca_cert,
            f"system:serviceaccount:{names.SYSTEM_NAMESPACE}:{sa}",
            token=tr.status.token,
            namespace=names.SYSTEM_NAMESPACE,
        )
    for c in host_processes(layout, spec.ports, spec.node_lifecycle):
        supervisor.start(layout, c, ready_timeout=60)


def resolve_spec(layout: Layout, **overrides: Any) -> ClusterSpec:
    """The saved spec with the caller's explicit choices applied.

    A running cluster cannot move its ports: that would orphan the processes on the old ones.
    """
    saved = load_spec(layout)
    given = {k: v for k, v in overrides.items() if v is not None}
    spec = dataclasses.replace(saved or ClusterSpec(), **given)
    if saved and saved.port_offset != spec.port_offset and _any_running(layout, saved):
        raise RuntimeError(
            f"the cluster in {layout.root} runs with --port-offset {saved.port_offset}; "
            "run `pilotfish dev down` before changing it"
        )
    return spec


def _any_running(layout: Layout, spec: ClusterSpec) -> bool:
    comps = components.control_plane(layout, spec.ports, Path("/"))
    names_ = [c.name for c in comps] + [prometheus.NAME, *HOST_PROCESSES, *realnode.NAMES]
    return any(supervisor.running(layout, n) for n in names_)


def up(state: Path, spec: ClusterSpec | None = None) -> Layout:
    layout = Layout(state)
    spec = spec or resolve_spec(layout)
    saved = load_spec(layout)
    spec = dataclasses.replace(spec, settings=prometheus.merge_settings(spec.settings, os.environ))
    state.mkdir(parents=True, exist_ok=True)
    bins = binaries.bin_dir()
    _write_configs(layout, spec, bins)
    for c in components.control_plane(layout, spec.ports, bins, spec.node_lifecycle):
        log.info("starting", extra={"component": c.name})
        supervisor.start(layout, c, ready_timeout=120)
    api = api_client(layout)
    wait_for("the default ServiceAccount", lambda: _has_default_sa(api))
    _ensure_nodes(api, spec.nodes)
    wait_for(f"{spec.nodes} kwok nodes Ready", lambda: len(ready_nodes(api)) >= spec.nodes)
    start_usage_pipeline(layout, spec, bins, api)
    if spec.pilotfish:
        install_pilotfish(layout, spec, bins)
    if spec.real_node:
        realnode.start(layout, api, spec.port_offset, spec.ports.apiserver)
    if saved is not None and saved.node_lifecycle != spec.node_lifecycle:
        # What already ran healthy was left alone above, still in the old mode.
        _restart_for_mode(layout, spec, bins)
    return layout


def start_usage_pipeline(layout: Layout, spec: ClusterSpec, bins: Path, api: k8s.ApiClient) -> None:
    """kwok's emulated usage and kubelet-style metrics, and the Prometheus that scrapes them
    (before Pilotfish, whose operator is told where it is)."""
    kwokusage.install(api, binaries.kwok_crd_dir(bins), binaries.kwok_metrics_dir(bins))
    prometheus.ensure_rbac(api)
    running = supervisor.running(layout, prometheus.NAME)
    if running is not None:  # re-read the configuration and the chart's rules just rendered
        with suppress(ProcessLookupError):
            os.kill(running.pid, signal.SIGHUP)
    log.info("starting", extra={"component": prometheus.NAME})
    supervisor.start(layout, prometheus.component(layout, spec.ports, bins), ready_timeout=60)


def switch_node_lifecycle(layout: Layout, ports: Ports, mode: str) -> ClusterSpec:
    """Move a running local cluster to `mode` ("pilotfish" or "upstream"): restart
    kube-controller-manager with that mode's controllers and the operator with its
    PILOTFISH_NODE_LIFECYCLE, and save the mode, so a later `up` or a supervisor's restart
    keeps it. Nodes, pods and the rest of the control plane stay as they are (a benchmark
    measures both modes on one cluster)."""
    saved = load_spec(layout)
    if saved is None:
        raise RuntimeError(f"no local cluster in {layout.root} (run `pilotfish dev up`)")
    if saved.ports != ports:
        raise ValueError(
            f"ports: the cluster in {layout.root} runs with --port-offset {saved.port_offset}, "
            "not on the ports given"
        )
    spec = dataclasses.replace(saved, node_lifecycle=components.check_node_lifecycle(mode))
    layout.cluster_file.write_text(json.dumps(dataclasses.asdict(spec), indent=2) + "\n")
    _restart_for_mode(layout, spec, binaries.bin_dir())
    return spec


def _restart_for_mode(layout: Layout, spec: ClusterSpec, bins: Path) -> None:
    """Restart the two processes whose behaviour the node lifecycle mode sets."""
    kcm = next(
        c
        for c in components.control_plane(layout, spec.ports, bins, spec.node_lifecycle)
        if c.name == "kube-controller-manager"
    )
    restart = [kcm]
    if spec.pilotfish:
        hosts = host_processes(layout, spec.ports, spec.node_lifecycle)
        restart += [c for c in hosts if c.name == "pilotfish-operator"]
    for c in restart:
        log.info("restarting", extra={"component": c.name, "node_lifecycle": spec.node_lifecycle})
        supervisor.restart(layout, c)


def _has_default_sa(api: k8s.ApiClient) -> bool:
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    try:
        k8s.CoreV1Api(api).read_namespaced_service_account("default", "default")
    except ApiException:
        return False
    return True


def down(state: Path, purge: bool = False) -> list[str]:
    """Stop what `up` started, newest first; with `purge`, remove the state directory."""
    layout = Layout(state)
    spec = load_spec(layout) or ClusterSpec()
    order = [c.name for c in components.control_plane(layout, spec.ports, Path("/"))]
    stopped = realnode.stop(layout, spec.port_offset)
    stopped += [
        n
        for n in [*reversed(HOST_PROCESSES), prometheus.NAME, *reversed(order)]
        if supervisor.stop(layout, n)
    ]
    if purge and layout.cluster_file.exists():
        shutil.rmtree(state)
    return stopped


def status(state: Path) -> dict[str, Any]:
    layout = Layout(state)
    spec = load_spec(layout)
    if spec is None:
        return {"state": str(state), "up": False, "components": {}}
    comps = components.control_plane(layout, spec.ports, Path("/"))
    comps += monitoring(layout, Path("/"))
    if spec.pilotfish:
        comps += host_processes(layout, spec.ports)
    if spec.real_node:
        comps += realnode.node_components(layout, spec.port_offset, Path("/"))
    out: dict[str, Any] = {
        "state": str(state),
        "kubeconfig": str(layout.admin_kubeconfig),
        "nodeLifecycle": spec.node_lifecycle,
        "components": {},
    }
    for c in comps:
        proc = supervisor.running(layout, c.name)
        out["components"][c.name] = {
            "pid": proc.pid if proc else None,
            "healthy": bool(proc) and supervisor.healthy(c.health),
            "log": str(layout.log(c.name)),
        }
        if c.name in HOST_PROCESSES:  # the supervised child, restarted when it exits
            current = supervisor.child(layout, c.name)
            out["components"][c.name]["childPid"] = current.pid if current else None
    out["up"] = all(v["healthy"] for v in out["components"].values())
    if out["components"].get("kube-apiserver", {}).get("healthy"):
        out["readyNodes"] = len(ready_nodes(api_client(layout)))
    return out


def env_lines(state: Path) -> list[str]:
    """The shell line after which `kubectl` and `kubectl pilotfish` just work.

    KUBECONFIG is the cluster's admin kubeconfig; PATH gets the pinned binaries first (a
    system kubectl may be several minor versions behind the API server) and then this
    interpreter's bin directory, where pip put the `kubectl-pilotfish` plugin kubectl looks
    for on PATH.
    """
    dirs: list[str] = []
    with suppress(binaries.MissingBinaries):  # unbuilt: the plugin still is there
        dirs.append(str(binaries.bin_dir()))
    dirs.append(str(Path(sys.executable).parent))
    path = ":".join(shlex.quote(d) for d in dict.fromkeys(dirs))
    kubeconfig = shlex.quote(str(Layout(state).admin_kubeconfig))
    return [f"export KUBECONFIG={kubeconfig} PATH={path}:$PATH"]


@contextmanager
def running_cluster(state: Path, spec: ClusterSpec) -> Iterator[Layout]:
    """Bring a cluster up for the duration of a block (tests, benchmarks), then down."""
    try:
        yield up(state, spec)
    finally:
        down(state)
