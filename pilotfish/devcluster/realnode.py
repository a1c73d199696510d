"""One real node beside the kwok fleet (`pilotfish dev up --real-node`): containerd with runc
and a kubelet, run as supervised host processes of the local cluster, with a bridge pod
network, images imported offline and the node's own TLS bootstrap identity.

The kubelet joins as a real one does: a bootstrap token (a Secret in kube-system) lets it
create a CSR, kube-controller-manager's csrapproving controller approves it (the token's
group may request node client certificates) and its csrsigning controller signs it with the
cluster CA, so the node talks to the API server as `system:node:<name>` and the Node
authorizer confines it to its own objects.

containerd is Debian's 1.6: kubelet 1.36 accepts it, falling back from the CRI
RuntimeConfig call (absent in 1.6) to its configured cgroup driver. Only one real node per
host: the kubelet's pod cgroups live at the fixed `/kubepods` of each hierarchy.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import string
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from pilotfish import names
from pilotfish.devcluster import binaries, components, oci, supervisor
from pilotfish.devcluster import kubeconfig as kcfg
from pilotfish.devcluster import realnodeconfig as rc
from pilotfish.devcluster.components import Component, Health, Layout

if TYPE_CHECKING:
    from kubernetes import client as k8s

log = logging.getLogger("pilotfish.dev")

CONTAINERD = "containerd"
KUBELET = "kubelet"
NAMES = (CONTAINERD, KUBELET)  # start order
CTR = "/usr/bin/ctr"
IMPORT_ATTEMPTS = 3
IMPORT_RETRY_SECONDS = 2.0
CRI_NAMESPACE = "k8s.io"
BOOTSTRAP_GROUP = "system:bootstrappers:pilotfish"
# Debian packages the node needs, by the file that shows each is installed.
PACKAGES = {
    "containerd": Path("/usr/bin/containerd"),
    "runc": Path(rc.RUNC),
    "iptables": Path("/usr/sbin/iptables"),  # the portmap plugin's
    "busybox-static": oci.BUSYBOX,
}
# Node client certificates: requested with the bootstrap token, renewed by the node itself.
BINDINGS = (
    ("pilotfish:node-bootstrapper", "system:node-bootstrapper", BOOTSTRAP_GROUP),
    (
        "pilotfish:node-autoapprove-bootstrap",
        "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
        BOOTSTRAP_GROUP,
    ),
    (
        "pilotfish:node-autoapprove-renewal",
        "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
        "system:nodes",
    ),
)


class RealNodeError(RuntimeError):
    """The real node could not be set up; the message says what and how to fix it."""


def node_bin_dir(build: bool = False) -> Path:
    """The node's binaries (bin/kubelet, bin/pause, cni/...): PILOTFISH_NODE_BIN_DIR, else
    `devcluster/build.sh node` (built when `build`, else only looked up)."""
    env = os.environ.get("PILOTFISH_NODE_BIN_DIR")
    if env:
        return Path(env)
    root = binaries.checkout_root()
    if root is None:
        raise RealNodeError("set PILOTFISH_NODE_BIN_DIR to the output of devcluster/build.sh node")
    script = root / "devcluster" / "build.sh"
    res = subprocess.run(
        [str(script), "node" if build else "--print-node"],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        raise RealNodeError(
            f"the real node's binaries are not built; run `{script} node`"
            + (f":\n{res.stderr[-2000:]}" if build else "")
        )
    return Path(res.stdout.strip().splitlines()[-1])


def ensure_packages() -> None:
    """Install the Debian packages the node runs on, only those missing."""
    missing = [pkg for pkg, path in PACKAGES.items() if not path.exists()]
    if not missing:
        return
    log.info("installing", extra={"packages": missing})
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(cmd, capture_output=True, env=env, check=False).returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True, env=env, check=False)
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if res.returncode != 0:
            raise RealNodeError(f"apt-get install {' '.join(missing)} failed:\n{res.stderr}")


def node_components(layout: Layout, offset: int, bins: Path) -> list[Component]:
    """containerd and the kubelet, each under `pilotfish dev supervise` (restarted when it
    exits). Stopping containerd leaves the containers running: each runc shim is in its
    own process group, outside the supervised unit's."""
    nl = rc.node_layout(layout)
    np = rc.node_ports(offset)
    parts = [
        Component(
            CONTAINERD,
            rc.containerd_argv(nl),
            Health(f"http://127.0.0.1:{np.containerd_metrics}/v1/metrics"),
            np.containerd_metrics,
        ),
        Component(
            KUBELET,
            rc.kubelet_argv(bins / "bin" / "kubelet", nl, components.advertise_address()),
            Health(f"http://127.0.0.1:{np.kubelet_healthz}/healthz"),
            np.kubelet_healthz,
        ),
    ]
    return [
        Component(c.name, supervisor.supervised(layout, c.name, c.argv), c.health, c.port, c.env)
        for c in parts
    ]


