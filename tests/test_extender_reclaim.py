"""Pods the webhook translated onto `batch.pilotfish.io/*`: the extender's filter and pack
scores judge them by the node's batch allocatable minus what other batch pods take there,
and production never counts in that figure."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pilotfish import names
from pilotfish.extender import decide
from pilotfish.extender.decide import incoming
from tests.test_extender_builders import node, pod, snapshot

Obj = dict[str, Any]
GI = 2**30


def translated(name: str, cpu_m: int, memory: int = 0, band: str = "batch", **kw: Any) -> Obj:
    requests = {names.BATCH_CPU: str(cpu_m)}
    if memory:
        requests[names.BATCH_MEMORY] = str(memory)
    return pod(name, cpu=None, memory=None, band=band, requests=requests, **kw)


def test_incoming_reads_the_batch_figures_of_a_translated_pod() -> None:
    p = incoming(translated("t", 1500, 3 * GI))
    assert (p.cpu, p.memory, p.batch_cpu, p.batch_memory) == (0, 0, 1500, 3 * GI)
    assert p.asks_batch_cpu and p.asks_batch_memory
    # Untranslated (reclaim off in its namespace): it runs on normal allocatable.
    plain = incoming(pod("b", cpu="2", memory="1Gi", band="batch"))
    assert (plain.batch_cpu, plain.batch_memory) == (0, 0)
    assert not plain.asks_batch_cpu and not plain.asks_batch_memory
    production = incoming(pod("w", cpu="2", memory="1Gi", band="production"))
    assert (production.batch_cpu, production.batch_memory) == (0, 0)


def test_translated_pod_is_refused_where_other_batch_pods_took_the_batch_figure() -> None:
    snap = snapshot(
        [node("n1", batch_cpu=4000, batch_memory=8 * GI), node("n2", batch_cpu=4000)],
        [
            translated("a", 2500, GI, node="n1"),
            translated("b", 1000, GI, node="n1", band="best-effort"),
            pod("old", node="n1", cpu="2", memory="2Gi", band="batch"),  # untranslated
            pod("web", node="n2", cpu="30", memory="100Gi", band="production"),
        ],
    )
    result = decide.filter_nodes(incoming(translated("t", 1000, GI)), snap, ["n1", "n2"])
    assert list(result.passing) == ["n2"]
    assert result.failed == {
        "n1": "node n1 in zone-a has 500m batch.pilotfish.io/cpu free, pod asks 1 CPU"
    }
    memory = decide.filter_nodes(incoming(translated("m", 100, 7 * GI)), snap, ["n1"])
    assert memory.failed == {
        "n1": "no node in zone-a has 7Gi free in batch.pilotfish.io/memory: 1 has 6Gi"
    }


def test_translated_pods_pack_by_the_batch_figure_not_the_plain_one() -> None:
    # n1 is nearly full of production (plain cpu) but its batch figure is empty; n2 has
    # batch pods on half its batch figure: a translated pod packs onto n2.
    snap = snapshot(
        [
            node("n1", batch_cpu=8000, batch_memory=8 * GI),
            node("n2", batch_cpu=8000, batch_memory=8 * GI),
        ],
        [
            pod("web", node="n1", cpu="30", memory="120Gi", band="production"),
            translated("a", 4000, 4 * GI, node="n2"),
        ],
    )
    result = decide.score_nodes(incoming(translated("t", 1000, GI)), snap, ["n1", "n2"])
    assert result.best == "n2"
    # n1: (1/8 + 1/8)/2 -> 1; n2 the winner
    assert result.scores == [1, 10]


def test_an_assumed_translated_pod_counts_on_its_node_for_the_next_score() -> None:
    snap = snapshot([node("n1", batch_cpu=8000), node("n2", batch_cpu=8000)])
    first = incoming(translated("t1", 2000, uid="u1"))
    best = decide.score_nodes(first, snap, ["n1", "n2"]).best
    assert best == "n1"
    snap.assume(first.uid, best, None, first.cpu, first.memory, 0.0, batch_cpu=2000)
    assert snap.nodes["n1"].score_batch_cpu == 2000
    assert snap.check() == []
    second = decide.score_nodes(incoming(translated("t2", 2000)), snap, ["n2", "n1"])
    assert second.best == "n1"
    snap.forget(first.uid)
    assert snap.nodes["n1"].score_batch_cpu == 0
    assert snap.check() == []


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["production", "batch", "best-effort"]),
            st.integers(0, 4000),
            st.booleans(),
        ),
        max_size=8,
    ),
    st.integers(1, 4000),
)
def test_only_translated_pods_count_against_a_translated_pods_fit(
    bound: list[tuple[str, int, bool]], ask: int
) -> None:
    """Production never takes from the batch figure, and neither does a batch pod left on
    plain cpu: only batch.pilotfish.io/* requests do, as in kube-scheduler's own fit."""
    pods = []
    for i, (band, millis, translate) in enumerate(bound):
        if translate and band != "production":
            pods.append(translated(f"p{i}", millis, node="n1"))
        else:
            pods.append(pod(f"p{i}", node="n1", cpu=f"{millis}m", memory=None, band=band))
    snap = snapshot([node("n1", batch_cpu=8000)], pods)
    assert snap.check() == []
    taken = sum(m for b, m, translate in bound if translate and b != "production")
    result = decide.filter_nodes(incoming(translated("t", ask)), snap, ["n1"])
    assert (list(result.passing) == ["n1"]) == (8000 - taken >= ask)


def test_an_untranslated_batch_pod_is_placed_against_normal_allocatable() -> None:
    """Reclaim off in its namespace: the webhook leaves a batch pod on plain cpu and memory.
    It runs on the node's normal allocatable (kube-scheduler's fit checks that), so it
    neither needs room in the batch figure nor takes any of it from translated pods."""
    snap = snapshot(
        [node("n1", batch_cpu=2000, batch_memory=2 * GI)],
        [pod("old", node="n1", cpu="4", memory="4Gi", band="batch")],
    )
    state = snap.nodes["n1"]
    assert (state.used_cpu, state.used_batch_cpu, state.used_batch_memory) == (4000, 0, 0)
    assert snap.check() == []
    big = decide.filter_nodes(incoming(pod("b", cpu="8", memory="8Gi", band="batch")), snap, ["n1"])
    assert list(big.passing) == ["n1"] and big.failed == {} and big.unresolvable == {}
    fits = decide.filter_nodes(incoming(translated("t", 1500, GI)), snap, ["n1"])
    assert list(fits.passing) == ["n1"], fits.failed
