"""The scheduler extender's HTTP server, exercised in-process without a cluster.

Requests are shaped like kube-scheduler's (Go field names on the envelope, normal
Kubernetes JSON inside), so a change that breaks the wire contract fails here first. The
snapshot behind the server is built from the same builders as the decision tests.
"""

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from pilotfish.extender import decide, server, wire
from pilotfish.extender.snapshot import Snapshot
from pilotfish.extender.wire import MAX_EXTENDER_PRIORITY, MIN_EXTENDER_PRIORITY, clamp_score
from pilotfish.tasks import TaskDied
from tests.servers import (
    client_tls,
    dev_pki,
    free_port,
    impatient_tls_server,
    seconds_until_closed,
    serving,
    wait_listening,
)
from tests.test_extender_builders import node, pod, snapshot

Client = TestClient[web.Request, web.Application]

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "web-0", "namespace": "team-a", "uid": "pod-uid-1"},
    "spec": {"containers": [{"name": "web", "image": "nginx"}]},
}
NODES = [f"node-{i}" for i in range(5)]
# Victims the preempt tests name, all batch pods the snapshot knows.
VICTIM_UIDS = ("a", "b", "c")


def cluster() -> Snapshot:
    return snapshot(
        [node(name, f"zone-{i % 3}") for i, name in enumerate(NODES)],
        [pod(f"v-{u}", node="node-0", uid=u, band="batch") for u in VICTIM_UIDS],
    )


def requests_total(verb: str, outcome: str) -> float:
    value = REGISTRY.get_sample_value(
        "pilotfish_extender_requests_total", {"verb": verb, "outcome": outcome}
    )
    return value or 0.0


def observed(verb: str) -> float:
    value = REGISTRY.get_sample_value(
        "pilotfish_extender_request_duration_seconds_count", {"verb": verb}
    )
    return value or 0.0


def victim(uid: str) -> dict[str, Any]:
    return {"metadata": {"name": f"p-{uid}", "namespace": "team-b", "uid": uid}, "spec": {}}


@pytest.fixture
def snap() -> Snapshot:
    return cluster()


