"""node_failure's figures from a recording: one lost node's timeline measured from its last
lease renewal, the verdict against the configured timings, the brake window's counts, and
the JSON object's shape. Recordings are written by hand as the API would answer."""

from __future__ import annotations

import argparse
import datetime
import json
from typing import Any

from benchmarks import node_failure
from benchmarks.probes import nodefailure as nf
from pilotfish.devcluster import nodes as fleet
from pilotfish.nodesilence import SilenceSettings
from pilotfish.workloads import DISRUPTION_NODE_LOST, ENDPOINTSLICE_MANAGED_BY, LABEL_WORKLOAD

NS = "bench"
T0 = 1_700_000_000.0  # the victim's last lease renewal
UNREACHABLE = (f"{nf.TAINT_UNREACHABLE}:NoSchedule", f"{nf.TAINT_UNREACHABLE}:NoExecute")


def stamp(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat().replace("+00:00", "Z")


def node(name: str, ready: str, taints: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "taints": [dict(zip(("key", "effect"), t.split(":"), strict=True)) for t in taints]
        },
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }


def lease(name: str, renewed: float) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"renewTime": stamp(renewed)}}


def pod(name: str, on: str, ready: bool = True, deleted: bool = False, lost: bool = False) -> Any:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if lost:
        conditions.append(
            {"type": "DisruptionTarget", "status": "True", "reason": DISRUPTION_NODE_LOST}
        )
    meta: dict[str, Any] = {"name": name, "namespace": NS, "labels": {LABEL_WORKLOAD: "web"}}
    if deleted:
        meta["deletionTimestamp"] = stamp(T0)
    return {
        "metadata": meta,
        "spec": {"nodeName": on},
        "status": {"phase": "Running", "conditions": conditions},
    }


def endpoint_slice(shown: dict[str, bool], managed_by: str = ENDPOINTSLICE_MANAGED_BY) -> Any:
    return {
        "metadata": {
            "namespace": NS,
            "labels": {nf.LABEL_SERVICE_NAME: "web", nf.LABEL_MANAGED_BY: managed_by},
        },
        "endpoints": [
            {"targetRef": {"kind": "Pod", "name": p}, "conditions": {"ready": r}}
            for p, r in shown.items()
        ],
    }


def lost_node_recording(unreachable_at: float = 40.2, evicted_at: float = 100.3) -> list[Any]:
    """n1 silent from T0 to RESTORED (n2 renews on); marked at `unreachable_at`, its pod's
    endpoint dropped 0.4 s later, evicted at `evicted_at`, replaced on n2 a second after."""
    samples = []
    for i in range(-4, 230):
        t = T0 + i * 0.5
        s = t - T0
        marked = s >= unreachable_at
        n1 = node("n1", "Unknown", UNREACHABLE) if marked else node("n1", "True")
        pods = [pod("a", "n1", ready=not marked, deleted=s >= evicted_at, lost=s >= evicted_at)]
        pods.append(pod("b", "n2"))
        shown = {"a": s < unreachable_at + 0.4, "b": True}
        if s >= evicted_at + 1:
            pods.append(pod("c", "n2", ready=s >= evicted_at + 1.5))
            shown["c"] = s >= evicted_at + 1.5
        foreign = endpoint_slice({"a": True}, managed_by="endpointslice-controller.k8s.io")
        samples.append(
            nf.sample(
                t,
                t + 0.05,
                [n1, node("n2", "True")],
                [lease("n1", t if s >= RESTORED else T0), lease("n2", t)],
                pods,
                [endpoint_slice(shown), foreign],
            )
        )
    return samples


WANTED = {f"{NS}/web": 2}
RESTORED = 110.0  # n1's lease renews again from here


def lost(samples: list[Any]) -> dict[str, Any]:
    """n1's timeline, recorded from T0 on, n1 let back at RESTORED."""
    return nf.timeline(samples, "n1", {f"{NS}/a"}, WANTED, WANTED, T0, T0 + RESTORED)


def test_a_lost_nodes_timeline_is_measured_from_its_last_renewal() -> None:
    samples = lost_node_recording()
    t = lost(samples)
    assert t["last_renewal"] == T0
    # A change is placed between the previous sample's send and this one's answer.
    assert t["unreachable"] == {"after_s": 40.0, "by_s": 40.55}
    # The built-in controller's slice (still showing "a" ready) is not Pilotfish's promise.
    assert t["endpoints_dropped"] == {"after_s": 40.5, "by_s": 41.05}
    assert t["evicted"] == {"after_s": 100.0, "by_s": 100.55}
    assert t["replacements_bound"] == {"after_s": 101.0, "by_s": 101.55}
    assert t["full_ready"] == {"after_s": 101.5, "by_s": 102.05}
    assert t["disruption_reasons"] == [DISRUPTION_NODE_LOST]
    verdict = nf.lone_verdict(t, 40, 60)
    assert verdict["met"] and verdict["replacements_bound_by_s"] == 105


