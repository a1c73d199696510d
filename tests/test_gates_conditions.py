"""Each gate condition type, table-driven: (satisfied, evidence) from its inputs alone."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from pilotfish.operators.gates import conditions
from pilotfish.operators.gates.conditions import GangMember, Verdict
from pilotfish.operators.gates.model import NodeView, SignalView, node_view, normalize_image
from tests.test_gates_builders import NS, signal, team_quota

# --- GateSignal ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signals", "cond", "ok", "says"),
    [
        ([signal("data", "True")], {"signalName": "data"}, True, "Ready (resourceVersion 42"),
        ([signal("data", "False")], {"signalName": "data"}, False, "not Ready (Ready=False"),
        ([signal("data", "Unknown")], {"signalName": "data"}, False, "not Ready"),
        ([], {"signalName": "data"}, False, "not found"),
        # The same name in another namespace never releases this tenant's pods.
        ([signal("data", "True", ns="other")], {"signalName": "data"}, False, "not found"),
        (None, {"signalName": "data"}, False, "not observed yet"),
        ([signal("data")], {}, False, "without signalName"),
    ],
)
def test_gate_signal(
    signals: list[SignalView] | None, cond: dict[str, Any], ok: bool, says: str
) -> None:
    index = None if signals is None else {(s.namespace, s.name): s for s in signals}
    satisfied, evidence = conditions.gate_signal(NS, cond, index)
    assert satisfied is ok
    assert says in evidence


def test_gate_signal_evidence_names_the_signal_and_its_transition() -> None:
    v = conditions.gate_signal(NS, {"signalName": "data"}, {(NS, "data"): signal("data")})
    assert f"{NS}/data" in v.evidence and "since 2030-01-01T11:59:55Z" in v.evidence


# --- Image ---------------------------------------------------------------------------------


def node(name: str, *images: str, ready: bool = True) -> NodeView:
    return NodeView(name, ready, frozenset(normalize_image(i) for i in images))


@pytest.mark.parametrize(
    ("images", "cond", "nodes", "ok"),
    [
        (["registry.example/app:1"], {}, [node("a", "registry.example/app:1")], True),
        (["registry.example/app:1"], {}, [node("a", "registry.example/app:2")], False),
        (["registry.example/app:1"], {}, [node("a", "registry.example/app:1", ready=False)], False),
        (["app:1"], {"minNodes": 2}, [node("a", "app:1"), node("b", "app:1")], True),
        (["app:1"], {"minNodes": 2}, [node("a", "app:1"), node("b")], False),
        # Every image of the pod, on the same node or not.
        (["a:1", "b:1"], {}, [node("x", "a:1"), node("y", "b:1")], True),
        (["a:1", "b:1"], {}, [node("x", "a:1")], False),
        ([], {}, [], True),
    ],
)
def test_image(images: list[str], cond: dict[str, Any], nodes: list[NodeView], ok: bool) -> None:
    satisfied, evidence = conditions.image(images, cond, nodes)
    assert satisfied is ok, evidence


def test_image_evidence_counts_ready_nodes() -> None:
    v = conditions.image(["app:1"], {"minNodes": 3}, [node("a", "app:1"), node("b", "app:1")])
    assert not v.satisfied
    assert v.evidence == "app:1 on 2/3 Ready nodes"
    assert v.summary == "image app:1 not yet on 3 Ready node(s)"


@pytest.mark.parametrize(
    ("ref", "canonical"),
    [
        ("nginx", "docker.io/library/nginx:latest"),
        ("nginx:1.27", "docker.io/library/nginx:1.27"),
        ("team/app", "docker.io/team/app:latest"),
        ("registry.example/app:1", "registry.example/app:1"),
        ("localhost:5000/app", "localhost:5000/app:latest"),
        ("nginx@sha256:abc", "docker.io/library/nginx@sha256:abc"),
    ],
)
def test_normalize_image(ref: str, canonical: str) -> None:
    assert normalize_image(ref) == canonical


def test_node_view_reads_ready_and_image_names() -> None:
    obj = {
        "metadata": {"name": "n1"},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "images": [{"names": ["docker.io/library/nginx:latest", "nginx@sha256:1"]}],
        },
    }
    v = node_view(obj)
    assert v.ready and normalize_image("nginx") in v.images


# --- Quota ---------------------------------------------------------------------------------

CPU2 = {"cpu": Fraction(2), "pods": Fraction(1)}


@pytest.mark.parametrize(
    ("team", "quotas", "used", "ok", "says"),
    [
        ("t", [team_quota("t", batch={"cpu": "10"})], {"cpu": 6}, True, "cpu 6/10 used"),
        ("t", [team_quota("t", batch={"cpu": "10"})], {"cpu": 8}, True, "cpu 8/10 used"),
        (
            "t",
            [team_quota("t", batch={"cpu": "10"})],
            {"cpu": 9},
            False,
            "cpu 9/10 used, pod asks 2",
        ),
        (
            "t",
            [team_quota("t", batch={"pods": 3})],
            {"pods": 3},
            False,
            "pods 3/3 used, pod asks 1",
        ),
        ("t", [team_quota("t", batch={"cpu": "500m"})], {}, False, "cpu 0/500m used, pod asks 2"),
        # A TeamQuota that leaves the band out does not grant it: nothing runs there.
        (
            "t",
            [team_quota("t", production={"cpu": "1"})],
            {"cpu": 99},
            False,
            "does not grant the batch band",
        ),
        # A band granted without limits admits anything.
        ("t", [team_quota("t", batch={})], {"cpu": 99}, True, "no limits"),
        # No TeamQuota at all for the team: not admitted, and the evidence says so.
        ("t", [team_quota("other", batch={"cpu": "10"})], {}, False, "team t has no TeamQuota"),
        ("", [team_quota("t", batch={"cpu": "10"})], {}, False, "pod has no team"),
        # Several TeamQuotas claiming one team: the first by name is its ledger, for every
        # reader (`pilotfish.ledger.quota_for`), so admission and release agree.
        (
            "t",
            [team_quota("t", "b", batch={"cpu": "3"}), team_quota("t", "a", batch={"cpu": "10"})],
            {"cpu": 2},
            True,
            "TeamQuota a: cpu 2/10 used",
        ),
    ],
)
def test_quota(team: str, quotas: list[Any], used: dict[str, int], ok: bool, says: str) -> None:
    used_f = {k: Fraction(v) for k, v in used.items()}
    satisfied, evidence = conditions.quota(team, "batch", CPU2, quotas, used_f)
    assert satisfied is ok, evidence
    assert says in evidence


def test_quota_summary_is_stable_while_usage_moves() -> None:
    """The pod condition message uses the summary: it must not change with every pod that
    comes and goes, or every waiting pod's status would be rewritten each time."""
    q = [team_quota("t", batch={"cpu": "10"})]
    a = conditions.quota("t", "batch", CPU2, q, {"cpu": Fraction(9)})
    b = conditions.quota("t", "batch", CPU2, q, {"cpu": Fraction(19, 2)})
    assert a.evidence != b.evidence
    assert a.summary == b.summary == "quota of team t, band batch full on cpu"


# --- Gang ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "members", "ok", "says"),
    [
        (3, [GangMember("a", True), GangMember("b", True), GangMember("c", True)], True, "3/3"),
        (3, [GangMember("a", True), GangMember("b", True)], False, "2/3 pods present"),
        (
            2,
            [GangMember("a", True), GangMember("b", False, "gates.pilotfish.io/data")],
            False,
            "b waits for gates.pilotfish.io/data",
        ),
        (2, [GangMember("a", True), GangMember("b", True), GangMember("c", True)], True, "3/2"),
    ],
)
def test_gang(size: int, members: list[GangMember], ok: bool, says: str) -> None:
    satisfied, evidence = conditions.gang("g", size, members)
    assert satisfied is ok
    assert says in evidence


def test_verdict_unpacks_as_a_pair_and_brief_prefers_the_summary() -> None:
    ok, why = Verdict(True, "because")
    assert ok and why == "because"
    assert Verdict(False, "detail", "short").brief == "short"
    assert Verdict(False, "detail").brief == "detail"
