"""Placement rules on plain values: filter reasons and summaries, scores, preemption.

Each table row is one situation a platform engineer would recognise; the property tests pin
what must hold for any input: scores stay in 0..10 with exactly one winner, and preemption
never returns a node whose victims include a production pod.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pilotfish import names
from pilotfish.extender import decide, reasons
from pilotfish.extender.decide import Incoming, incoming
from pilotfish.extender.snapshot import Snapshot
from pilotfish.extender.wire import MetaVictims
from tests.test_extender_builders import fleet, node, pod, snapshot

Obj = dict[str, Any]


def gpu_pod(n: int, **kw: Any) -> Incoming:
    return incoming(pod("train", gpu=n, band="batch", **kw))


def batch_pod(name: str, band: str, *, cpu_m: int = 0, memory: int = 0, **kw: Any) -> Any:
    """A pod the webhook translated onto reclaimed capacity (`batch.pilotfish.io/*` only):
    bound when `node` is given (an object for the snapshot), else the incoming pod."""
    requests = {}
    if cpu_m:
        requests[names.BATCH_CPU] = str(cpu_m)
    if memory:
        requests[names.BATCH_MEMORY] = str(memory)
    body = pod(name, cpu=None, memory=None, band=band, requests=requests, **kw)
    return body if "node" in kw else incoming(body)


# --- filter -----------------------------------------------------------------------------


def test_plain_pods_pass_untouched_without_looking_at_nodes() -> None:
    snap = snapshot(fleet())
    names_ = ["kwok-zone-a-0", "unknown", "kwok-zone-b-1"]
    result = decide.filter_nodes(incoming(pod("web", band="production")), snap, names_)
    assert result.passing is names_  # the caller's list itself, no per-node work
    assert result.failed == {} and result.unresolvable == {}


@pytest.mark.parametrize(
    ("nodes", "pods", "incoming_pod", "passing", "failed", "unresolvable"),
    [
        pytest.param(
            [node("n1", gpu=8), node("n2", gpu=4), node("n3")],
            [],
            gpu_pod(8),
            ["n1"],
            {},
            {
                "n2": "node n2 in zone-a has 4 free GPUs, pod asks 8",
                "n3": "node n3 in zone-a has no GPUs, pod asks 8",
            },
            id="gpu-capacity-is-unresolvable",
        ),
        pytest.param(
            [node("n1", gpu=8), node("n2", gpu=8)],
            [pod("a", node="n1", gpu=6)],
            gpu_pod(4),
            ["n2"],
            {"n1": "node n1 in zone-a has 2 free GPUs, pod asks 4"},
            {},
            id="gpus-in-use-are-resolvable",
        ),
        pytest.param(
            [node("n1", instance_type="pf.gpu-8"), node("n2"), node("n3", instance_type=None)],
            [],
            incoming(pod("p", machine_class="pf.gpu-8")),
            ["n1"],
            {},
            {
                "n2": "node n2 in zone-a is machine class pf.standard-32, pod asks pf.gpu-8",
                "n3": "node n3 in zone-a is machine class (unlabelled), pod asks pf.gpu-8",
            },
            id="machine-class",
        ),
        pytest.param(
            [node("n1", batch_cpu=4000), node("n2", batch_cpu=2500), node("n3")],
            [
                batch_pod("b", "batch", node="n1", cpu_m=1000),
                pod("web", node="n1", cpu="20", band="production"),  # not on batch capacity
                batch_pod("be", "best-effort", node="n2", cpu_m=1000),  # on batch capacity
                pod("old", node="n2", cpu="3", band="batch"),  # untranslated: normal capacity
            ],
            batch_pod("t", "batch", cpu_m=2000),
            ["n1", "n3"],
            {"n2": "node n2 in zone-a has 1500m batch.pilotfish.io/cpu free, pod asks 2 CPU"},
            {},
            id="batch-cpu-only-where-advertised",
        ),
        pytest.param(
            [node("n1", batch_memory=2**30)],
            [],
            batch_pod("t", "best-effort", memory=2 * 2**30),
            [],
            {},
            {"n1": "no node in zone-a has 2Gi free in batch.pilotfish.io/memory: 1 has 1Gi"},
            id="batch-memory",
        ),
        pytest.param(
            [node("n1", batch_cpu=1000)],
            [],
            incoming(pod("web", cpu="8", band="production")),
            ["n1"],
            {},
            {},
            id="production-ignores-batch-capacity",
        ),
        pytest.param(
            [node("n1", batch_cpu=4000), node("n2", batch_cpu=4000), node("n3", batch_cpu=1000)],
            [
                batch_pod("other", "batch", node="n1", cpu_m=3000),  # on batch capacity
                pod("web", node="n2", cpu="20", band="production"),  # never counted
            ],
            batch_pod("t", "batch", cpu_m=2000),
            ["n2"],
            {"n1": "node n1 in zone-a has 1 batch.pilotfish.io/cpu free, pod asks 2 CPU"},
            {"n3": "node n3 in zone-a has 1 batch.pilotfish.io/cpu free, pod asks 2 CPU"},
            id="translated-pod-fits-batch-allocatable-minus-other-batch-pods",
        ),
    ],
)
def test_filter(
    nodes: list[Obj],
    pods: list[Obj],
    incoming_pod: Incoming,
    passing: list[str],
    failed: dict[str, str],
    unresolvable: dict[str, str],
) -> None:
    names_ = [n["metadata"]["name"] for n in nodes]
    result = decide.filter_nodes(incoming_pod, snapshot(nodes, pods), names_)
    assert list(result.passing) == passing
    assert result.failed == failed
    assert result.unresolvable == unresolvable


def test_unknown_and_deleted_nodes_pass() -> None:
    snap = snapshot([node("n1", gpu=1)], [pod("a", node="gone", gpu=1)])
    result = decide.filter_nodes(gpu_pod(4), snap, ["n1", "gone", "new"])
    assert list(result.passing) == ["gone", "new"]
    assert set(result.unresolvable) == {"n1"}


def test_every_node_failing_carries_one_summary_grouped_by_zone() -> None:
    nodes = [
        *fleet(),
        node("kwok-zone-b-4", "zone-b", gpu=4),
        node("kwok-zone-b-5", "zone-b", gpu=4),
        node("kwok-zone-b-6", "zone-b", gpu=4),
        node("kwok-zone-b-7", "zone-b", gpu=4),
    ]
    pods = [pod("used", node="kwok-zone-b-7", gpu=4)]
    snap = snapshot(nodes, pods)
    names_ = [n["metadata"]["name"] for n in nodes]
    result = decide.filter_nodes(gpu_pod(8), snap, names_)
    assert result.passing == []
    summary = (
        "no node in zone-a, zone-b or zone-c has 8 free GPUs (nvidia.com/gpu): "
        "zone-a: 4 have none; zone-b: 3 have 4, 1 is full, 4 have none; zone-c: 4 have none"
    )
    assert set(result.unresolvable.values()) == {summary}
    assert len(result.unresolvable) == len(names_)
    assert result.causes == {reasons.GPUS: len(names_)}


def test_summary_in_one_zone_reads_like_the_seed() -> None:
    nodes = [node(f"b{i}", "zone-b", gpu=4) for i in range(3)] + [node("b3", "zone-b", gpu=8)]
    snap = snapshot(nodes, [pod("x", node="b3", gpu=8)])
    result = decide.filter_nodes(gpu_pod(8), snap, ["b0", "b1", "b2", "b3"])
    assert set(result.unresolvable.values()) | set(result.failed.values()) == {
        "no node in zone-b has 8 free GPUs (nvidia.com/gpu): 3 have 4, 1 is full"
    }
    assert set(result.failed) == {"b3"}, "a node that would fit empty stays preemptible"


def test_summary_with_several_causes_and_many_buckets() -> None:
    nodes = [
        node("a0", "zone-a", instance_type="pf.small"),
        node("a1", "zone-a", instance_type="pf.small"),
        *(node(f"b{i}", "zone-b", gpu=i + 1, instance_type="pf.gpu") for i in range(5)),
    ]
    result = decide.filter_nodes(
        gpu_pod(8, machine_class="pf.gpu"),
        snapshot(nodes),
        [n["metadata"]["name"] for n in nodes],
    )
    (summary,) = set(result.unresolvable.values())
    assert summary == (
        "no node in zone-a is machine class pf.gpu (node.kubernetes.io/instance-type): "
        "2 are pf.small; "
        "no node in zone-b has 8 free GPUs (nvidia.com/gpu): 1 has 5, 1 has 4, 1 has 3, "
        "2 have less"
    )


def test_summary_names_at_most_six_zones() -> None:
    nodes = [node(f"n{z}", f"zone-{z}") for z in range(8)]
    result = decide.filter_nodes(gpu_pod(1), snapshot(nodes), [f"n{z}" for z in range(8)])
    (summary,) = set(result.unresolvable.values())
    assert summary.startswith("no node in any of 8 zones has 1 free GPUs")
    assert summary.endswith("zone-5: 1 has none; and 2 more zones")


@pytest.mark.parametrize(
    ("value", "cpu", "memory"),
    [
        (0, "0", "0"),
        (500, "500m", "500"),
        (2000, "2", "2.0Ki"),
        (1500, "1500m", "1.5Ki"),
        (3 * 2**30, "3221225472m", "3Gi"),
    ],
)
def test_formats(value: int, cpu: str, memory: str) -> None:
    assert reasons.fmt_cpu(value) == cpu
    assert reasons.fmt_bytes(value) == memory


# --- prioritize -------------------------------------------------------------------------


def prod(name: str, workload: str = "web", **kw: Any) -> Obj:
    return pod(name, band="production", workload=workload, **kw)


def scores_by_node(p: Obj, snap: Snapshot, names_: list[str]) -> dict[str, int]:
    result = decide.score_nodes(incoming(p), snap, names_)
    return dict(zip(names_, result.scores, strict=True))


def test_production_goes_to_the_zone_with_fewest_replicas_then_node() -> None:
    nodes = fleet(per_zone=2)
    bound = [
        prod("w0", node="kwok-zone-a-0"),
        prod("w1", node="kwok-zone-b-0"),
        prod("other", workload="api", node="kwok-zone-c-0"),
    ]
    snap = snapshot(nodes, bound)
    names_ = [n["metadata"]["name"] for n in nodes]
    scores = scores_by_node(prod("w2"), snap, names_)
    # zone-c has no "web" replica: its nodes lead; kwok-zone-c-0 is fuller (the api pod).
    assert scores == {
        "kwok-zone-c-0": 10,
        "kwok-zone-c-1": 9,
        "kwok-zone-a-0": 5,  # one more in the zone and one more on the node
        "kwok-zone-a-1": 6,
        "kwok-zone-b-0": 5,
        "kwok-zone-b-1": 6,
    }


def test_production_spreads_over_nodes_within_a_zone() -> None:
    snap = snapshot(
        [node("n1", "z"), node("n2", "z"), node("n3", "z")],
        [prod("w0", node="n1"), prod("w1", node="n1"), prod("w2", node="n2")],
    )
    assert scores_by_node(prod("w3"), snap, ["n1", "n2", "n3"]) == {"n1": 7, "n2": 8, "n3": 10}


def test_production_without_workload_prefers_the_fuller_node() -> None:
    snap = snapshot([node("n1"), node("n2")], [pod("x", node="n2", cpu="16", band="batch")])
    p = pod("solo", band="production")
    assert scores_by_node(p, snap, ["n1", "n2"]) == {"n1": 9, "n2": 10}


def test_batch_packs_onto_the_most_allocated_node() -> None:
    snap = snapshot(
        [node("n1"), node("n2"), node("n3")],
        [pod("a", node="n2", cpu="16", memory="64Gi"), pod("b", node="n3", cpu="8", memory="8Gi")],
    )
    task = pod("t", band="batch", cpu="8", memory="32Gi")
    scores = scores_by_node(task, snap, ["n1", "n2", "n3"])
    # n2: (24/32 + 96/128)/2 = 0.75 -> best; n3: (16/32 + 40/128)/2 = 0.406 -> 3; n1: 0.25 -> 2
    assert scores == {"n1": 2, "n2": 10, "n3": 3}


def test_empty_nodes_tie_break_by_name_so_a_burst_lands_together() -> None:
    snap = snapshot(fleet())
    names_ = sorted(snap.nodes, reverse=True)
    result = decide.score_nodes(incoming(pod("t", band="batch")), snap, names_)
    assert result.best == "kwok-zone-a-0"


def test_unknown_nodes_score_zero_and_never_win() -> None:
    snap = snapshot([node("n1")])
    assert scores_by_node(prod("w"), snap, ["ghost", "n1"]) == {"ghost": 0, "n1": 10}
    assert scores_by_node(pod("t", band="batch"), snap, ["ghost"]) == {"ghost": 0}
    assert decide.score_nodes(incoming(prod("w")), snap, ["ghost"]).best is None


bands = st.sampled_from(["production", "batch", "best-effort"])


@st.composite
def clusters(draw: st.DrawFn) -> tuple[Snapshot, list[str], Obj]:
    count = draw(st.integers(1, 8))
    nodes = [
        node(f"n{i}", f"z{draw(st.integers(0, 2))}", cpu=str(draw(st.integers(0, 64))))
        for i in range(count)
    ]
    pods = [
        pod(
            f"p{j}",
            node=f"n{draw(st.integers(0, count - 1))}",
            cpu=f"{draw(st.integers(0, 40000))}m",
            memory=f"{draw(st.integers(0, 300))}Gi",
            band=draw(bands),
            workload=draw(st.sampled_from(["w", "v", None])),
        )
        for j in range(draw(st.integers(0, 20)))
    ]
    snap = snapshot(nodes, pods)
    names_ = draw(st.lists(st.sampled_from([*snap.nodes, "ghost"]), min_size=1, unique=True))
    incoming_pod = pod(
        "new",
        cpu=f"{draw(st.integers(0, 70000))}m",
        band=draw(bands),
        workload=draw(st.sampled_from(["w", None])),
    )
    return snap, names_, incoming_pod


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_scores_stay_in_range_with_exactly_one_winner(
    case: tuple[Snapshot, list[str], Obj],
) -> None:
    snap, names_, p = case
    result = decide.score_nodes(incoming(p), snap, names_)
    assert len(result.scores) == len(names_)
    assert all(0 <= s <= 10 for s in result.scores)
    known = [n for n in names_ if n in snap.nodes and snap.nodes[n].present]
    if known:
        assert result.scores.count(10) == 1
        assert result.best == names_[result.scores.index(10)]
    else:
        assert result.best is None


# --- preempt ----------------------------------------------------------------------------


def victims(*uids: str, pdb: int = 0) -> MetaVictims:
    return MetaVictims(list(uids), pdb)


def uid(name: str) -> str:
    return f"uid-team-a-{name}"


PREEMPT_PODS = [
    pod("prod-1", node="n1", band="production"),
    pod("legacy-prod", node="n2", priority=0, band="production"),  # label says production
    pod("batch-old", node="n3", band="batch", start="2026-01-01T00:00:00Z"),
    pod("batch-new", node="n4", band="batch", start="2026-01-02T00:00:00Z"),
    pod("be-1", node="n5", band="best-effort"),
    pod("be-2", node="n5", band="best-effort"),
    pod("batch-a", node="n6", band="batch"),
    pod("be-3", node="n7", band="best-effort"),
]


@pytest.mark.parametrize(
    ("proposed", "chosen", "vetoed"),
    [
        pytest.param(
            {"n1": victims(uid("prod-1")), "n3": victims(uid("batch-old"))},
            "n3",
            {"n1": decide.VETO_PRODUCTION},
            id="never-production",
        ),
        pytest.param(
            {"n2": victims(uid("legacy-prod"))},
            None,
            {"n2": decide.VETO_PRODUCTION},
            id="production-by-label-even-at-low-priority",
        ),
        pytest.param(
            {"n5": victims(uid("be-1"), uid("be-2")), "n6": victims(uid("batch-a"))},
            "n6",
            {},
            id="fewest-victims-first",
        ),
        pytest.param(
            {"n6": victims(uid("batch-a")), "n7": victims(uid("be-3"))},
            "n7",
            {},
            id="then-lowest-band",
        ),
        pytest.param(
            {"n3": victims(uid("batch-old")), "n4": victims(uid("batch-new"))},
            "n4",
            {},
            id="then-most-recently-started",
        ),
        pytest.param(
            {"n7": victims(uid("be-3"), pdb=1), "n6": victims(uid("batch-a"))},
            "n6",
            {},
            id="disruption-budgets-first",
        ),
        pytest.param(
            {"n6": victims("not-in-snapshot"), "n7": victims()},
            None,
            {"n6": decide.VETO_UNKNOWN},
            id="unknown-victims-and-empty-nodes-are-dropped",
        ),
        pytest.param(
            {"n1": victims("not-in-snapshot", uid("prod-1"))},
            None,
            {"n1": decide.VETO_PRODUCTION},
            id="production-named-over-unknown",
        ),
    ],
)
def test_preemption(
    proposed: dict[str, MetaVictims], chosen: str | None, vetoed: dict[str, str]
) -> None:
    snap = snapshot([node(f"n{i}") for i in range(1, 8)], PREEMPT_PODS)
    result = decide.choose_victims(snap, proposed)
    assert result.victims == ({chosen: proposed[chosen]} if chosen else {})
    assert result.vetoed == vetoed


@st.composite
def preemption_cases(draw: st.DrawFn) -> tuple[Snapshot, dict[str, MetaVictims]]:
    pods = [
        pod(
            f"p{j}",
            node=f"n{j % 4}",
            band=draw(bands),
            priority=draw(st.sampled_from([0, 1000, 100_000, 1_000_000])),
            start=f"2026-01-0{draw(st.integers(1, 9))}T00:00:00Z",
        )
        for j in range(draw(st.integers(0, 12)))
    ]
    snap = snapshot([node(f"n{i}") for i in range(4)], pods)
    uids = [*snap.by_uid, "ghost"]
    proposed = {
        f"n{i}": MetaVictims(
            draw(st.lists(st.sampled_from(uids), max_size=4, unique=True)),
            draw(st.integers(0, 2)),
        )
        for i in draw(st.lists(st.integers(0, 3), unique=True))
    }
    return snap, proposed


@settings(max_examples=300, deadline=None)
@given(preemption_cases())
def test_preemption_never_returns_a_production_victim(
    case: tuple[Snapshot, dict[str, MetaVictims]],
) -> None:
    snap, proposed = case
    result = decide.choose_victims(snap, proposed)
    assert len(result.victims) <= 1
    for node_name, chosen in result.victims.items():
        assert chosen == proposed[node_name]
        assert chosen.pod_uids, "the scheduler rejects a node without victims"
        for victim in chosen.pod_uids:
            assert snap.by_uid[victim].band != "production"
    candidates = {
        n
        for n, v in proposed.items()
        if v.pod_uids
        and all(u in snap.by_uid and snap.by_uid[u].band != "production" for u in v.pod_uids)
    }
    assert bool(result.victims) == bool(candidates)
