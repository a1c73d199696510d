"""Pilotfish's chart in its in-cluster mode on the local cluster's real node: the operator,
extender and webhooks as pods from the image built here (`image.build_image`), imported into
the node's containerd, with no host process of Pilotfish beside them (the cluster is brought
up with `pilotfish dev up --bare --real-node`).

The local control plane has no kube-proxy and no cluster DNS, which a real cluster has; two
routes stand in for them:
- the API server calls the webhooks through their Service by the Service's endpoints
  (kube-apiserver `--enable-aggregator-routing=true`), and the host routes the pod network to
  the node's bridge directly;
- pods reach the API server at the `kubernetes` Service (KUBERNETES_SERVICE_HOST, set by the
  kubelet; its certificate names 10.96.0.1) through one DNAT rule on the bridge to the API
  server's loopback listener (`route_localnet` on the bridge only). The API server keeps
  listening on 127.0.0.1 alone, so nothing outside this host's pod network reaches it.
The second scheduler is left out (scheduler.replicas=0): it reaches the extender by the name
`pilotfish-extender.<namespace>.svc`, which nothing resolves without cluster DNS.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Final

from pilotfish import names
from pilotfish.devcluster import binaries, realnode
from pilotfish.devcluster import realnodeconfig as rc
from pilotfish.devcluster.components import Layout

if TYPE_CHECKING:
    from kubernetes import client as k8s

RELEASE: Final = "pilotfish"
IPTABLES: Final = "/usr/sbin/iptables"
ROUTE_COMMENT: Final = "pilotfish: kubernetes Service to the local API server"
ON_REAL_NODE_SELECTOR: Final = {names.LABEL_REAL_NODE: "true"}
# The not-ready NoSchedule taint the kubelet registers with is lifted by the node lifecycle
# controller, which is the operator's own in `nodeLifecycle.mode=pilotfish`: its pod must land
# before anyone lifts it.
ON_REAL_NODE_TOLERATIONS: Final = [
    {"key": names.LABEL_REAL_NODE, "operator": "Equal", "value": "true", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"},
]


class InClusterError(RuntimeError):
    """The in-cluster install could not be done; the message says what failed."""


def install_args(image_ref: str) -> list[str]:
    """`helm install` flags of the in-cluster mode on the real node (the README's, verbatim):
    the image imported offline (never pulled), one replica each, every pod on the real node."""
    repository, _, tag = image_ref.rpartition(":")
    return [
        "--set",
        "local.enabled=false",
        "--set",
        f"image.repository={repository}",
        "--set",
        f"image.tag={tag}",
        "--set",
        "image.pullPolicy=Never",
        "--set",
        "operator.replicas=1",
        "--set",
        "extender.replicas=1",
        "--set",
        "webhooks.replicas=1",
        "--set",
        "scheduler.replicas=0",
        "--set",
        "nodeLifecycle.mode=pilotfish",
        "--set-json",
        "nodeSelector=" + json.dumps(ON_REAL_NODE_SELECTOR, separators=(",", ":")),
        "--set-json",
        "tolerations=" + json.dumps(ON_REAL_NODE_TOLERATIONS, separators=(",", ":")),
    ]


def api_route_rule(bridge: str, service_ip: str, apiserver_port: int) -> list[str]:
    """The nat PREROUTING rule that takes pods' `kubernetes` Service traffic to the API server."""
    return [
        "-i",
        bridge,
        "-d",
        f"{service_ip}/32",
        "-p",
        "tcp",
        "--dport",
        "443",
        "-m",
        "comment",
        "--comment",
        ROUTE_COMMENT,
        "-j",
        "DNAT",
        "--to-destination",
        f"127.0.0.1:{apiserver_port}",
    ]


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and res.returncode != 0:
        raise InClusterError(f"{' '.join(argv)} failed: {res.stderr.strip()}")
    return res


def ensure_api_route(api: k8s.ApiClient, offset: int, apiserver_port: int) -> None:
    """Route the real node's pods to the API server (idempotent). The bridge is made here if
    the CNI plugin has not made it yet (the plugin takes an existing bridge as it is), so its
    `route_localnet` can be set before any pod starts."""
    from kubernetes import client as k8s

    bridge = rc.bridge_name(offset)
    if _run("ip", "link", "show", bridge, check=False).returncode != 0:
        _run("ip", "link", "add", "name", bridge, "type", "bridge")
    _run("ip", "link", "set", bridge, "up")
    Path(f"/proc/sys/net/ipv4/conf/{bridge}/route_localnet").write_text("1\n")
    svc = k8s.CoreV1Api(api).read_namespaced_service("kubernetes", "default")
    rule = api_route_rule(bridge, str(svc.spec.cluster_ip), apiserver_port)
    if _run(IPTABLES, "-t", "nat", "-C", "PREROUTING", *rule, check=False).returncode != 0:
        _run(IPTABLES, "-t", "nat", "-A", "PREROUTING", *rule)


def remove_api_route(offset: int) -> None:
    """Delete this cluster's API route rules (those on its bridge with the route's comment);
    the bridge itself goes with the real node (`realnode.stop`)."""
    bridge = rc.bridge_name(offset)
    for line in _run(IPTABLES, "-t", "nat", "-S", "PREROUTING").stdout.splitlines():
        if f"-i {bridge} " in line and ROUTE_COMMENT in line and line.startswith("-A "):
            _run(IPTABLES, "-t", "nat", "-D", *shlex.split(line)[1:], check=False)


def import_images(layout: Layout) -> str:
    """Build (or find cached) the Pilotfish image and import it into the real node; its ref."""
    from pilotfish.devcluster import image

    archive = image.build_image()
    realnode.import_image(layout, archive, image.IMAGE_REF)
    return image.IMAGE_REF


def helm(
    layout: Layout, bins: Path, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    cmd = [str(binaries.helm(bins)), "--kubeconfig", str(layout.admin_kubeconfig), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check and res.returncode != 0:
        raise InClusterError(f"helm {' '.join(args[:2])} failed:\n{res.stderr.strip()}")
    return res


def install(
    layout: Layout, api: k8s.ApiClient, offset: int, apiserver_port: int, chart: Path
) -> str:
    """Route, import and `helm install --wait` (idempotent: upgrade --install); the image ref."""
    if not realnode.node_ready(api):
        raise InClusterError(
            f"node {names.REAL_NODE_NAME} is not Ready: run `pilotfish dev up --bare --real-node`"
        )
    ensure_api_route(api, offset, apiserver_port)
    ref = import_images(layout)
    helm(
        layout,
        binaries.bin_dir(),
        "upgrade",
        "--install",
        RELEASE,
        str(chart),
        "--namespace",
        names.SYSTEM_NAMESPACE,
        "--create-namespace",
        *install_args(ref),
        "--wait",
        "--timeout",
        "5m",
    )
    return ref