def write_configs(layout: Layout, offset: int, bins: Path) -> None:
    nl = rc.node_layout(layout)
    for d in (nl.root, nl.cni_conf_dir, nl.cni_ipam, nl.cert_dir, nl.kubelet_root):
        d.mkdir(parents=True, exist_ok=True)
    np = rc.node_ports(offset)
    nl.containerd_config.write_text(rc.containerd_config(nl, np, bins / "cni"))
    (nl.cni_conf_dir / "10-pilotfish.conflist").write_text(
        json.dumps(rc.cni_config(nl, offset), indent=2) + "\n"
    )
    nl.kubelet_config.write_text(yaml.safe_dump(rc.kubelet_config(layout, nl, np, offset)))


def bootstrap_token(layout: Layout) -> tuple[str, str]:
    """The node's bootstrap token (id, secret), made once per state directory."""
    path = rc.node_layout(layout).token_file
    if path.exists():
        token_id, secret = path.read_text().strip().split(".")
        return token_id, secret
    alphabet = string.ascii_lowercase + string.digits
    token_id = "".join(secrets.choice(alphabet) for _ in range(6))
    secret = "".join(secrets.choice(alphabet) for _ in range(16))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{token_id}.{secret}\n")
    path.chmod(0o600)
    return token_id, secret


def bootstrap_objects(token_id: str, secret: str) -> list[dict[str, Any]]:
    """The token Secret (authentication only, in the Pilotfish bootstrap group) and the
    bindings that let that group request node client certificates and have them approved."""
    objs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"bootstrap-token-{token_id}", "namespace": "kube-system"},
            "type": "bootstrap.kubernetes.io/token",
            "stringData": {
                "token-id": token_id,
                "token-secret": secret,
                "usage-bootstrap-authentication": "true",
                "auth-extra-groups": BOOTSTRAP_GROUP,
                "description": "pilotfish dev up --real-node",
            },
        }
    ]
    for name, role, group in BINDINGS:
        objs.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}
                ],
            }
        )
    return objs


def ensure_bootstrap(api: k8s.ApiClient, layout: Layout, apiserver_port: int) -> None:
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    token_id, secret = bootstrap_token(layout)
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    for obj in bootstrap_objects(token_id, secret):
        try:
            if obj["kind"] == "Secret":
                core.create_namespaced_secret("kube-system", obj)
            else:
                rbac.create_cluster_role_binding(obj)
        except ApiException as e:
            if e.status != 409:
                raise
    kcfg.write(
        rc.node_layout(layout).bootstrap_kubeconfig,
        f"https://127.0.0.1:{apiserver_port}",
        layout.pki.ca_cert,
        f"system:bootstrap:{token_id}",
        token=f"{token_id}.{secret}",
    )


