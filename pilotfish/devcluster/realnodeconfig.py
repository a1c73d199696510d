"""The real node's files, rendered from the cluster's layout and port offset: containerd's
configuration, the bridge CNI network, the KubeletConfiguration and the kubelet's flags.

Pure, so unit tests read every setting without starting anything (`realnode` runs them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pilotfish import names, ports
from pilotfish.devcluster import oci
from pilotfish.devcluster.components import Layout

RUNC = "/usr/sbin/runc"
TAINT = {"key": names.LABEL_REAL_NODE, "value": "true", "effect": "NoSchedule"}
NETWORK = "pilotfish"


@dataclass(frozen=True)
class NodePorts:
    """The real node's TCP ports, shifted with the rest of the cluster's."""

    kubelet: int
    kubelet_healthz: int
    containerd_metrics: int


def node_ports(offset: int) -> NodePorts:
    return NodePorts(
        ports.KUBELET + offset, ports.KUBELET_HEALTHZ + offset, ports.CONTAINERD_METRICS + offset
    )


@dataclass(frozen=True)
class NodeLayout:
    """Where the real node keeps its files: under the cluster's state directory, so `down
    --purge` removes them with the rest."""

    root: Path

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd.toml"

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd-state"

    @property
    def socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "net.d"

    @property
    def cni_ipam(self) -> Path:
        return self.root / "cni-ipam"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet.yaml"

    @property
    def cert_dir(self) -> Path:
        return self.root / "pki"

    @property
    def kubeconfig(self) -> Path:
        """Written by the kubelet once its CSR is signed: its own identity."""
        return self.root / "kubelet.kubeconfig"

    @property
    def bootstrap_kubeconfig(self) -> Path:
        return self.root / "bootstrap.kubeconfig"

    @property
    def token_file(self) -> Path:
        return self.root / "bootstrap-token"


def node_layout(layout: Layout) -> NodeLayout:
    return NodeLayout(layout.root / "realnode")


def pod_cidr(offset: int) -> str:
    """A private /24 per cluster offset, away from kwok's 10.240.0.0/12 and the services'."""
    return f"10.88.{(offset // 100) % 256}.0/24"


def bridge_name(offset: int) -> str:
    return f"pfbr{offset}"[:15]  # an interface name has at most 15 characters


def containerd_config(nl: NodeLayout, np: NodePorts, cni_bin: Path) -> str:
    """containerd 1.6's configuration (version 2 format). Its socket, root and state are the
    cluster's own, so a containerd of the host (if any) is left alone; the CRI streaming
    server takes a free port rather than 10010; network namespaces live under the state
    directory, where `down` finds and unmounts them."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    lines = [
        "version = 2",
        f"root = {json.dumps(str(nl.containerd_root))}",
        f"state = {json.dumps(str(nl.containerd_state))}",
        "[grpc]",
        f"  address = {json.dumps(str(nl.socket))}",
        "[ttrpc]",
        f"  address = {json.dumps(str(nl.socket) + '.ttrpc')}",
        "[metrics]",
        f'  address = "127.0.0.1:{np.containerd_metrics}"',
        '[plugins."io.containerd.internal.v1.opt"]',
        f"  path = {json.dumps(str(nl.containerd_root / 'opt'))}",
        f"[{cri}]",
        f"  sandbox_image = {json.dumps(oci.PAUSE_REF)}",
        '  stream_server_address = "127.0.0.1"',
        '  stream_server_port = "0"',
        "  netns_mounts_under_state_dir = true",
        # A negative oom_score_adj (the sandbox's -998, a Guaranteed pod's -997) needs
        # CAP_SYS_RESOURCE, which root lacks on hosts like this one: runc's init then dies
        # and no sandbox starts. Clamped to containerd's own score instead.
        "  restrict_oom_score_adj = true",
        f"[{cri}.containerd]",
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        f"[{cri}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        f"[{cri}.containerd.runtimes.runc.options]",
        "  SystemdCgroup = false",
        f"  BinaryName = {json.dumps(RUNC)}",
        f"[{cri}.cni]",
        f"  bin_dir = {json.dumps(str(cni_bin))}",
        f"  conf_dir = {json.dumps(str(nl.cni_conf_dir))}",
    ]
    return "\n".join(lines) + "\n"


def cni_config(nl: NodeLayout, offset: int) -> dict[str, Any]:
    """A bridge on a private /24 with host-local addresses (kept under the state directory).
    No masquerading: pods talk to each other and to this host, nothing here needs the
    outside; portmap for hostPorts."""
    return {
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge_name(offset),
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr(offset)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(nl.cni_ipam),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(layout: Layout, nl: NodeLayout, np: NodePorts, offset: int) -> dict[str, Any]:
    """The KubeletConfiguration of the real node.

    `failCgroupV1: false`: kubelet 1.35+ refuses to start on a cgroup v1 host without it, and
    this host runs the v1 (hybrid) hierarchy. `cgroupfs`: there is no systemd here, and
    containerd 1.6 does not answer the CRI RuntimeConfig call kubelet 1.36 asks the driver
    from, so the kubelet falls back to this setting (containerd's runc is set the same way).
    Requests to the kubelet are authenticated and authorized by the API server (webhooks),
    anonymous ones refused. Image garbage collection is off: the pause and test images were
    imported, nothing could pull them back.
    """
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{nl.socket}",
        "port": np.kubelet,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": np.kubelet_healthz,
        "readOnlyPort": 0,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True, "cacheTTL": "30s"},
            "x509": {"clientCAFile": str(layout.pki.ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "rotateCertificates": True,
        "registerWithTaints": [TAINT],
        "podCIDR": pod_cidr(offset),
        "clusterDomain": "cluster.local",
        "failSwapOn": False,
        "maxPods": 30,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "2%",
            "imagefs.available": "2%",
        },
        "serializeImagePulls": False,
    }


def kubelet_argv(kubelet: Path, nl: NodeLayout, node_ip: str | None) -> tuple[str, ...]:
    return (
        str(kubelet),
        f"--config={nl.kubelet_config}",
        f"--bootstrap-kubeconfig={nl.bootstrap_kubeconfig}",
        f"--kubeconfig={nl.kubeconfig}",
        f"--cert-dir={nl.cert_dir}",
        f"--root-dir={nl.kubelet_root}",
        f"--hostname-override={names.REAL_NODE_NAME}",
        f"--node-labels={names.LABEL_REAL_NODE}=true",
        *((f"--node-ip={node_ip}",) if node_ip else ()),
        "--v=1",
    )


def containerd_argv(nl: NodeLayout) -> tuple[str, ...]:
    return ("/usr/bin/containerd", f"--config={nl.containerd_config}", "--log-level=warn")
