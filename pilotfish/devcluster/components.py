"""What each process of the local control plane is: its command line, config and health URL.

Pure: from a state-directory layout, the ports and the binaries' directory to process specs
and config documents. `supervisor` starts them; tests read them without starting anything.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pilotfish import names, ports
from pilotfish.devcluster import kwokusage, stages
from pilotfish.devcluster.pki import Pki

SERVICE_CIDR = "10.96.0.0/16"
# Who notices a silent machine (`pilotfish.nodesilence.MODES`, spelled out here so the CLI
# does not import the runtime). "pilotfish": upstream's node lifecycle and taint eviction
# controllers are off and Pilotfish's `nodelifecycle` controller marks, taints and evicts.
# "upstream": both run at upstream's defaults (in v1.36: --node-monitor-grace-period 50s,
# and the 300 s DefaultTolerationSeconds, which Pilotfish's webhook shortens), as on a managed
# cluster where they cannot be turned off; Pilotfish owns only the at-most-one release and
# the brake's report there.
NODE_LIFECYCLE_PILOTFISH = "pilotfish"
NODE_LIFECYCLE_UPSTREAM = "upstream"
NODE_LIFECYCLE_MODES = (NODE_LIFECYCLE_PILOTFISH, NODE_LIFECYCLE_UPSTREAM)
# kube-controller-manager's --controllers per mode. Both controllers go in pilotfish mode: the
# taint eviction controller alone would still evict every pod that does not tolerate the
# unreachable NoExecute taint Pilotfish itself puts on a lost node.
CONTROLLERS = {
    NODE_LIFECYCLE_PILOTFISH: "*,-node-lifecycle-controller,-taint-eviction-controller",
    NODE_LIFECYCLE_UPSTREAM: "*",
}
# Upstream's stages; batch tasks end by Pilotfish's own (`stages.pod_stages`), not by
# upstream's pod-complete, which ends every Job pod at once.
KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-delete.yaml",
)
# How long a fake node's lease lasts; kwok renews it at a fraction of this.
NODE_LEASE_SECONDS = 40
# kwok renews every node's lease from a fixed pool of workers, each lease every quarter of
# its duration: 1,000 nodes need 100 renewals a second, 25 from each of 4 workers at 40 ms a
# round trip, which a loaded API server does not give. In the 1,000-node scale run every
# lease lapsed past 40 s within a minute, and Pilotfish rightly took all three zones for
# silent (zone brake engaged, 4,643 "node unreachable" in 10 minutes). A kubelet renews its
# own lease; one worker per this many nodes keeps each at 2.5 renewals a second.
NODES_PER_LEASE_WORKER = 25


@dataclass(frozen=True)
class Ports:
    etcd_client: int = ports.ETCD_CLIENT
    etcd_peer: int = ports.ETCD_PEER
    apiserver: int = ports.APISERVER
    controller_manager: int = ports.CONTROLLER_MANAGER
    scheduler: int = ports.SCHEDULER
    kwok: int = ports.KWOK
    extender: int = ports.EXTENDER
    webhooks: int = ports.WEBHOOKS
    operator_metrics: int = ports.OPERATOR_METRICS
    prometheus: int = ports.PROMETHEUS

    def shifted(self, offset: int) -> Ports:
        """The same ports moved by `offset`, so two clusters can run side by side."""
        return Ports(**{f.name: getattr(self, f.name) + offset for f in dataclasses.fields(self)})


@dataclass(frozen=True)
class Layout:
    """Where one local cluster keeps its files."""

    root: Path

    @property
    def pki(self) -> Pki:
        return Pki(self.root / "pki")

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd-data"

    @property
    def config(self) -> Path:
        return self.root / "config"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def cluster_file(self) -> Path:
        return self.root / "cluster.json"

    def kubeconfig(self, identity: str) -> Path:
        return self.root / "kubeconfigs" / f"{identity}.yaml"

    @property
    def admission_config(self) -> Path:
        return self.config / "admission.yaml"

    @property
    def webhook_kubeconfig(self) -> Path:
        return self.config / "webhook-client.kubeconfig"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    def pidfile(self, component: str) -> Path:
        return self.run / f"{component}.pid"


@dataclass(frozen=True)
class Health:
    """How to ask a component whether it is ready: an HTTP(S) GET that must answer 200."""

    url: str
    ca: Path | None = None  # verify the server against this CA; None with https: do not verify
    client_cert: Path | None = None
    client_key: Path | None = None


@dataclass(frozen=True)
class Component:
    name: str
    argv: tuple[str, ...]
    health: Health
    port: int
    # Set in the process's environment on top of the starting process's own (the supervised
    # child inherits them from its supervisor, so a restart keeps them).
    env: tuple[tuple[str, str], ...] = ()


def check_node_lifecycle(mode: str) -> str:
    if mode not in NODE_LIFECYCLE_MODES:
        raise ValueError(
            f"node lifecycle {mode!r}: must be one of {', '.join(NODE_LIFECYCLE_MODES)}"
        )
    return mode


def advertise_address() -> str | None:
    """A non-loopback IPv4 of this host; kube-apiserver refuses to advertise loopback."""
    try:
        out = subprocess.run(
            ["ip", "-4", "-o", "addr", "show", "scope", "global"],
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            return fields[fields.index("inet") + 1].split("/")[0]
    return None


# GPUs are counted by the extender, not by kube-scheduler's resource fit, so a pod that finds
# no GPUs is told where and how many there are ("no node in zone-b has 8 free GPUs ...").
# Not ignorable: while the extender is down GPU pods wait rather than overcommit GPUs.
GPU_EXTENDER: dict[str, Any] = {
    "filterVerb": "filter",
    "nodeCacheCapable": True,
    "enableHTTPS": True,
    "httpTimeout": "5s",
    "ignorable": False,
    "managedResources": [{"name": "nvidia.com/gpu", "ignoredByScheduler": True}],
}


def extender_tls(layout: Layout) -> dict[str, Any]:
    """The extender's tlsConfig: verify its serving certificate against the local CA and
    present kube-scheduler's own client certificate, the one the extender requires."""
    pki = layout.pki
    return {
        "caFile": str(pki.ca_cert),
        "certFile": str(pki.cert("kube-scheduler")),
        "keyFile": str(pki.key("kube-scheduler")),
    }


