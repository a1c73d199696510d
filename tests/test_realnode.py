"""The real node's rendered configuration: what the kubelet, containerd and the CNI bridge are
told, and the bootstrap objects and images they start from. Nothing is started."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest

from pilotfish import names, ports
from pilotfish.devcluster import components, oci, realnode, supervisor
from pilotfish.devcluster import realnodeconfig as rc
from pilotfish.devcluster.components import Layout
from pilotfish.devcluster.spec import ClusterSpec, load_spec

OFFSET = 2000


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(tmp_path)


def test_kubelet_runs_on_cgroup_v1_with_cgroupfs_and_shifted_ports(layout: Layout) -> None:
    nl = rc.node_layout(layout)
    cfg = rc.kubelet_config(layout, nl, rc.node_ports(OFFSET), OFFSET)
    assert cfg["failCgroupV1"] is False  # kubelet 1.35+ refuses cgroup v1 without it
    assert cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["port"] == ports.KUBELET + OFFSET
    assert cfg["healthzPort"] == ports.KUBELET_HEALTHZ + OFFSET
    assert cfg["readOnlyPort"] == 0
    assert cfg["containerRuntimeEndpoint"] == f"unix://{nl.socket}"
    assert str(nl.socket).startswith(str(layout.root))


def test_kubelet_api_is_authorized_by_the_api_server(layout: Layout) -> None:
    nl = rc.node_layout(layout)
    cfg = rc.kubelet_config(layout, nl, rc.node_ports(0), 0)
    assert cfg["authentication"]["anonymous"] == {"enabled": False}
    assert cfg["authentication"]["webhook"]["enabled"] is True
    assert cfg["authentication"]["x509"]["clientCAFile"] == str(layout.pki.ca_cert)
    assert cfg["authorization"] == {"mode": "Webhook"}


def test_only_pods_meant_for_it_land_there_and_kwok_leaves_it_alone(layout: Layout) -> None:
    nl = rc.node_layout(layout)
    cfg = rc.kubelet_config(layout, nl, rc.node_ports(0), 0)
    assert cfg["registerWithTaints"] == [
        {"key": names.LABEL_REAL_NODE, "value": "true", "effect": "NoSchedule"}
    ]
    argv = rc.kubelet_argv(Path("/b/kubelet"), nl, "192.0.2.2")
    assert f"--hostname-override={names.REAL_NODE_NAME}" in argv
    assert f"--node-labels={names.LABEL_REAL_NODE}=true" in argv
    assert "--node-ip=192.0.2.2" in argv
    kwok = components.kwok_options(components.Ports())
    assert kwok["manageAllNodes"] is False
    assert kwok["manageNodesWithLabelSelector"] == f"{names.LABEL_FAKE_NODE}=true"
    assert names.LABEL_FAKE_NODE not in " ".join(argv)


def test_kubelet_joins_through_the_bootstrap_kubeconfig(layout: Layout) -> None:
    nl = rc.node_layout(layout)
    argv = rc.kubelet_argv(Path("/b/kubelet"), nl, None)
    assert f"--bootstrap-kubeconfig={nl.bootstrap_kubeconfig}" in argv
    assert f"--kubeconfig={nl.kubeconfig}" in argv
    assert f"--cert-dir={nl.cert_dir}" in argv
    assert not any(a.startswith("--node-ip") for a in argv)
    assert rc.kubelet_config(layout, nl, rc.node_ports(0), 0)["rotateCertificates"] is True


def test_containerd_config_is_the_clusters_own(layout: Layout) -> None:
    nl = rc.node_layout(layout)
    doc = tomllib.loads(rc.containerd_config(nl, rc.node_ports(OFFSET), Path("/cni")))
    assert doc["version"] == 2
    assert doc["grpc"]["address"] == str(nl.socket)
    assert doc["metrics"]["address"] == f"127.0.0.1:{ports.CONTAINERD_METRICS + OFFSET}"
    cri = doc["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == oci.PAUSE_REF
    assert cri["restrict_oom_score_adj"] is True
    assert cri["stream_server_port"] == "0"  # not the shared default 10010
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["options"]["SystemdCgroup"] is False  # agrees with the kubelet's cgroupfs
    assert cri["cni"] == {"bin_dir": "/cni", "conf_dir": str(nl.cni_conf_dir)}


def test_pod_network_is_a_bridge_on_a_private_24(layout: Layout) -> None:
    nl = rc.node_layout(layout)
    net = rc.cni_config(nl, OFFSET)
    bridge, portmap = net["plugins"]
    assert bridge["type"] == "bridge" and len(bridge["bridge"]) <= 15
    assert bridge["ipam"]["type"] == "host-local"
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.88.20.0/24"}]]
    assert bridge["ipam"]["dataDir"].startswith(str(layout.root))
    assert portmap["type"] == "portmap"
    assert rc.pod_cidr(0) != rc.pod_cidr(OFFSET)


def test_components_are_supervised_with_health_on_shifted_ports(layout: Layout) -> None:
    comps = realnode.node_components(layout, OFFSET, Path("/b"))
    assert [c.name for c in comps] == list(realnode.NAMES)
    containerd, kubelet = comps
    assert "supervise" in containerd.argv and "supervise" in kubelet.argv
    assert containerd.port == ports.CONTAINERD_METRICS + OFFSET
    assert kubelet.health.url == f"http://127.0.0.1:{ports.KUBELET_HEALTHZ + OFFSET}/healthz"
    assert "/b/bin/kubelet" in kubelet.argv


def test_bootstrap_token_is_made_once_and_grants_only_node_client_certificates(
    layout: Layout,
) -> None:
    token_id, secret = realnode.bootstrap_token(layout)
    assert realnode.bootstrap_token(layout) == (token_id, secret)
    assert len(token_id) == 6 and len(secret) == 16
    objs = realnode.bootstrap_objects(token_id, secret)
    token = objs[0]
    assert token["type"] == "bootstrap.kubernetes.io/token"
    assert token["metadata"] == {"name": f"bootstrap-token-{token_id}", "namespace": "kube-system"}
    assert token["stringData"]["usage-bootstrap-authentication"] == "true"
    assert "usage-bootstrap-signing" not in token["stringData"]
    roles = {o["roleRef"]["name"]: o["subjects"][0]["name"] for o in objs[1:]}
    assert roles == {
        "system:node-bootstrapper": realnode.BOOTSTRAP_GROUP,
        "system:certificates.k8s.io:certificatesigningrequests:nodeclient": (
            realnode.BOOTSTRAP_GROUP
        ),
        "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient": "system:nodes",
    }


def test_oci_archive_is_deterministic_and_named() -> None:
    entries = [oci.Entry("/bin"), oci.Entry("/bin/x", data=b"hi"), oci.Entry("/bin/y", link="x")]
    one = oci.archive(entries, {"Entrypoint": ["/bin/x"]}, "pilotfish.local/t:1")
    assert one == oci.archive(
        list(reversed(entries)), {"Entrypoint": ["/bin/x"]}, "pilotfish.local/t:1"
    )
    with tarfile.open(fileobj=io.BytesIO(one)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    index = json.loads(files["index.json"])
    desc = index["manifests"][0]
    assert desc["annotations"]["io.containerd.image.name"] == "pilotfish.local/t:1"
    assert desc["platform"] == {"architecture": "amd64", "os": "linux"}
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    manifest = json.loads(files[f"blobs/sha256/{desc['digest'][7:]}"])
    layer = files[f"blobs/sha256/{manifest['layers'][0]['digest'][7:]}"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        assert {m.name: m.issym() for m in tar.getmembers()} == {
            "bin": False,
            "bin/x": False,
            "bin/y": True,
        }


def test_spec_keeps_real_node(layout: Layout) -> None:
    assert ClusterSpec().real_node is False
    spec = ClusterSpec(real_node=True)
    layout.root.mkdir(exist_ok=True)
    layout.cluster_file.write_text(json.dumps(dataclasses.asdict(spec)))
    assert load_spec(layout) == spec


def test_import_refuses_a_missing_archive(layout: Layout, tmp_path: Path) -> None:
    with pytest.raises(realnode.RealNodeError, match="is not a file"):
        realnode.import_image(layout, tmp_path / "nope.tar", "pilotfish.local/x:1")


def fake_ctr(monkeypatch: pytest.MonkeyPatch, import_errors: list[str]) -> list[tuple[str, ...]]:
    """`ctr` whose imports fail with `import_errors` in turn, then succeed."""
    calls: list[tuple[str, ...]] = []

    def ctr(_: Layout, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        err = import_errors.pop(0) if args[1] == "import" and import_errors else ""
        return subprocess.CompletedProcess(list(args), 1 if err else 0, "", err)

    monkeypatch.setattr(realnode, "ctr", ctr)
    monkeypatch.setattr(supervisor, "running", lambda *_: object())
    monkeypatch.setattr(realnode, "IMPORT_RETRY_SECONDS", 0.0)
    return calls


NOT_FOUND = "ctr: content digest sha256:d6fe: not found"


def test_an_import_a_fresh_containerd_fails_is_tried_again(
    layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "a.tar"
    archive.write_bytes(b"x")
    calls = fake_ctr(monkeypatch, [NOT_FOUND])
    realnode.import_image(layout, archive, "pilotfish.local/x:1")
    assert [c[:2] for c in calls] == [("images", "rm"), ("images", "import")] * 2
    calls = fake_ctr(monkeypatch, [NOT_FOUND] * realnode.IMPORT_ATTEMPTS)
    with pytest.raises(realnode.RealNodeError, match="not found"):
        realnode.import_image(layout, archive, "pilotfish.local/x:1")
    assert len(calls) == 2 * realnode.IMPORT_ATTEMPTS
    calls = fake_ctr(monkeypatch, ["ctr: unexpected EOF"])  # not the transient failure
    with pytest.raises(realnode.RealNodeError, match="unexpected EOF"):
        realnode.import_image(layout, archive, "pilotfish.local/x:1")
    assert len(calls) == 2


def test_node_ports_are_apart_from_the_clusters_own() -> None:
    for offset in (0, 1000, OFFSET):
        cluster_ports = set(dataclasses.asdict(components.Ports().shifted(offset)).values())
        node = set(dataclasses.asdict(rc.node_ports(offset)).values())
        assert len(node) == 3 and not node & cluster_ports
