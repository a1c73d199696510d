"""Pilotfish's own parts (and the local Prometheus) as host processes of a local cluster:
their command lines, health probes and environment, from the saved cluster spec."""

from __future__ import annotations

import dataclasses
import socket
import sys
from pathlib import Path

from pilotfish import names
from pilotfish.devcluster import binaries, components, pki, prometheus, supervisor
from pilotfish.devcluster.components import Component, Health, Layout, Ports
from pilotfish.devcluster.spec import ClusterSpec, load_spec

HOST_PROCESSES = ("pilotfish-extender", "pilotfish-webhooks", "pilotfish-operator")


def monitoring(layout: Layout, bins: Path | None = None) -> list[Component]:
    """The local Prometheus, on the saved cluster's ports (the binary's path matters only to
    start it: `bins` None is the built binaries, or a placeholder when they are absent)."""
    spec = load_spec(layout) or ClusterSpec()
    if bins is None:
        try:
            bins = binaries.bin_dir()
        except binaries.MissingBinaries:
            bins = Path("/")
    return [prometheus.component(layout, spec.ports, bins)]


def _probe(url: str, pk: pki.Pki) -> Health:
    """Health of a host process that requires client certificates: present the probe's."""
    return Health(
        url, ca=pk.ca_cert, client_cert=pk.cert("local-probe"), client_key=pk.key("local-probe")
    )


def operator_env(
    node_lifecycle: str, p: Ports | None = None, settings: tuple[tuple[str, str], ...] = ()
) -> tuple[tuple[str, str], ...]:
    """The operator's mode, always said out loud: a PILOTFISH_NODE_LIFECYCLE left in the shell
    that ran `up` must not make the operator disagree with kube-controller-manager. With the
    ports, also where the local Prometheus is and the cluster's reclaim settings."""
    mode = (("PILOTFISH_NODE_LIFECYCLE", components.check_node_lifecycle(node_lifecycle)),)
    return mode + (prometheus.operator_env(p, settings) if p is not None else ())


def host_processes(layout: Layout, p: Ports, node_lifecycle: str | None = None) -> list[Component]:
    """Pilotfish's own parts as host processes, each with its chart ServiceAccount's token,
    each under `pilotfish dev supervise` so that it is restarted whenever it exits, and each
    listening on loopback only. `node_lifecycle` None: the mode saved in the state directory,
    so whoever restarts the operator (a test, a benchmark) keeps the cluster's mode."""
    saved = load_spec(layout)
    if node_lifecycle is None:
        node_lifecycle = saved.node_lifecycle if saved else components.NODE_LIFECYCLE_PILOTFISH
    settings = saved.settings if saved else ()
    py = sys.executable
    pk = layout.pki
    parts = [
        Component(
            "pilotfish-extender",
            (
                py,
                "-m",
                "pilotfish.cli.main",
                "extender",
                "--host",
                "127.0.0.1",
                "--port",
                str(p.extender),
                "--kubeconfig",
                str(layout.kubeconfig("extender")),
                "--cert",
                str(pk.cert("extender")),
                "--key",
                str(pk.key("extender")),
                "--client-ca",
                str(pk.ca_cert),
            ),
            _probe(f"https://127.0.0.1:{p.extender}/healthz", pk),
            p.extender,
        ),
        Component(
            "pilotfish-webhooks",
            (
                py,
                "-m",
                "pilotfish.cli.main",
                "webhooks",
                "--host",
                "127.0.0.1",
                "--port",
                str(p.webhooks),
                "--cert",
                str(pk.cert("webhooks")),
                "--key",
                str(pk.key("webhooks")),
                "--client-ca",
                str(pk.ca_cert),
                "--kubeconfig",
                str(layout.kubeconfig("webhooks")),
                "--scheduler-name",
                names.SCHEDULER_NAME,
            ),
            _probe(f"https://127.0.0.1:{p.webhooks}/healthz", pk),
            p.webhooks,
        ),
        Component(
            "pilotfish-operator",
            (
                py,
                "-m",
                "pilotfish.cli.main",
                "operator",
                "--metrics-host",
                "127.0.0.1",
                "--metrics-port",
                str(p.operator_metrics),
                # Stable across restarts: a restarted operator resumes its own lease.
                "--identity",
                f"{socket.gethostname()}-local",
                "--kubeconfig",
                str(layout.kubeconfig("operator")),
                "--audit-log",
                str(layout.logs / "gates-audit.jsonl"),
                # Batch writes as the chart's pilotfish-batch (API Priority and Fairness).
                "--batch-account",
                names.SA_BATCH,
            ),
            Health(f"http://127.0.0.1:{p.operator_metrics}/healthz"),
            p.operator_metrics,
            env=operator_env(node_lifecycle, p, settings),
        ),
    ]
    return [
        dataclasses.replace(c, argv=supervisor.supervised(layout, c.name, c.argv)) for c in parts
    ]