@pytest.fixture
async def client(snap: Snapshot) -> AsyncIterator[Client]:
    app = server.make_app(server.Extender(snap, clock=lambda: 1000.0))
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def test_filter_returns_every_node_and_counts(client: Client) -> None:
    before, timed = requests_total("filter", "ok"), observed("filter")
    resp = await client.post("/filter", json={"Pod": POD, "Nodes": None, "NodeNames": NODES})
    assert resp.status == 200
    assert resp.content_type == "application/json"
    assert await resp.json() == {
        "NodeNames": NODES,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    assert requests_total("filter", "ok") == before + 1
    assert observed("filter") == timed + 1


async def test_filter_with_full_nodes_answers_with_nodes(client: Client) -> None:
    """nodeCacheCapable false: the scheduler reads Nodes.items back and ignores NodeNames."""
    items = [{"metadata": {"name": name}, "status": {}} for name in NODES[:2]]
    resp = await client.post("/filter", json={"Pod": POD, "Nodes": {"items": items}})
    assert resp.status == 200
    body = await resp.json()
    assert body["Nodes"]["items"] == items
    assert "NodeNames" not in body
    assert body["Error"] == ""


async def test_filter_with_no_candidates(client: Client) -> None:
    resp = await client.post("/filter", json={"Pod": POD, "NodeNames": []})
    assert resp.status == 200
    assert (await resp.json())["NodeNames"] == []


async def test_prioritize_scores_every_node_in_range(client: Client) -> None:
    before = requests_total("prioritize", "ok")
    resp = await client.post("/prioritize", json={"Pod": POD, "Nodes": None, "NodeNames": NODES})
    assert resp.status == 200
    body = await resp.json()
    assert [entry["Host"] for entry in body] == NODES
    assert all(MIN_EXTENDER_PRIORITY <= entry["Score"] <= MAX_EXTENDER_PRIORITY for entry in body)
    assert all(set(entry) == {"Host", "Score"} for entry in body)
    assert requests_total("prioritize", "ok") == before + 1


@given(st.integers())
def test_clamp_score_stays_in_range_and_keeps_valid_scores(score: int) -> None:
    clamped = clamp_score(score)
    assert MIN_EXTENDER_PRIORITY <= clamped <= MAX_EXTENDER_PRIORITY
    if MIN_EXTENDER_PRIORITY <= score <= MAX_EXTENDER_PRIORITY:
        assert clamped == score
    elif score < MIN_EXTENDER_PRIORITY:
        assert clamped == MIN_EXTENDER_PRIORITY
    else:
        assert clamped == MAX_EXTENDER_PRIORITY


@given(st.lists(st.tuples(st.text(), st.integers())))
def test_encoded_priorities_are_valid_json_and_clamped(pairs: list[tuple[str, int]]) -> None:
    """Scoring rules may return any integer; the wire never carries one out of range, and
    hand-built JSON must survive any host name, quotes and non-ASCII included."""
    hosts, scores = [h for h, _ in pairs], [s for _, s in pairs]
    encoded = json.loads(wire.encode_host_priorities(hosts, scores))
    assert encoded == [{"Host": h, "Score": clamp_score(s)} for h, s in pairs]
    assert all(0 <= e["Score"] <= 10 for e in encoded)


def test_encoding_priorities_needs_a_score_per_host() -> None:
    with pytest.raises(ValueError, match="2 hosts but 1 scores"):
        wire.encode_host_priorities(["a", "b"], [1])


async def test_preempt_converts_full_victims_to_meta_and_keeps_the_best_node(
    client: Client,
) -> None:
    before = requests_total("preempt", "ok")
    resp = await client.post(
        "/preempt",
        json={
            "Pod": POD,
            "NodeNameToVictims": {
                "node-0": {"Pods": [victim("a"), victim("b")], "NumPDBViolations": 1},
                "node-1": {"Pods": [victim("c")], "NumPDBViolations": 0},
            },
            "NodeNameToMetaVictims": None,
        },
    )
    assert resp.status == 200
    assert await resp.json() == {
        "NodeNameToMetaVictims": {"node-1": {"Pods": [{"UID": "c"}], "NumPDBViolations": 0}}
    }
    assert requests_total("preempt", "ok") == before + 1


async def test_preempt_passes_meta_victims_through_and_drops_empty_nodes(client: Client) -> None:
    """The scheduler rejects a returned node with no victims, so such nodes are dropped."""
    meta = {
        "node-0": {"Pods": [{"UID": "a"}], "NumPDBViolations": 2},
        "node-1": {"Pods": [], "NumPDBViolations": 0},
        "node-2": None,
    }
    resp = await client.post(
        "/preempt", json={"Pod": POD, "NodeNameToVictims": None, "NodeNameToMetaVictims": meta}
    )
    assert resp.status == 200
    assert await resp.json() == {
        "NodeNameToMetaVictims": {"node-0": {"Pods": [{"UID": "a"}], "NumPDBViolations": 2}}
    }


GARBAGE: list[tuple[str, bytes | str, str]] = [
    ("filter", b"", "empty"),
    ("filter", b"{not json", "not valid JSON"),
    ("filter", b"\xff\xfe", "not UTF-8"),
    ("filter", b"[" * 100 + b"]" * 100, "nests arrays and objects 100 levels deep"),
    ("filter", b'{"Pod": {}, "NodeNames": [1e999]}', "number 1e999 overflows"),
    (
        "filter",
        json.dumps({"Pod": {"metadata": {"labels": []}}, "NodeNames": NODES}),
        "Pod.metadata.labels: must be an object, got array",
    ),
    (
        "prioritize",
        json.dumps(
            {
                "Pod": {"spec": {"containers": [{"resources": {"requests": {"cpu": "lots"}}}]}},
                "NodeNames": NODES,
            }
        ),
        "Pod.spec.containers[0].resources.requests.cpu: must be a quantity",
    ),
    (
        "preempt",
        json.dumps({"Pod": {"spec": {"priority": "high"}}, "NodeNameToMetaVictims": {}}),
        "Pod.spec.priority: must be an integer, got string 'high'",
    ),
    ("filter", "[]", "request body must be a JSON object"),
    ("filter", json.dumps({"NodeNames": NODES}), "Pod is missing"),
    ("filter", json.dumps({"Pod": POD, "Nodes": None, "NodeNames": None}), "NodeNames is missing"),
    ("filter", json.dumps({"Pod": "web-0", "NodeNames": NODES}), "Pod must be a JSON object"),
    ("filter", json.dumps({"Pod": POD, "NodeNames": "node-0"}), "NodeNames must be a list"),
    ("prioritize", json.dumps({"Pod": POD, "NodeNames": ["a", 1]}), "NodeNames[1]"),
    (
        "prioritize",
        json.dumps({"Pod": POD, "Nodes": {"items": [{"metadata": {}}]}}),
        "Nodes.items[0].metadata.name",
    ),
    ("preempt", json.dumps({"Pod": POD}), "NodeNameToVictims or NodeNameToMetaVictims"),
    (
        "preempt",
        json.dumps({"Pod": POD, "NodeNameToVictims": {"n": {"Pods": [{"metadata": {}}]}}}),
        "NodeNameToVictims[n].Pods[0].metadata.uid",
    ),
    (
        "preempt",
        json.dumps(
            {
                "Pod": POD,
                "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": "a"}], "NumPDBViolations": "1"}},
            }
        ),
        "NumPDBViolations must be an integer",
    ),
]


