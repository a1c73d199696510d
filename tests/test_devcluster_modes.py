"""The local control plane's two node lifecycle modes: which controllers kube-controller-manager
runs, which mode the operator is told, that the mode is kept, and that a running cluster can
be switched."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pilotfish import nodesilence
from pilotfish.cli import main as cli
from pilotfish.devcluster import binaries, cluster, components, supervisor
from pilotfish.devcluster.cluster import ClusterSpec, host_processes
from pilotfish.devcluster.components import Component, Health, Layout, Ports

OFF = ("-node-lifecycle-controller", "-taint-eviction-controller")


def _kcm(layout: Layout, mode: str) -> Component:
    comps = components.control_plane(layout, Ports(), Path("/bin"), mode)
    return next(c for c in comps if c.name == "kube-controller-manager")


def _flags(c: Component) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in c.argv[1:] if "=" in a)


def _operator(layout: Layout, mode: str | None = None) -> Component:
    return next(c for c in host_processes(layout, Ports(), mode) if c.name == "pilotfish-operator")


def test_the_modes_are_the_operators_modes() -> None:
    assert components.NODE_LIFECYCLE_MODES == nodesilence.MODES
    assert ClusterSpec().node_lifecycle == nodesilence.MODE_PILOTFISH


def test_pilotfish_mode_turns_off_node_lifecycle_and_taint_eviction(tmp_path: Path) -> None:
    flags = _flags(_kcm(Layout(tmp_path), "pilotfish"))
    controllers = flags["controllers"].split(",")
    assert controllers[0] == "*"
    assert set(OFF) <= set(controllers[1:])
    # Everything else stays on: the endpoints, ReplicaSet, garbage collector controllers.
    assert len(controllers) == 1 + len(OFF)


def test_upstream_mode_runs_every_default_controller_at_its_defaults(tmp_path: Path) -> None:
    kcm = _kcm(Layout(tmp_path), "upstream")
    assert _flags(kcm)["controllers"] == "*"
    # upstream's own timings: no grace period, eviction rate or zone threshold set here
    tuned = ("node-monitor", "node-eviction-rate", "unhealthy-zone", "pod-eviction")
    assert not [a for a in kcm.argv if any(t in a for t in tuned)]


def test_the_other_components_do_not_depend_on_the_mode(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    a = components.control_plane(layout, Ports(), Path("/bin"), "pilotfish")
    b = components.control_plane(layout, Ports(), Path("/bin"), "upstream")
    differ = [x.name for x, y in zip(a, b, strict=True) if x != y]
    assert differ == ["kube-controller-manager"]


@pytest.mark.parametrize("mode", ["", "Upstream", "kube"])
def test_an_unknown_mode_is_refused_naming_it(tmp_path: Path, mode: str) -> None:
    with pytest.raises(ValueError, match=rf"node lifecycle '{mode}': must be one of pilotfish"):
        ClusterSpec(node_lifecycle=mode)
    with pytest.raises(ValueError, match="must be one of pilotfish, upstream"):
        components.control_plane(Layout(tmp_path), Ports(), Path("/bin"), mode)


def test_controller_names_are_this_kube_controller_managers() -> None:
    try:
        bins = binaries.bin_dir()
    except binaries.MissingBinaries:
        pytest.skip("binaries not built (devcluster/build.sh)")
    out = subprocess.run(
        [str(bins / "kube-controller-manager"), "--help"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    ).stdout
    listed = next(line for line in out.splitlines() if "All controllers:" in line)
    known = {n.strip() for n in listed.split("All controllers:", 1)[1].split(",")}
    assert {name.removeprefix("-") for name in OFF} <= known


@pytest.mark.parametrize("mode", ["pilotfish", "upstream"])
def test_the_operator_is_told_the_mode(tmp_path: Path, mode: str) -> None:
    operator = _operator(Layout(tmp_path), mode)
    assert dict(operator.env)["PILOTFISH_NODE_LIFECYCLE"] == mode
    others = [c for c in host_processes(Layout(tmp_path), Ports(), mode) if c.name != operator.name]
    assert others and all(not c.env for c in others)


def test_the_operator_keeps_the_saved_mode_when_none_is_given(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    assert dict(_operator(layout).env)["PILOTFISH_NODE_LIFECYCLE"] == "pilotfish"
    layout.cluster_file.write_text(json.dumps({"node_lifecycle": "upstream"}))
    assert dict(_operator(layout).env)["PILOTFISH_NODE_LIFECYCLE"] == "upstream"


def test_the_mode_is_saved_and_a_spec_without_it_is_pilotfish(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    layout.cluster_file.write_text(json.dumps({"nodes": 3, "port_offset": 0}))
    assert cluster.load_spec(layout) == ClusterSpec(nodes=3)
    spec = cluster.resolve_spec(layout, node_lifecycle="upstream")
    assert spec == ClusterSpec(nodes=3, node_lifecycle="upstream")
    layout.cluster_file.write_text(json.dumps({"nodes": 3, "node_lifecycle": "upstream"}))
    assert cluster.resolve_spec(layout).node_lifecycle == "upstream", "a later `up` keeps it"


def test_dev_up_takes_the_mode(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    started: list[ClusterSpec] = []
    monkeypatch.setattr(cluster, "up", lambda state, spec: started.append(spec))
    monkeypatch.setattr(cluster, "env_lines", lambda state: [])
    args = cli.parser().parse_args(
        ["dev", "--state", str(tmp_path), "up", "--node-lifecycle", "upstream"]
    )
    assert cli._dev(args) == 0
    assert started == [ClusterSpec(node_lifecycle="upstream")]
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["dev", "up", "--node-lifecycle", "kube"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_components_env_reaches_its_process(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    port = _free_port()
    seen = tmp_path / "seen"
    script = (
        "import os, http.server, pathlib\n"
        f"pathlib.Path({str(seen)!r}).write_text(os.environ['PILOTFISH_NODE_LIFECYCLE'])\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), "
        "http.server.SimpleHTTPRequestHandler).serve_forever()\n"
    )
    c = Component(
        "probe",
        (sys.executable, "-c", script),
        Health(f"http://127.0.0.1:{port}/"),
        port,
        env=(("PILOTFISH_NODE_LIFECYCLE", "upstream"),),
    )
    try:
        supervisor.start(layout, c, ready_timeout=30)
        assert seen.read_text() == "upstream"
    finally:
        supervisor.stop(layout, "probe")


def test_a_restart_waits_out_a_process_that_ignores_sigterm(tmp_path: Path) -> None:
    """kube-controller-manager after an API server outage can outlive SIGTERM's grace; the
    start after SIGKILL must not find the old process still holding its port."""
    layout = Layout(tmp_path)
    port = _free_port()
    script = (
        "import http.server, signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: time.sleep(0.5))\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), "
        "http.server.SimpleHTTPRequestHandler).serve_forever()\n"
    )
    c = Component(
        "stubborn", (sys.executable, "-c", script), Health(f"http://127.0.0.1:{port}/"), port
    )
    try:
        first = supervisor.start(layout, c, ready_timeout=30)
        second = supervisor.restart(layout, c, ready_timeout=30, grace=0.3)
        assert second.pid != first.pid
        assert supervisor.running(layout, "stubborn") == second
        assert supervisor.healthy(c.health)
    finally:
        supervisor.stop(layout, "stubborn", grace=0.3)


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Component | str]] = []

    def stop(self, layout: Layout, name: str, grace: float = 10.0) -> bool:
        self.calls.append(("stop", name))
        return True

    def start(self, layout: Layout, c: Component, **_: Any) -> None:
        self.calls.append(("start", c))


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    rec = _Recorder()
    monkeypatch.setattr(supervisor, "stop", rec.stop)
    monkeypatch.setattr(supervisor, "start", rec.start)
    monkeypatch.setattr(supervisor, "port_in_use", lambda port: False)
    monkeypatch.setattr(binaries, "bin_dir", lambda: Path("/bin"))
    return rec


def test_switch_restarts_the_controller_manager_and_the_operator(
    tmp_path: Path, recorder: _Recorder
) -> None:
    layout = Layout(tmp_path)
    spec = ClusterSpec(nodes=4, port_offset=500)
    layout.cluster_file.write_text(json.dumps({"nodes": 4, "port_offset": 500}))
    switched = cluster.switch_node_lifecycle(layout, spec.ports, "upstream")
    assert switched == ClusterSpec(nodes=4, port_offset=500, node_lifecycle="upstream")
    assert cluster.load_spec(layout) == switched, "saved: a later `up` keeps the mode"
    assert [(verb, x if isinstance(x, str) else x.name) for verb, x in recorder.calls] == [
        ("stop", "kube-controller-manager"),
        ("start", "kube-controller-manager"),
        ("stop", "pilotfish-operator"),
        ("start", "pilotfish-operator"),
    ]
    started = [c for verb, c in recorder.calls if isinstance(c, Component)]
    assert _flags(started[0])["controllers"] == "*"
    assert str(spec.ports.controller_manager) in _flags(started[0])["secure-port"]
    assert dict(started[1].env)["PILOTFISH_NODE_LIFECYCLE"] == "upstream"

    recorder.calls.clear()
    back = cluster.switch_node_lifecycle(layout, spec.ports, "pilotfish")
    assert back.node_lifecycle == "pilotfish"
    started = [c for verb, c in recorder.calls if isinstance(c, Component)]
    assert set(OFF) <= set(_flags(started[0])["controllers"].split(","))
    assert dict(started[1].env)["PILOTFISH_NODE_LIFECYCLE"] == "pilotfish"


def test_switch_of_a_bare_cluster_restarts_only_the_controller_manager(
    tmp_path: Path, recorder: _Recorder
) -> None:
    layout = Layout(tmp_path)
    layout.cluster_file.write_text(json.dumps({"pilotfish": False}))
    cluster.switch_node_lifecycle(layout, Ports(), "upstream")
    assert [x for verb, x in recorder.calls if verb == "stop"] == ["kube-controller-manager"]


def test_switch_refuses_a_bad_mode_wrong_ports_or_no_cluster(
    tmp_path: Path, recorder: _Recorder
) -> None:
    layout = Layout(tmp_path)
    with pytest.raises(RuntimeError, match="no local cluster"):
        cluster.switch_node_lifecycle(layout, Ports(), "upstream")
    layout.cluster_file.write_text(json.dumps({"port_offset": 500}))
    with pytest.raises(ValueError, match="--port-offset 500"):
        cluster.switch_node_lifecycle(layout, Ports(), "upstream")
    with pytest.raises(ValueError, match="node lifecycle 'off'"):
        cluster.switch_node_lifecycle(layout, Ports().shifted(500), "off")
    assert recorder.calls == []
    assert cluster.load_spec(layout) == ClusterSpec(port_offset=500), "nothing saved"


@pytest.fixture
def quiet_up(monkeypatch: pytest.MonkeyPatch, recorder: _Recorder) -> _Recorder:
    """`up` with every start recorded and no API server to talk to."""

    def write_configs(layout: Layout, spec: ClusterSpec, bins: Path) -> None:
        layout.cluster_file.write_text(json.dumps(dataclasses.asdict(spec)))

    monkeypatch.setattr(cluster, "_write_configs", write_configs)
    monkeypatch.setattr(cluster, "api_client", lambda layout: None)
    monkeypatch.setattr(cluster, "wait_for", lambda *a, **k: True)
    monkeypatch.setattr(cluster, "_ensure_nodes", lambda api, count: None)
    monkeypatch.setattr(cluster, "install_pilotfish", lambda layout, spec, bins: None)
    monkeypatch.setattr(cluster, "start_usage_pipeline", lambda layout, spec, bins, api: None)
    return recorder


def test_up_in_another_mode_restarts_what_already_ran(tmp_path: Path, quiet_up: _Recorder) -> None:
    cluster.up(tmp_path, ClusterSpec())
    assert [x for verb, x in quiet_up.calls if verb == "stop"] == [], "same mode: nothing stopped"
    quiet_up.calls.clear()
    cluster.up(tmp_path, cluster.resolve_spec(Layout(tmp_path), node_lifecycle="upstream"))
    stops = [x for verb, x in quiet_up.calls if verb == "stop"]
    assert stops == ["kube-controller-manager", "pilotfish-operator"]
    restarted = [c for verb, c in quiet_up.calls if isinstance(c, Component)][-2:]
    assert _flags(restarted[0])["controllers"] == "*"
    assert dict(restarted[1].env)["PILOTFISH_NODE_LIFECYCLE"] == "upstream"
    quiet_up.calls.clear()
    cluster.up(tmp_path)  # a later `up` keeps the saved mode
    assert [x for verb, x in quiet_up.calls if verb == "stop"] == []
    started = [c for verb, c in quiet_up.calls if isinstance(c, Component)]
    kcm = next(c for c in started if c.name == "kube-controller-manager")
    assert _flags(kcm)["controllers"] == "*"