def scheduler_config(layout: Layout, p: Ports) -> dict[str, Any]:
    """KubeSchedulerConfiguration: the default profile and Pilotfish's, both through the extender.

    `ignorable: true`: when the extender is down, kube-scheduler keeps placing pods with its
    own plugins instead of stalling every pod in the cluster; priorities still keep batch from
    preempting production. The extender is called over HTTPS with a client certificate.
    """
    url = f"https://127.0.0.1:{p.extender}"
    tls = extender_tls(layout)
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {
            "kubeconfig": str(layout.kubeconfig("kube-scheduler")),
            "qps": 500,
            "burst": 1000,
        },
        "leaderElection": {"leaderElect": False},
        "profiles": [
            {"schedulerName": "default-scheduler"},
            {"schedulerName": names.SCHEDULER_NAME},
        ],
        "extenders": [
            {
                "urlPrefix": url,
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "preemptVerb": "preempt",
                "weight": 5,
                "nodeCacheCapable": True,
                "enableHTTPS": True,
                "tlsConfig": tls,
                "httpTimeout": "5s",
                "ignorable": True,
            },
            GPU_EXTENDER | {"urlPrefix": url, "tlsConfig": tls},
        ],
    }


def webhook_kubeconfig(layout: Layout, p: Ports) -> dict[str, Any]:
    """Credentials kube-apiserver presents to webhooks, by the webhook's host:port.

    For a webhook called by URL the API server looks the user up by the URL's host:port,
    so only the local webhooks get the certificate.
    """
    pki = layout.pki
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "users": [
            {
                "name": f"127.0.0.1:{p.webhooks}",
                "user": {
                    "client-certificate": str(pki.cert("webhook-client")),
                    "client-key": str(pki.key("webhook-client")),
                },
            }
        ],
    }


def admission_config(layout: Layout) -> dict[str, Any]:
    """AdmissionConfiguration pointing both webhook plugins at `webhook_kubeconfig`."""
    return {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [
            {
                "name": plugin,
                "configuration": {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "WebhookAdmissionConfiguration",
                    "kubeConfigFile": str(layout.webhook_kubeconfig),
                },
            }
            for plugin in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
        ],
    }