@pytest.mark.parametrize(("verb", "body", "message"), GARBAGE)
async def test_malformed_requests_get_400_naming_the_problem(
    client: Client, verb: str, body: bytes | str, message: str
) -> None:
    before = requests_total(verb, "bad_request")
    resp = await client.post(f"/{verb}", data=body, headers={"Content-Type": "application/json"})
    assert resp.status == 400
    text = await resp.text()
    assert message in text
    assert text.startswith(f"{verb}: ")
    assert requests_total(verb, "bad_request") == before + 1


async def test_a_bug_in_a_decision_is_a_500_and_counted(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(pod: Any, snap: Any, node_names: Any) -> decide.FilterResult:
        raise RuntimeError("boom")

    monkeypatch.setattr(decide, "filter_nodes", broken)
    before = requests_total("filter", "error")
    resp = await client.post("/filter", json={"Pod": POD, "NodeNames": NODES})
    assert resp.status == 500
    assert "boom" not in await resp.text()  # internals stay in the log
    assert requests_total("filter", "error") == before + 1


async def test_wrong_method_is_rejected(client: Client) -> None:
    resp = await client.get("/filter")
    assert resp.status == 405


async def test_healthz_and_metrics(client: Client) -> None:
    await client.post("/filter", json={"Pod": POD, "NodeNames": NODES})
    health = await client.get("/healthz")
    assert health.status == 200
    assert await health.text() == "ok"
    resp = await client.get("/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    text = await resp.text()
    assert 'pilotfish_extender_requests_total{outcome="ok",verb="filter"}' in text
    assert "pilotfish_extender_request_duration_seconds_bucket" in text


async def test_serve_answers_until_cancelled() -> None:
    port = free_port()
    task = asyncio.create_task(server.serve_snapshot("127.0.0.1", port, cluster()))
    try:
        await wait_listening(task, port)
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/filter"
            async with session.post(url, json={"Pod": POD, "NodeNames": NODES}) as resp:
                assert resp.status == 200
                assert (await resp.json())["NodeNames"] == NODES
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_only_a_client_signed_by_the_client_ca_is_served(tmp_path: Path) -> None:
    """kube-scheduler presents its own certificate (the extender's tlsConfig); nobody else
    gets to filter, score or record an assumed placement."""
    certs = dev_pki(tmp_path)
    tls = server.Tls(str(certs.cert("extender")), str(certs.key("extender")), str(certs.ca_cert))
    health = free_port()

    async def start(port: int) -> None:
        await server.serve_snapshot("127.0.0.1", port, cluster(), tls=tls, health_port=health)

    async with serving(start, health) as port:
        url = f"https://127.0.0.1:{port}/prioritize"
        body = {"Pod": POD, "NodeNames": NODES}
        connector = aiohttp.TCPConnector(ssl=client_tls(certs, "kube-scheduler"))
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.post(url, json=body) as resp,
        ):
            assert resp.status == 200
            assert [h["Host"] for h in await resp.json()] == NODES
        before = requests_total("prioritize", "ok")
        for context in (client_tls(certs, None), client_tls(dev_pki(tmp_path / "other"))):
            context.load_verify_locations(cafile=str(certs.ca_cert))
            connector = aiohttp.TCPConnector(ssl=context)
            async with aiohttp.ClientSession(connector=connector) as session:
                with pytest.raises(aiohttp.ClientError):
                    async with session.post(url, json=body) as resp:
                        await resp.read()
        assert requests_total("prioritize", "ok") == before  # never reached the handler
        # Probes and scrapes use the plain health port, which serves no verb.
        async with aiohttp.ClientSession() as session:
            for path in ("/healthz", "/readyz", "/metrics"):
                async with session.get(f"http://127.0.0.1:{health}{path}") as resp:
                    assert resp.status == 200, path
            async with session.post(f"http://127.0.0.1:{health}/prioritize", json=body) as resp:
                assert resp.status == 404


async def test_a_half_sent_request_is_closed(tmp_path: Path) -> None:
    certs = dev_pki(tmp_path)
    start = impatient_tls_server(server.make_app(server.Extender(cluster())), certs, "extender")
    async with serving(start) as port:
        sent = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Le"
        assert await seconds_until_closed(port, sent, client_tls(certs), limit=5) < 3


# --- the snapshot behind the verbs ------------------------------------------------------


def samples(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_before_sync_filter_and_prioritize_fail_and_preempt_evicts_nobody() -> None:
    """An ignorable extender that errors is skipped, so the scheduler places the pod alone;
    for preempt an error would also skip the production veto, so it answers "nobody"."""
    snap = cluster()
    snap.synced = False
    async with TestClient(TestServer(server.make_app(server.Extender(snap)))) as c:
        before = requests_total("filter", "unavailable")
        resp = await c.post("/filter", json={"Pod": POD, "NodeNames": NODES})
        assert resp.status == 503
        assert "not synced" in await resp.text()
        assert requests_total("filter", "unavailable") == before + 1
        resp = await c.post("/prioritize", json={"Pod": POD, "NodeNames": NODES})
        assert resp.status == 503
        meta = {"node-0": {"Pods": [{"UID": "a"}], "NumPDBViolations": 0}}
        resp = await c.post("/preempt", json={"Pod": POD, "NodeNameToMetaVictims": meta})
        assert resp.status == 200
        assert await resp.json() == {"NodeNameToMetaVictims": {}}
        assert (await c.get("/readyz")).status == 503
        snap.synced = True
        assert (await c.get("/readyz")).status == 200
        resp = await c.post("/filter", json={"Pod": POD, "NodeNames": NODES})
        assert resp.status == 200


def replica(name: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": f"uid-{name}",
            "labels": {"pilotfish.io/band": "production", "pilotfish.io/workload": "web"},
        },
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
    }


async def test_replicas_scored_back_to_back_spread_before_any_binding_is_seen(
    client: Client, snap: Snapshot
) -> None:
    """The scheduler binds asynchronously: the next replica is scored before the watch
    reports the last binding. Assumed placements keep the spread anyway."""
    winners = []
    for i in range(3):
        resp = await client.post(
            "/prioritize", json={"Pod": replica(f"web-{i}"), "NodeNames": NODES}
        )
        body = await resp.json()
        (top,) = [e["Host"] for e in body if e["Score"] == MAX_EXTENDER_PRIORITY]
        winners.append(snap.nodes[top].zone)
    assert sorted(winners) == ["zone-0", "zone-1", "zone-2"]
    assert len(snap.assumed) == 3
    # A retry of the same pod replaces its own assumption rather than adding another.
    await client.post("/prioritize", json={"Pod": replica("web-0"), "NodeNames": NODES})
    assert len(snap.assumed) == 3
    assert snap.check() == []


async def test_filter_reasons_reach_the_scheduler_in_its_maps(client: Client) -> None:
    gpu_pod = pod("train", gpu=8, band="batch")
    before = samples("pilotfish_extender_rejected_nodes_total", cause="gpu")
    resp = await client.post("/filter", json={"Pod": gpu_pod, "NodeNames": NODES[:2]})
    body = await resp.json()
    assert body["NodeNames"] == []
    assert body["Error"] == ""
    summary = "no node in zone-0 or zone-1 has 8 free GPUs (nvidia.com/gpu): "
    assert body["FailedAndUnresolvableNodes"] == {
        "node-0": summary + "zone-0: 1 has none; zone-1: 1 has none",
        "node-1": summary + "zone-0: 1 has none; zone-1: 1 has none",
    }
    assert samples("pilotfish_extender_rejected_nodes_total", cause="gpu") == before + 2


async def test_preempt_veto_is_counted(client: Client, snap: Snapshot) -> None:
    snap.on_pod("ADDED", pod("db", node="node-1", uid="prod", band="production"), None)
    before = samples("pilotfish_extender_preemption_vetoes_total", cause="production_victim")
    meta = {"node-1": {"Pods": [{"UID": "prod"}], "NumPDBViolations": 0}}
    resp = await client.post("/preempt", json={"Pod": POD, "NodeNameToMetaVictims": meta})
    assert await resp.json() == {"NodeNameToMetaVictims": {}}
    after = samples("pilotfish_extender_preemption_vetoes_total", cause="production_victim")
    assert after == before + 1


async def test_serve_stops_when_its_feed_stops() -> None:
    async def feed() -> None:
        raise ValueError("informer bug")

    with pytest.raises(TaskDied, match=r"snapshot feed.*informer bug"):
        await server.serve_snapshot("127.0.0.1", free_port(), Snapshot(), feed())

    async def quiet() -> None:
        return None

    with pytest.raises(TaskDied, match=r"snapshot feed.*ended without an error"):
        await server.serve_snapshot("127.0.0.1", free_port(), Snapshot(), quiet())
