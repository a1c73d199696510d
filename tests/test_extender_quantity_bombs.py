"""Quantity bombs in pods the extender sees: bounded cost, no 500, the bomb fits nowhere.

A pod admitted where the webhooks do not apply can ask for `cpu: 1e400` (an OverflowError
in scoring once) or `10e9999999` (10**9999999 computed on the event loop once). Bound to a
node, or being placed, it must cost what any pod costs.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from pilotfish import quantity
from pilotfish.extender import resources, server
from tests.test_extender_builders import node, pod, snapshot

Client = TestClient[web.Request, web.Application]
NODES = [f"node-{i}" for i in range(3)]
BOMBS = ["1e400", "10e9999999", "9" * 60, "8Ei"]


def incoming(cpu: str) -> dict[str, Any]:
    return pod("placed", cpu=cpu)


@pytest.mark.parametrize("bomb", [*BOMBS, "9" * 100000])
def test_a_bomb_saturates_quickly(bomb: str) -> None:
    started = time.perf_counter()
    asks = resources.pod_requests({"containers": [{"resources": {"requests": {"cpu": bomb}}}]})
    assert time.perf_counter() - started < 0.25
    assert asks[resources.CPU] >= quantity.MAX * 1000


@pytest.mark.parametrize("bomb", BOMBS)
async def test_bound_bombs_and_placed_bombs_get_answers_not_errors(bomb: str) -> None:
    snap = snapshot(
        [node(name) for name in NODES],
        [
            pod("bomb-cpu", node="node-0", cpu=bomb),
            pod("bomb-memory", node="node-1", memory=bomb),
        ],
    )
    app = server.make_app(server.Extender(snap, clock=lambda: 1000.0))
    async with TestClient(TestServer(app)) as client:
        for cpu in ("1", bomb):  # a pod beside the bombs, and a bomb being placed
            body = {"Pod": incoming(cpu), "NodeNames": NODES}
            filtered = await client.post("/filter", json=body)
            assert filtered.status == 200
            assert (await filtered.json())["Error"] == ""
            scored = await client.post("/prioritize", json=body)
            assert scored.status == 200
            scores = await scored.json()
            assert [entry["Host"] for entry in scores] == NODES
            assert all(0 <= entry["Score"] <= 100 for entry in scores)
    # Scores read how full each node is: a bomb's node is as full as a node can be.
    full = [snap.nodes[name].fullness() for name in NODES]
    assert full[0] == full[1] == 1.0 > full[2]
