"""The local control plane's specs, PKI and fake fleet, without starting anything."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from cryptography import x509
from hypothesis import given
from hypothesis import strategies as st

from pilotfish import names
from pilotfish.devcluster import components, nodes, pki, stages, supervisor
from pilotfish.devcluster.cluster import ClusterSpec, host_processes
from pilotfish.devcluster.components import Layout, Ports

T = TypeVar("T")


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
    url = f"https://127.0.0.1:{Ports().extender + 7}"
    assert main["urlPrefix"] == gpus["urlPrefix"] == url
    # Over TLS, verifying the extender and presenting kube-scheduler's client certificate.
    pki = Layout(tmp_path).pki
    for extender in (main, gpus):
        assert extender["enableHTTPS"] is True
        assert extender["tlsConfig"] == {
            "caFile": str(pki.ca_cert),
            "certFile": str(pki.cert("kube-scheduler")),
            "keyFile": str(pki.key("kube-scheduler")),
        }
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


def test_kwok_renews_leases_from_a_worker_per_25_nodes() -> None:
    # 1,000 nodes renew 100 leases a second: from 4 workers they lapsed under load and every
    # zone went silent; each worker renews 2.5 a second at most.
    assert components.kwok_options(Ports())["nodeLeaseParallelism"] == 4
    assert components.kwok_options(Ports(), 12)["nodeLeaseParallelism"] == 4
    assert components.kwok_options(Ports(), 1000)["nodeLeaseParallelism"] == 40
    assert components.kwok_options(Ports(), 1001)["nodeLeaseParallelism"] == 41


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
    assert [d["metadata"]["name"] for d in docs[1:]] == [
        *components.KWOK_STAGES,
        stages.STAGE_SUCCEED,
        stages.STAGE_FAIL,
        stages.STAGE_RESYNC,
    ]
    assert not any(rel.endswith("pod-complete.yaml") for rel in components.KWOK_STAGES)


def test_host_processes_run_supervised_on_loopback(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    for c in host_processes(layout, ClusterSpec().ports):
        prefix = supervisor.supervised(layout, c.name, ())
        assert c.argv[: len(prefix)] == prefix, c.name
        child = c.argv[len(prefix) :]
        assert child[1:3] == ("-m", "pilotfish.cli.main"), c.name
        host_flag = "--metrics-host" if c.name == "pilotfish-operator" else "--host"
        assert child[child.index(host_flag) + 1] == "127.0.0.1", c.name
    (operator,) = [c for c in host_processes(layout, ClusterSpec().ports) if "operator" in c.name]
    identity = operator.argv[operator.argv.index("--identity") + 1]
    # Stable, not per process: a restarted operator must recognise the lease as its own.
    assert identity and str(os.getpid()) not in identity


def test_backoff_doubles_to_the_cap_and_resets_after_a_long_run() -> None:
    b = supervisor.Backoff()
    assert [b.after_exit(0.5) for _ in range(6)] == [1, 2, 4, 8, 10, 10]
    assert b.after_exit(60.0) == 1, "a child that ran a minute starts the series afresh"
    assert b.after_exit(0.5) == 2


def test_supervisor_restarts_a_crashing_child_with_backoff_and_logs_each_exit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    starts = tmp_path / "starts"
    argv = [sys.executable, "-c", f"open({str(starts)!r}, 'a').write('x'); raise SystemExit(3)"]
    sup = supervisor.Supervisor(Layout(tmp_path), "crasher", argv)
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:
            sup.request_stop()

    sup.sleep = sleep
    with caplog.at_level(logging.WARNING, logger="pilotfish.supervise"):
        assert sup.run() == 0
    assert waits == [1.0, 2.0, 4.0]
    assert starts.read_text() == "xxx"
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3
    assert all("crasher exited (exit code 3) after" in m for m in messages), messages
    assert [getattr(r, "restarts", None) for r in caplog.records] == [1, 2, 3]
    assert not supervisor.child_pidfile(Layout(tmp_path), "crasher").exists()


def test_a_child_that_cannot_start_is_retried_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sup = supervisor.Supervisor(Layout(tmp_path), "ghost", [str(tmp_path / "no-such-binary")])
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 2:
            sup.request_stop()

    sup.sleep = sleep
    with caplog.at_level(logging.WARNING, logger="pilotfish.supervise"):
        assert sup.run() == 0
    assert waits == [1.0, 2.0]
    assert "ghost cannot be started" in caplog.text
    assert "ghost exited (exit code 127)" in caplog.text


def test_nothing_to_supervise_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nothing to supervise"):
        supervisor.Supervisor(Layout(tmp_path), "empty", [])


def _poll(what: str, check: Callable[[], T | None], timeout: float = 15.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _gone(pid: int) -> bool:
    state = supervisor._proc_state(pid)
    return state in (None, "Z", "X")


@contextlib.contextmanager
def supervised_child(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    """`pilotfish dev supervise` of a child that crashes on its first start, then stays up."""
    pids = tmp_path / "pids"
    script = (
        "import os, sys, time\n"
        f"p = {str(pids)!r}\n"
        "first = not os.path.exists(p)\n"
        "open(p, 'a').write(f'{os.getpid()}\\n')\n"
        "sys.exit(3) if first else time.sleep(60)\n"
    )
    log = tmp_path / "supervise.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *supervisor.supervised(Layout(tmp_path), "t", ()),
                sys.executable,
                "-c",
                script,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc, pids, log
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_supervise_restarts_its_child_and_stops_with_its_process_group(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    with supervised_child(tmp_path) as (proc, pids, log):

        def second_start() -> list[int] | None:
            started = [int(p) for p in pids.read_text().split()] if pids.exists() else []
            return started if len(started) == 2 else None

        first, second = _poll("the child restarted", second_start)
        assert _poll("the child pid file", lambda: supervisor.child(layout, "t")).pid == second
        assert _gone(first)
        text = log.read_text()
        assert "t exited (exit code 3)" in text and "restarting in 1.0s" in text, text
        os.killpg(proc.pid, signal.SIGTERM)  # what `pilotfish dev down` does
        assert proc.wait(timeout=10) == 0
        _poll("the child gone", lambda: _gone(second))
        assert supervisor.child(layout, "t") is None
        assert len(pids.read_text().split()) == 2, "a stop is not a crash: no restart"


def test_a_child_does_not_outlive_its_killed_supervisor(tmp_path: Path) -> None:
    with supervised_child(tmp_path) as (proc, _pids, _log):
        current = _poll("the child up", lambda: supervisor.child(Layout(tmp_path), "t"))
        os.kill(proc.pid, signal.SIGKILL)  # the supervisor alone, not its group
        _poll("the orphan gone", lambda: _gone(current.pid))