def ctr(layout: Layout, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """containerd's own CLI against the node's containerd, in the CRI's namespace."""
    sock = rc.node_layout(layout).socket
    res = subprocess.run(
        [CTR, "--address", str(sock), "--namespace", CRI_NAMESPACE, *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if check and res.returncode != 0:
        raise RealNodeError(f"ctr {' '.join(args[:2])} failed: {res.stderr.strip()}")
    return res


def import_image(layout: Layout, archive: Path, ref: str) -> None:
    """Import an OCI archive into the node's runtime as `ref` (unpacked, so a pod with
    imagePullPolicy IfNotPresent or Never starts from it without any registry)."""
    if not archive.is_file():
        raise RealNodeError(f"import_image: archive {archive} is not a file")
    if supervisor.running(layout, CONTAINERD) is None:
        raise RealNodeError("import_image: the real node's containerd is not running")
    # containerd 1.6 fails a re-import of other content under an existing --index-name
    # ("content digest ... not found"): the name goes first (running containers keep their
    # snapshots). A containerd that has just started failed the same way once in a few
    # dozen fresh nodes (the pause image, `make test`), and the same import a minute later
    # succeeded: so once more, after a pause, before giving up.
    for attempt in range(IMPORT_ATTEMPTS):
        ctr(layout, "images", "rm", ref, check=False)
        res = ctr(layout, "images", "import", "--index-name", ref, str(archive), check=False)
        if res.returncode == 0:
            return
        if "not found" not in res.stderr or attempt == IMPORT_ATTEMPTS - 1:
            raise RealNodeError(f"ctr images import failed: {res.stderr.strip()}")
        log.warning("image import failed; again", extra={"ref": ref, "error": res.stderr[:300]})
        time.sleep(IMPORT_RETRY_SECONDS)


def start(layout: Layout, api: k8s.ApiClient, offset: int, apiserver_port: int) -> None:
    """Bring the real node up (idempotent) and wait until it is Ready."""
    if os.geteuid() != 0:
        raise RealNodeError(
            "--real-node needs root: the kubelet and containerd manage cgroups, mounts and "
            "network namespaces"
        )
    ensure_packages()
    bins = node_bin_dir(build=True)
    write_configs(layout, offset, bins)
    containerd, kubelet = node_components(layout, offset, bins)
    log.info("starting", extra={"component": CONTAINERD})
    supervisor.start(layout, containerd, ready_timeout=60)
    import_image(layout, oci.pause_image(bins / "bin" / "pause"), oci.PAUSE_REF)
    import_image(layout, oci.busybox_image(), oci.BUSYBOX_REF)
    ensure_bootstrap(api, layout, apiserver_port)
    log.info("starting", extra={"component": KUBELET})
    supervisor.start(layout, kubelet, ready_timeout=120)
    deadline = time.monotonic() + 120
    while not node_ready(api):
        if time.monotonic() > deadline:
            raise RealNodeError(
                f"node {names.REAL_NODE_NAME} not Ready after 120s; log {layout.log(KUBELET)}:\n"
                + supervisor.log_tail(layout, KUBELET)
            )
        time.sleep(0.5)


def node_ready(api: k8s.ApiClient) -> bool:
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    try:
        node = k8s.CoreV1Api(api).read_node(names.REAL_NODE_NAME)
    except ApiException:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def stop(layout: Layout, offset: int = 0) -> list[str]:
    """Stop the kubelet, end every container of the node, stop containerd and release what
    they leave on the host (mounts, the bridge, address leases). The pods stay in the API:
    the next `up` runs them again, in new containers."""
    stopped = [KUBELET] if supervisor.stop(layout, KUBELET) else []
    if supervisor.running(layout, CONTAINERD) is not None:
        _kill_containers(layout)
    if supervisor.stop(layout, CONTAINERD):
        stopped.append(CONTAINERD)
    nl = rc.node_layout(layout)
    if nl.root.exists():
        _unmount_under(nl.root)
        shutil.rmtree(nl.cni_ipam, ignore_errors=True)
        subprocess.run(
            ["ip", "link", "delete", rc.bridge_name(offset)], capture_output=True, check=False
        )
    return stopped


def _kill_containers(layout: Layout) -> None:
    tasks = ctr(layout, "tasks", "ls", "--quiet", check=False).stdout.split()
    for task in tasks:
        ctr(layout, "tasks", "kill", "--signal", "SIGKILL", task, check=False)
    for task in tasks:
        for _ in range(50):
            if ctr(layout, "tasks", "delete", task, check=False).returncode == 0:
                break
            time.sleep(0.1)
    for container in ctr(layout, "containers", "ls", "--quiet", check=False).stdout.split():
        ctr(layout, "containers", "delete", container, check=False)


def _unmount_under(root: Path) -> None:
    """Unmount everything below `root`, deepest first (overlay roots, netns, pod tmpfs)."""
    prefix = str(root.resolve()) + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point.startswith(prefix):
            points.append(point)
    for point in sorted(set(points), key=len, reverse=True):
        if subprocess.run(["umount", point], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
