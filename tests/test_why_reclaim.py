"""`kubectl pilotfish why` for a batch pod waiting for reclaimed capacity: what it asks (and
asked before translation), the most any node offers free and where, stale nodes."""

from __future__ import annotations

import datetime
import io
import json
from typing import Any

from pilotfish import names
from pilotfish.cli import why
from pilotfish.cli.whyreclaim import amount, reclaim_sentences, short_of
from pilotfish.kube.rest import NODES, PODS
from pilotfish.timeutil import FakeClock
from tests.fakeapi import FakeApi

NOW = datetime.datetime(2026, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)
GI = 2**30
INSUFFICIENT = (
    "0/3 nodes are available: 3 Insufficient batch.pilotfish.io/cpu. preemption: 0/3 nodes "
    "are available: 3 No preemption victims found for incoming pod."
)
ORIGINAL = {
    "containers": {"main": {"requests": {"cpu": "1500m", "memory": "1Gi"}, "limits": {"cpu": "2"}}},
    "initContainers": {},
}


def batch_pod(
    name: str, cpu_m: int, node: str | None = None, message: str | None = INSUFFICIENT
) -> dict[str, Any]:
    batch = {names.BATCH_CPU: str(cpu_m), names.BATCH_MEMORY: str(GI)}
    status: dict[str, Any] = {"phase": "Running" if node else "Pending"}
    if message is not None and node is None:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": "2026-03-01T11:59:00Z",
            }
        ]
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "resources": {"requests": batch, "limits": batch}}]
    }
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": "shop",
            "uid": f"u-{name}",
            "labels": {names.LABEL_BAND: "batch"},
            "annotations": {names.ANNOTATION_ORIGINAL_RESOURCES: json.dumps(ORIGINAL)},
        },
        "spec": spec,
        "status": status,
    }


def node(name: str, batch_cpu: int | None, state: str | None = None) -> dict[str, Any]:
    allocatable: dict[str, str] = {"cpu": "32", "memory": "128Gi"}
    if batch_cpu is not None:
        allocatable[names.BATCH_CPU] = str(batch_cpu)
        allocatable[names.BATCH_MEMORY] = str(64 * GI)
    meta: dict[str, Any] = {"name": name, "annotations": {}}
    conditions: list[dict[str, Any]] = []
    if state is not None:
        meta["annotations"][names.ANNOTATION_RECLAIM] = json.dumps({"state": state})
        if state != "Measured":
            conditions.append(
                {
                    "type": names.CONDITION_BATCH_CAPACITY,
                    "status": "False",
                    "reason": state,
                    "message": "no fresh sample for 4m; decaying toward 0",
                }
            )
    return {"metadata": meta, "status": {"allocatable": allocatable, "conditions": conditions}}


def test_short_of_reads_the_scheduler_and_the_extender() -> None:
    assert short_of([INSUFFICIENT]) == [names.BATCH_CPU]
    extender = (
        "0/2 nodes are available: 2 no node in zone-a has 2Gi free in batch.pilotfish.io/memory"
    )
    assert short_of([extender]) == [names.BATCH_MEMORY]
    assert short_of(["0/3 nodes are available: 3 Insufficient cpu."]) == []


def test_amounts_are_cores_and_binary_bytes() -> None:
    assert amount(names.BATCH_CPU, 1500) == "1.5 cores"
    assert amount(names.BATCH_CPU, 250) == "0.25 cores"
    assert amount(names.BATCH_CPU, 1000) == "1 core"
    assert amount(names.BATCH_CPU, 4000) == "4 cores"
    assert amount(names.BATCH_MEMORY, 3 * GI) == "3Gi"


def test_the_sentences_name_the_ask_the_best_node_and_the_stale_ones() -> None:
    waiting = batch_pod("t", 1500)
    nodes = [
        node("n1", 4000, "Measured"),
        node("n2", 2000, "MetricsStale"),
        node("n3", None),
    ]
    bound = [batch_pod("a", 3000, "n1"), batch_pod("b", 1000, "n2"), waiting]
    lines = reclaim_sentences(waiting, [names.BATCH_CPU], nodes, bound)
    text = "\n".join(lines)
    assert "It waits for reclaimed batch capacity" in lines[0]
    assert "it asks batch.pilotfish.io/cpu 1.5 cores, batch.pilotfish.io/memory 1Gi." in lines[0]
    assert (
        "Before it was moved onto reclaimed capacity it asked: container main requests "
        "cpu 1500m, memory 1Gi (limits cpu 2)." in text
    )
    # n1: 4 - 3 = 1 free; n2: 2 - 1 = 1 free: a tie, by name
    assert (
        "batch.pilotfish.io/cpu: the pod asks 1.5 cores; the most any node offers free is "
        "1 core on node n1 (batch allocatable 4 cores, 3 cores allocated to batch pods)."
    ) in text
    assert (
        "Node n2's batch figure is not measured now (BatchCapacity False, MetricsStale: no "
        "fresh sample for 4m; decaying toward 0)." in text
    )
    assert "n1's batch figure" not in text and "n3" not in text


def test_no_node_advertising_batch_capacity_says_so() -> None:
    lines = reclaim_sentences(batch_pod("t", 500), [names.BATCH_CPU], [node("n1", None)], [])
    assert any("No node offers batch.pilotfish.io/cpu yet" in line for line in lines)


def test_the_annotation_state_alone_marks_a_node_stale() -> None:
    n = node("n1", 500)
    n["metadata"]["annotations"][names.ANNOTATION_RECLAIM] = json.dumps(
        {"state": "PrometheusUnavailable"}
    )
    lines = reclaim_sentences(batch_pod("t", 1000), [names.BATCH_CPU], [n], [])
    assert (
        "Node n1's batch figure is not measured now (batch.pilotfish.io/reclaim state "
        "PrometheusUnavailable: decaying toward 0)." in lines
    )


def test_other_pods_get_no_reclaim_lines() -> None:
    other = batch_pod("t", 1000, message="0/3 nodes are available: 3 Insufficient cpu.")
    assert reclaim_sentences(other, short_of(["Insufficient cpu"]), [node("n1", 1000)], []) == []


async def test_why_prints_the_reclaim_layer() -> None:
    api = FakeApi()
    api.put(PODS.path("shop", "t"), batch_pod("t", 1500))
    api.put(PODS.path("shop", "a"), batch_pod("a", 3500, "n1"))
    api.put(NODES.path(None, "n1"), node("n1", 4000, "Measured"))
    out, err = io.StringIO(), io.StringIO()
    assert await why.run(api, "shop", "t", FakeClock(NOW), out, err) == 0, err.getvalue()
    text = out.getvalue()
    assert "Pod shop/t is unschedulable" in text
    assert "the most any node offers free is 0.5 cores on node n1" in text
    assert "Before it was moved onto reclaimed capacity it asked" in text

    # A tenant cannot list nodes: it still hears what it waits for, and a warning why not more.
    api.fail_next("GET", NODES.path(), 403)
    out, err = io.StringIO(), io.StringIO()
    assert await why.run(api, "shop", "t", FakeClock(NOW), out, err) == 0
    assert "It waits for reclaimed batch capacity: it asks batch.pilotfish.io/cpu 1.5 cores" in (
        out.getvalue()
    )
    assert "cannot read nodes and pods for batch capacity (403)" in err.getvalue()
