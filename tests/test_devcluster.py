"""The local control plane's specs, PKI and fake fleet, without starting anything."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from cryptography import x509
from hypothesis import given
from hypothesis import strategies as st

from pilotfish import names
from pilotfish.devcluster import components, nodes, pki
from pilotfish.devcluster.cluster import ClusterSpec, host_processes
from pilotfish.devcluster.components import Layout, Ports


def _flags(c: components.Component) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in c.argv[1:] if "=" in a)


def test_control_plane_order_and_flags(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    comps = components.control_plane(layout, Ports(), Path("/bin"))
    assert [c.name for c in comps] == [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    ]
    by = {c.name: c for c in comps}
    api = _flags(by["kube-apiserver"])
    assert api["authorization-mode"] == "Node,RBAC"
    assert api["bind-address"] == "127.0.0.1"
    assert api["etcd-servers"].endswith(f":{Ports().etcd_client}")
    kcm = _flags(by["kube-controller-manager"])
    assert "-node-lifecycle-controller" in kcm["controllers"].split(",")
    assert kcm["use-service-account-credentials"] == "true"
    assert by["kube-apiserver"].health.client_cert == layout.pki.cert("admin")


def test_scheduler_uses_the_extender_with_node_cache(tmp_path: Path) -> None:
    cfg = components.scheduler_config(Layout(tmp_path), Ports().shifted(7))
    main, gpus = cfg["extenders"]
    url = f"http://127.0.0.1:{Ports().extender + 7}"
    assert main["urlPrefix"] == gpus["urlPrefix"] == url
    assert main["nodeCacheCapable"] is True and gpus["nodeCacheCapable"] is True
    assert {main["filterVerb"], main["prioritizeVerb"], main["preemptVerb"]} == {
        "filter",
        "prioritize",
        "preempt",
    }
    assert main["ignorable"] is True, "scheduling goes on without the extender"
    assert gpus["ignorable"] is False, "GPU pods wait rather than overcommit GPUs"
    assert gpus["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": True}]
    assert names.SCHEDULER_NAME in [p["schedulerName"] for p in cfg["profiles"]]


def test_ports_shift_keeps_them_distinct() -> None:
    shifted = Ports().shifted(1000)
    values = list(vars(shifted).values())
    assert len(set(values)) == len(values)
    assert shifted.apiserver == Ports().apiserver + 1000


def test_host_processes_use_component_kubeconfigs(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    for c in host_processes(layout, ClusterSpec().ports):
        kube = c.argv[c.argv.index("--kubeconfig") + 1]
        assert kube.startswith(str(layout.root / "kubeconfigs")), c.name
        assert "admin" not in kube


def test_pki_is_made_once_and_kept(tmp_path: Path) -> None:
    p = pki.ensure(tmp_path)
    first = p.cert("apiserver").read_bytes()
    pki.ensure(tmp_path)
    assert p.cert("apiserver").read_bytes() == first
    cert = x509.load_pem_x509_certificate(first)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "kubernetes.default.svc" in san.get_values_for_type(x509.DNSName)
    admin = x509.load_pem_x509_certificate(p.cert("admin").read_bytes())
    orgs = admin.subject.get_attributes_for_oid(x509.oid.NameOID.ORGANIZATION_NAME)
    assert [o.value for o in orgs] == ["system:masters"]
    sched = x509.load_pem_x509_certificate(p.cert("kube-scheduler").read_bytes())
    assert sched.subject.rfc4514_string() == "CN=system:kube-scheduler"
    assert oct(p.key("admin").stat().st_mode & 0o777) == "0o600"


@given(st.integers(min_value=1, max_value=300))
def test_fleet_balances_zones_and_names_are_unique(count: int) -> None:
    fleet = nodes.fleet(count)
    assert len({n["metadata"]["name"] for n in fleet}) == count
    per_zone = Counter(n["metadata"]["labels"][names.LABEL_ZONE] for n in fleet)
    assert max(per_zone.values()) - min(per_zone.values(), default=0) <= 1 or len(per_zone) < 3
    assert all(n["metadata"]["labels"][names.LABEL_FAKE_NODE] == "true" for n in fleet)


def test_kwok_config_has_the_stages(tmp_path: Path) -> None:
    for rel in components.KWOK_STAGES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(
            f"apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata:\n  name: {rel}\n"
        )
    docs = components.kwok_config(tmp_path, Ports())
    assert docs[0]["kind"] == "KwokConfiguration"
    opts = docs[0]["options"]
    assert opts["manageAllNodes"] is False
    assert opts["manageNodesWithLabelSelector"] == f"{names.LABEL_FAKE_NODE}=true"
    assert all(opts[k] > 0 for k in opts if k.endswith("Parallelism"))
    assert [d["metadata"]["name"] for d in docs[1:]] == list(components.KWOK_STAGES)