def kwok_options(p: Ports, nodes: int = 0) -> dict[str, Any]:
    """kwok's options: which nodes it plays, how fast, where it serves kubelet endpoints;
    `nodes`: how many the cluster starts with (its lease workers follow)."""
    return {
        "manageAllNodes": False,
        "manageNodesWithLabelSelector": f"{names.LABEL_FAKE_NODE}=true",
        "nodeLeaseDurationSeconds": NODE_LEASE_SECONDS,
        # A partial options document leaves these at 0, which kwok refuses.
        "nodeLeaseParallelism": max(4, math.ceil(nodes / NODES_PER_LEASE_WORKER)),
        "nodePlayStageParallelism": 4,
        "podPlayStageParallelism": 8,
        "podsOnNodeSyncParallelism": 4,
        "serverAddress": f"127.0.0.1:{p.kwok}",
        "cidr": "10.240.0.0/12",
        "nodeIP": "10.250.0.1",
        # Usage emulation and kubelet-style metrics, from objects in the API
        # (`kwokusage`), which `up` creates once the API server answers.
        "enableCRDs": list(kwokusage.CRDS),
    }


def kwok_config(stage_dir: Path, p: Ports, nodes: int = 0) -> list[dict[str, Any]]:
    """kwok's configuration documents: options plus the stages that play kubelets.

    kwok v0.8 has no built-in stages; the upstream stage documents ship beside the binary,
    and Pilotfish's task stages follow them.
    """
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokConfiguration",
            "options": kwok_options(p, nodes),
        }
    ]
    for rel in KWOK_STAGES:
        docs.extend(d for d in yaml.safe_load_all((stage_dir / rel).read_text()) if d)
    docs.extend(stages.pod_stages())
    return docs


