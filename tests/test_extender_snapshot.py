"""The node snapshot: per-node aggregates maintained from informer events, and assumptions.

The aggregates are updated incrementally for speed; `Snapshot.check` recomputes them the
slow, obvious way, and the property test drives random event sequences (including events
out of order: pods before their node, deletes of unknown objects, duplicate adds) to show
the two never disagree.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pilotfish import names
from pilotfish.extender.feed import SnapshotFeed, slim_node, slim_pod
from pilotfish.extender.snapshot import POD_FIELD_SELECTOR, Snapshot, pod_info
from pilotfish.kube.factory import InformerFactory
from pilotfish.kube.rest import NODES, PODS
from tests.fakeapi import FakeApi
from tests.test_extender_builders import node, pod, snapshot


def test_bound_pods_add_up_per_node() -> None:
    snap = snapshot(
        [node("n1", gpu=8), node("n2")],
        [
            pod("a", node="n1", cpu="2", memory="1Gi", gpu=4, band="production", workload="w"),
            pod("b", node="n1", cpu="500m", memory="1Gi", band="batch", workload="w"),
            pod("c", node="n2", cpu="1", memory="2Gi", workload="v"),
            pod("pending", cpu="8"),
        ],
    )
    n1 = snap.nodes["n1"]
    assert (n1.used_cpu, n1.used_memory, n1.used_gpu, n1.free_gpu) == (2500, 2 * 2**30, 4, 4)
    # Only batch.pilotfish.io/* requests take from the batch allocatable: not production,
    # not a batch pod left on plain cpu and memory (reclaim off in its namespace).
    assert (n1.used_batch_cpu, n1.used_batch_memory) == (0, 0)
    assert snap.workload_nodes == {"team-a/w": {"n1": 2}, "team-a/v": {"n2": 1}}
    assert "team-a/pending" not in snap.pods
    assert snap.zone_counts(snap.workload_nodes["team-a/w"]) == {"zone-a": 2}


def test_explicit_batch_requests_count_instead_of_plain_ones() -> None:
    p = pod("b", node="n1", cpu="4", band="batch", requests={names.BATCH_CPU: "1500"})
    info = pod_info(p)
    assert info is not None
    assert (info.cpu, info.batch_cpu) == (4000, 1500)


def test_pod_changes_replace_and_deletes_subtract() -> None:
    snap = snapshot([node("n1")], [pod("a", node="n1", cpu="1")])
    snap.on_pod("MODIFIED", pod("a", node="n1", cpu="3", resource_version="2"), None)
    assert snap.nodes["n1"].used_cpu == 3000
    snap.on_pod("MODIFIED", pod("a", node="n1", cpu="3", phase="Succeeded"), None)
    assert snap.nodes["n1"].used_cpu == 0
    assert snap.pods == {}
    snap.on_pod("ADDED", pod("a", node="n1", cpu="2"), None)
    snap.on_pod("DELETED", pod("a", node="n1", cpu="2"), None)
    snap.on_pod("DELETED", pod("never-seen", node="n1"), None)
    assert snap.nodes["n1"].used_cpu == 0
    assert snap.check() == []


def test_recreated_pod_with_same_name_replaces_the_old_uid() -> None:
    snap = snapshot([node("n1"), node("n2")], [pod("a", node="n1", uid="old")])
    snap.on_pod("MODIFIED", pod("a", node="n2", uid="new"), None)  # a relist saw only the new
    assert set(snap.by_uid) == {"new"}
    assert snap.nodes["n1"].used_cpu == 0
    assert snap.nodes["n2"].used_cpu == 1000
    assert snap.check() == []


def test_pods_before_their_node_and_a_deleted_node_with_pods() -> None:
    snap = Snapshot()
    snap.on_pod("ADDED", pod("a", node="n1", cpu="2"), None)
    assert not snap.nodes["n1"].present
    snap.on_node("ADDED", node("n1", "zone-c"), None)
    state = snap.nodes["n1"]
    assert state.present and state.zone == "zone-c" and state.used_cpu == 2000
    snap.on_node("DELETED", node("n1"), None)
    assert "n1" in snap.nodes and not snap.nodes["n1"].present
    snap.on_pod("DELETED", pod("a", node="n1"), None)
    assert "n1" not in snap.nodes
    assert snap.check() == []


def test_batch_node_count_follows_advertising() -> None:
    snap = snapshot([node("n1", batch_cpu=1000), node("n2")])
    assert snap.batch_nodes == 1
    snap.on_node("MODIFIED", node("n1"), None)
    assert snap.batch_nodes == 0
    snap.on_node("MODIFIED", node("n2", batch_memory=10), None)
    snap.on_node("DELETED", node("n2"), None)
    assert snap.batch_nodes == 0
    assert snap.check() == []


def test_assumptions_count_for_scores_until_bound_or_expired() -> None:
    snap = snapshot([node("n1"), node("n2")])
    snap.assume("u1", "n1", "team-a/w", 1000, 2**30, now=100.0, ttl=10)
    assert snap.workload_nodes == {"team-a/w": {"n1": 1}}
    assert (snap.nodes["n1"].score_cpu, snap.nodes["n1"].used_cpu) == (1000, 0)
    # The binding arrives on another node: the assumption is replaced by the fact.
    snap.on_pod("ADDED", pod("x", node="n2", uid="u1", workload="w"), None)
    assert snap.assumed == {}
    assert snap.workload_nodes == {"team-a/w": {"n2": 1}}
    assert snap.nodes["n1"].score_cpu == 0
    # Already bound: not assumed again. Unknown node: not assumed.
    snap.assume("u1", "n1", "team-a/w", 1, 1, now=100.0)
    snap.assume("u2", "nowhere", None, 1, 1, now=100.0)
    assert snap.assumed == {}
    snap.assume("u3", "n1", None, 500, 0, now=100.0, ttl=10)
    snap.assume("u4", "n1", None, 500, 0, now=105.0, ttl=10)
    assert snap.expire(109.9) == 0
    assert snap.expire(110.0) == 1
    assert list(snap.assumed) == ["u4"]
    assert snap.nodes["n1"].score_cpu == 500
    assert snap.check() == []


def test_reassuming_moves_the_assumption() -> None:
    snap = snapshot([node("n1"), node("n2")])
    snap.assume("u1", "n1", "ns/w", 1000, 0, now=0.0)
    snap.assume("u1", "n2", "ns/w", 1000, 0, now=1.0)
    assert snap.workload_nodes == {"ns/w": {"n2": 1}}
    assert snap.nodes["n1"].score_cpu == 0
    assert snap.check() == []


def test_slim_objects_keep_everything_the_snapshot_reads() -> None:
    p = pod("a", node="n1", gpu=1, band="batch", workload="w", machine_class="pf.x")
    p["metadata"]["ownerReferences"] = [{"uid": "rs", "controller": True, "kind": "ReplicaSet"}]
    p["spec"]["initContainers"] = [{"name": "i", "image": "x", "restartPolicy": "Always"}]
    slim = slim_pod(p)
    assert pod_info(slim) == pod_info(p)
    assert "unrelated" not in str(slim)
    assert slim["metadata"]["resourceVersion"] == "1"
    n = node("n1", "zone-b", gpu=2)
    fresh, slimmed = Snapshot(), Snapshot()
    fresh.on_node("ADDED", n, None)
    slimmed.on_node("ADDED", slim_node(n), None)
    assert vars_of(fresh.nodes["n1"]) == vars_of(slimmed.nodes["n1"])
    assert "managedFields" not in slim_node(n)["metadata"]


def vars_of(state: Any) -> dict[str, Any]:
    return {k: getattr(state, k) for k in state.__slots__}


# --- random event sequences -------------------------------------------------------------

NODE_NAMES = ["n1", "n2", "n3"]
POD_NAMES = ["p1", "p2", "p3", "p4", "p5"]

node_events = st.tuples(
    st.just("node"),
    st.sampled_from(["ADDED", "MODIFIED", "DELETED", "SYNC"]),
    st.sampled_from(NODE_NAMES),
    st.integers(0, 4),  # GPUs; also toggles batch advertising
)
pod_events = st.tuples(
    st.just("pod"),
    st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
    st.sampled_from(POD_NAMES),
    st.tuples(
        st.sampled_from([*NODE_NAMES, None]),
        st.sampled_from(["1", "2", "500m"]),
        st.sampled_from(["production", "batch", None]),
        st.sampled_from(["w1", "w2", None]),
        st.sampled_from(["Running", "Pending", "Succeeded"]),
        st.sampled_from(["a", "b"]),  # uid generation
    ),
)
assume_events = st.tuples(
    st.just("assume"),
    st.sampled_from(["assume", "forget", "expire"]),
    st.sampled_from([f"uid-team-a-{p}-{g}" for p in POD_NAMES for g in "ab"]),
    st.tuples(
        st.sampled_from(NODE_NAMES), st.sampled_from(["team-a/w1", None]), st.integers(0, 30)
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(node_events, pod_events, assume_events), max_size=40))
def test_aggregates_always_equal_a_recount(events: list[tuple[str, str, str, Any]]) -> None:
    snap = Snapshot()
    for what, kind, name, detail in events:
        if what == "node":
            gpus = detail
            snap.on_node(kind, node(name, gpu=gpus, batch_cpu=1000 if gpus % 2 else None), None)
        elif what == "pod":
            on, cpu, band, workload, phase, generation = detail
            p = pod(
                name,
                node=on,
                cpu=cpu,
                band=band,
                workload=workload,
                phase=phase,
                uid=f"uid-team-a-{name}-{generation}",
            )
            snap.on_pod(kind, p, None)
        elif kind == "assume":
            target, workload, now = detail
            snap.assume(name, target, workload, 100, 10, now=float(now), ttl=5)
        elif kind == "forget":
            snap.forget(name)
        else:
            snap.expire(float(detail[2]))
        assert snap.check() == [], (what, kind, name, detail)


# --- the feed: informers into the snapshot ------------------------------------------------


async def test_feed_lists_bound_pods_only_and_syncs_after_both_lists() -> None:
    api = FakeApi()
    n1 = node("n1", "zone-b")
    n1["metadata"]["managedFields"] = [{"manager": "kubelet", "operation": "Update"}]
    api.put(NODES.path(name="n1"), n1)
    api.put(PODS.path("team-a", "a"), pod("a", node="n1", cpu="3"))
    api.put(PODS.path("team-a", "waiting"), pod("waiting", cpu="5"))
    api.put(PODS.path("team-a", "done"), pod("done", node="n1", cpu="7", phase="Succeeded"))
    # The first pod lists fail: the nodes are listed, yet the snapshot must not be usable.
    api.fail_next("GET", PODS.path(), 500, times=3)
    snap = Snapshot()
    feed = SnapshotFeed(InformerFactory(api), snap)
    task = asyncio.create_task(feed.run())
    try:
        await asyncio.wait_for(feed.nodes.synced.wait(), 5)
        assert not feed.pods.synced.is_set()  # three failed lists back off for > 0.7 s
        assert not snap.synced, "synced before the pods were listed"
        await asyncio.wait_for(feed.pods.synced.wait(), 10)
        for _ in range(100):
            if snap.synced:
                break
            await asyncio.sleep(0)
        assert snap.synced
        assert snap.nodes["n1"].used_cpu == 3000, "only the bound, running pod counts"
        assert set(snap.pods) == {"team-a/a"}
        pod_lists = [c for c in api.calls if c.method == "GET" and c.path == PODS.path()]
        assert all(c.params["fieldSelector"] == POD_FIELD_SELECTOR for c in pod_lists)
        assert "managedFields" not in feed.nodes.store["n1"]["metadata"]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