def test_a_node_marked_late_or_replaced_late_misses_the_target() -> None:
    late = lost(lost_node_recording(unreachable_at=42.6))
    assert late["unreachable"]["by_s"] > 42
    assert not nf.lone_verdict(late, 40, 60)["not_ready_within_2s_of_configured"]
    early = lost(lost_node_recording(unreachable_at=37))
    assert not nf.lone_verdict(early, 40, 60)["met"]
    slow = lost(lost_node_recording(evicted_at=104.5))
    v = nf.lone_verdict(slow, 40, 60)
    assert v["not_ready_within_2s_of_configured"] and not v["replacements_bound_in_time"]


def test_the_silence_ends_at_the_last_renewal_before_the_node_was_let_back() -> None:
    samples = lost_node_recording()
    assert nf.last_renewal(samples, "n1") == samples[-1].at
    assert nf.last_renewal(samples, "n1", T0 + RESTORED) == T0
    assert nf.last_renewal(samples, "nowhere") is None
    assert "error" in nf.timeline(samples, "nowhere", set(), WANTED, WANTED, T0)


def brake_recording(drop_at: float | None, evict_at: float | None = None) -> list[Any]:
    """n1 and n2 silent from T0, their pods a and b kept; with `drop_at`, b's endpoint goes;
    with `evict_at`, b is deleted."""
    samples = []
    for i in range(-4, 40):
        t = T0 + i * 0.5
        shown = {"a": True, "b": drop_at is None or t - T0 < drop_at, "c": True}
        deleted = evict_at is not None and t - T0 >= evict_at
        pods = [pod("a", "n1"), pod("b", "n2", deleted=deleted), pod("c", "n3")]
        nodes = [node("n1", "Unknown", UNREACHABLE), node("n2", "True"), node("n3", "True")]
        leases = [lease("n1", T0), lease("n2", T0), lease("n3", t)]
        samples.append(nf.sample(t, t + 0.05, nodes, leases, pods, [endpoint_slice(shown)]))
    return samples


def test_the_brake_window_counts_evictions_and_endpoints_of_the_silent_nodes_pods() -> None:
    kept = nf.brake_figures(brake_recording(None), ["n1", "n2"], T0, T0 + 19)
    assert kept["pods_on_silent_nodes"] == 2
    assert (kept["evictions"], kept["endpoints_removed"], kept["pods_made_not_ready"]) == (0, 0, 0)
    assert kept["nodes_marked_unreachable"] == 1 and kept["met"]
    dropped = nf.brake_figures(brake_recording(5.0), ["n1", "n2"], T0, T0 + 19)
    assert dropped["endpoints_removed"] == 1 and not dropped["met"]
    assert dropped["evictions"] == 0 and dropped["evicted_from"] == []
    evicted = nf.brake_figures(brake_recording(6.0, evict_at=5.0), ["n1", "n2"], T0, T0 + 19)
    assert (evicted["evictions"], evicted["evicted_from"], evicted["met"]) == (1, ["n2"], False)
    assert "error" in nf.brake_figures(brake_recording(None), ["n1"], T0 + 100, T0 + 200)
    assert kept["silent_s"] == 19 and kept["recorded_after_restore_s"] == 0.5


def test_the_brake_silences_a_share_of_every_zone() -> None:
    names = [n["metadata"]["name"] for n in fleet.fleet(12)]
    silent = nf.brake_choice(names, 0.6)
    assert len(silent) == 7
    zones = {n.rsplit("-", 1)[0] for n in silent}
    assert zones == {f"kwok-{z}" for z in fleet.ZONES}
    assert all(sum(1 for n in silent if n.startswith(z)) >= 2 for z in zones)


def test_the_json_object_names_every_figure_target_and_verdict() -> None:
    args = argparse.Namespace(
        nodes=12,
        services=3,
        replicas=10,
        brake_fraction=0.6,
        brake_window=130.0,
        upstream_window=410.0,
        skip_upstream=False,
    )
    timeline = lost(lost_node_recording())
    figures = {
        "pilotfish": {**timeline, "verdict": nf.lone_verdict(timeline, 40, 60)},
        "zone_brake": nf.brake_figures(brake_recording(None), ["n1", "n2"], T0, T0 + 19),
    }
    out = node_failure.result(args, figures, SilenceSettings())
    assert json.loads(json.dumps(out)) == out
    assert out["benchmark"] == "node_failure"
    assert out["inputs"]["unreachable_after_s"] == 40 and out["inputs"]["eviction_wait_s"] == 60
    assert out["targets"]["replacements_bound_s"] == "<= 105.0"
    assert out["met_by_figure"] == {"pilotfish_lone_node": True, "zone_brake": True}
    assert out["met"] is True
    failed = node_failure.result(args, {"pilotfish": {"error": "x"}}, SilenceSettings())
    assert failed["met"] is False


def test_a_node_has_returned_only_ready_and_without_a_lost_node_taint() -> None:
    def state(ready: str, *taints: str) -> Any:
        return nf.sample(T0, T0, [node("n1", ready, taints)], [lease("n1", T0)], [], [])

    back = nf.returned("n1")
    assert back(state("True", "example.com/dedicated:NoSchedule"))
    assert not back(state("True", "node.kubernetes.io/not-ready:NoExecute"))
    assert not back(state("True", f"{nf.TAINT_UNREACHABLE}:NoSchedule"))
    assert not back(state("Unknown"))
    assert not back(nf.Sample(T0, T0, {}, {}, {}))  # a node the recording does not list