def control_plane(
    layout: Layout, p: Ports, bin_dir: Path, node_lifecycle: str = NODE_LIFECYCLE_PILOTFISH
) -> list[Component]:
    """The processes of the local control plane in start order; `node_lifecycle` decides
    kube-controller-manager's controllers (`CONTROLLERS`)."""
    controllers = CONTROLLERS[check_node_lifecycle(node_lifecycle)]
    pki = layout.pki
    cfg = layout.config
    apiserver = f"https://127.0.0.1:{p.apiserver}"
    admin = Health(
        f"{apiserver}/readyz",
        ca=pki.ca_cert,
        client_cert=pki.cert("admin"),
        client_key=pki.key("admin"),
    )
    advertise = advertise_address()
    etcd = Component(
        "etcd",
        (
            str(bin_dir / "etcd"),
            "--name=pilotfish",
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls=http://127.0.0.1:{p.etcd_client}",
            f"--advertise-client-urls=http://127.0.0.1:{p.etcd_client}",
            f"--listen-peer-urls=http://127.0.0.1:{p.etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{p.etcd_peer}",
            f"--initial-cluster=pilotfish=http://127.0.0.1:{p.etcd_peer}",
            "--unsafe-no-fsync",
            "--quota-backend-bytes=8589934592",
            "--log-level=warn",
        ),
        Health(f"http://127.0.0.1:{p.etcd_client}/health"),
        p.etcd_client,
    )
    kube_apiserver = Component(
        "kube-apiserver",
        (
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{p.etcd_client}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p.apiserver}",
            *((f"--advertise-address={advertise}",) if advertise else ()),
            f"--tls-cert-file={pki.cert('apiserver')}",
            f"--tls-private-key-file={pki.key('apiserver')}",
            f"--client-ca-file={pki.ca_cert}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            # The real node's TLS bootstrap (`realnode`); tokens exist only when it is on.
            "--enable-bootstrap-token-auth=true",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=none",
            # Webhook Services by their endpoints: there is no kube-proxy (`incluster`).
            "--enable-aggregator-routing=true",
            f"--audit-policy-file={cfg / 'audit-policy.yaml'}",
            f"--admission-control-config-file={layout.admission_config}",
            f"--audit-log-path={layout.logs / 'audit.log'}",
            "--audit-log-maxsize=200",
            "--audit-log-maxbackup=2",
            # API Priority and Fairness, as on real clusters (the default, said out loud: the
            # chart's FlowSchemas divide these seats between the priority levels). 600 seats,
            # Kubernetes' defaults: sized for two cores, so a tenant's flood is held to its
            # level's share instead of every request getting a seat and the CPU deciding
            # (api_fairness: 2,400 seats queued nothing).
            "--enable-priority-and-fairness=true",
            "--max-requests-inflight=400",
            "--max-mutating-requests-inflight=200",
            "--profiling=false",
            "--v=1",
        ),
        admin,
        p.apiserver,
    )
    kcm = Component(
        "kube-controller-manager",
        (
            str(bin_dir / "kube-controller-manager"),
            f"--kubeconfig={layout.kubeconfig('kube-controller-manager')}",
            f"--authentication-kubeconfig={layout.kubeconfig('kube-controller-manager')}",
            f"--authorization-kubeconfig={layout.kubeconfig('kube-controller-manager')}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p.controller_manager}",
            "--leader-elect=false",
            f"--controllers={controllers}",
            f"--root-ca-file={pki.ca_cert}",
            f"--service-account-private-key-file={pki.sa_key}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={pki.ca_cert}",
            f"--cluster-signing-key-file={pki.ca_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--concurrent-endpoint-syncs=10",
            "--v=1",
        ),
        Health(f"https://127.0.0.1:{p.controller_manager}/healthz"),
        p.controller_manager,
    )
    scheduler = Component(
        "kube-scheduler",
        (
            str(bin_dir / "kube-scheduler"),
            f"--config={cfg / 'scheduler.yaml'}",
            f"--authentication-kubeconfig={layout.kubeconfig('kube-scheduler')}",
            f"--authorization-kubeconfig={layout.kubeconfig('kube-scheduler')}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p.scheduler}",
            "--v=1",
        ),
        Health(f"https://127.0.0.1:{p.scheduler}/healthz"),
        p.scheduler,
    )
    kwok = Component(
        "kwok",
        (
            str(bin_dir / "kwok"),
            f"--kubeconfig={layout.kubeconfig('kwok')}",
            f"--config={cfg / 'kwok.yaml'}",
            # Errors only: kwok warns "pods not found" for every emulated metric of every
            # node on every scrape, 250 lines a second at 1,000 nodes (53 MB in 23 minutes
            # of the scale run), which a starved kwok then spends its CPU writing.
            "--v=ERROR",
        ),
        Health(f"http://127.0.0.1:{p.kwok}/healthz"),
        p.kwok,
    )
    return [etcd, kube_apiserver, kcm, scheduler, kwok]


AUDIT_POLICY: dict[str, Any] = {
    # Metadata for Pilotfish's own API and for pod changes: who released a gate and when.
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "None",
            "users": ["system:kube-scheduler", "system:kube-controller-manager"],
            "verbs": ["get", "list", "watch"],
        },
        # The operator's lists and watches (per list page and watch, never per object): which
        # watches it holds, by resource and selector, is read from here (operator_memory).
        {
            "level": "Metadata",
            "users": [f"system:serviceaccount:{names.SYSTEM_NAMESPACE}:{names.SA_OPERATOR}"],
            "verbs": ["list", "watch"],
        },
        {"level": "None", "verbs": ["get", "list", "watch"]},
        {"level": "None", "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
        {
            "level": "None",
            "resources": [
                {"group": "", "resources": ["events"]},
                {"group": "events.k8s.io", "resources": ["events"]},
            ],
        },
        {"level": "Metadata", "resources": [{"group": "pilotfish.io"}]},
        # Jobs and their status, so the built-in Job controller's writes can be set beside a
        # BatchWorkload's (benchmarks/batch_job).
        {
            "level": "Metadata",
            "resources": [{"group": "batch", "resources": ["jobs", "jobs/status"]}],
        },
        {
            "level": "Metadata",
            "resources": [
                {
                    "group": "",
                    "resources": ["pods", "pods/status", "pods/binding", "pods/eviction", "nodes"],
                }
            ],
        },
        {"level": "None"},
    ],
}
