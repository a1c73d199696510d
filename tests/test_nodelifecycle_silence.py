"""Machine failure by lease silence, on the real controller over the in-memory API with a
fake clock: unreachable at exactly the timeout, pods out of rotation, eviction after the
wait (never of at-most-one, DaemonSet or mirror pods), the return, and a restarted process
that counts silence afresh (late, never early)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pilotfish.nodesilence import MODE_UPSTREAM, SilenceSettings
from pilotfish.operators.nodelifecycle.model import TAINT_NOT_READY, TAINT_UNREACHABLE
from pilotfish.workloads import DISRUPTION_NODE_LOST
from tests.nodelifecycle_harness import Cluster, metric, start

NOSCHED = (TAINT_UNREACHABLE, "NoSchedule")
NOEXEC = (TAINT_UNREACHABLE, "NoExecute")
ZONE = "unit-lost-a"
HEALTHY = tuple(f"h{i}" for i in range(11))


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    """One node `lost` among 12 in a zone, a second zone; pods of every kind on `lost`."""
    c = await start()
    c.add_node("lost", ZONE)
    for h in HEALTHY:
        c.add_node(h, ZONE)
    c.add_node("other", "unit-lost-b")
    c.add_pod("web", "lost")
    c.add_pod("api", "lost")
    c.add_pod("one", "lost", kind="ServiceWorkload", **{"pilotfish.io/epoch": "3"})
    # A tenant's raw pod with the annotation but no ServiceWorkload behind it: ordinary.
    c.add_pod("forged", "lost", **{"pilotfish.io/epoch": "3"})
    c.add_pod("ds", "lost", kind="DaemonSet")
    c.add_pod("mirror", "lost", kind="Node", **{"kubernetes.io/config.mirror": "abc"})
    c.add_pod("elsewhere", "h0")
    c.renew("lost", "other", *HEALTHY)
    await c.sweep()
    yield c
    await c.stop()


async def test_unreachable_at_the_timeout_then_eviction_after_the_wait(cluster: Cluster) -> None:
    c = cluster
    alive = ("other", *HEALTHY)
    await c.at(39.9, renewing=alive)
    assert c.ready(c.node("lost")) == ("True", "KubeletReady")
    assert c.taints("lost") == []
    assert c.ready(c.pod("web"))[0] == "True"
    wake = c.results["lost"].after
    assert wake is not None and 0 < wake <= 0.2, "wakes at the timeout, not a poll later"

    await c.at(0.1, renewing=alive)  # 40 s of silence
    assert c.ready(c.node("lost")) == ("Unknown", "NodeStatusUnknown")
    conds = {x["type"]: x["status"] for x in c.node("lost")["status"]["conditions"]}
    assert conds["MemoryPressure"] == "False", "the other conditions are merged, not dropped"
    assert sorted(c.taints("lost")) == sorted([NOSCHED, NOEXEC])
    noexec = next(t for t in c.node("lost")["spec"]["taints"] if t["effect"] == "NoExecute")
    assert noexec["timeAdded"] == "2026-01-01T00:00:40Z"
    for name in ("web", "api", "one", "ds", "mirror"):
        assert c.ready(c.pod(name)) == ("False", "NodeUnreachable"), name
    assert c.ready(c.pod("elsewhere"))[0] == "True"
    assert c.taints("h0") == []
    assert metric("pilotfish_nodelifecycle_silent_nodes", zone=ZONE) == 1
    assert metric("pilotfish_nodelifecycle_zone_brake", zone=ZONE) in (None, 0)
    (event,) = await c.events("NodeUnreachable")
    assert event["regarding"]["name"] == "lost" and "40s" in event["note"]

    before = metric("pilotfish_nodelifecycle_evictions_total", reason=DISRUPTION_NODE_LOST) or 0
    await c.at(59.9, renewing=alive)
    assert not any(c.evicted(p) for p in ("web", "api", "one", "ds", "mirror"))
    await c.at(0.1, renewing=alive)  # 100 s
    for name in ("web", "api", "forged"):
        p = c.pod(name)
        assert p["metadata"]["deletionTimestamp"], f"{name} deleted"
        target = next(x for x in p["status"]["conditions"] if x["type"] == "DisruptionTarget")
        assert (target["status"], target["reason"]) == ("True", DISRUPTION_NODE_LOST)
    for name in ("one", "ds", "mirror", "elsewhere"):
        assert not c.evicted(name), f"{name} is never evicted"
    deletes = [w for w in c.api.writes("/pods/") if w.method == "DELETE"]
    assert len(deletes) == 3  # web, api and the forged one
    assert all(w.body["preconditions"]["uid"] for w in deletes), "deletes by uid"
    after = metric("pilotfish_nodelifecycle_evictions_total", reason=DISRUPTION_NODE_LOST)
    assert after == before + 3
    (evicted,) = await c.events("PodsEvicted")
    assert "ns/web" in evicted["note"] and "ns/one" in evicted["note"]  # named as kept

    await c.at(300, renewing=alive)
    assert len([w for w in c.api.writes("/pods/") if w.method == "DELETE"]) == 3, "once"


async def test_a_returning_node_loses_its_unreachable_taints(cluster: Cluster) -> None:
    c = cluster
    await c.at(45, renewing=("other", *HEALTHY))
    assert NOEXEC in c.taints("lost")
    c.renew("lost")  # the lease renews again
    await c.sweep()
    assert c.taints("lost") == [NOSCHED], "NoExecute lifted; NoSchedule follows Ready"
    node = c.node("lost")  # the agent reports Ready again
    node["status"]["conditions"][0] = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
    c.api.put("/api/v1/nodes/lost", node)
    await c.sweep()
    assert c.taints("lost") == []
    await c.at(100, renewing=("lost", "other", *HEALTHY))
    assert not c.evicted("web"), "a node that came back is not evicted"


async def test_a_restarted_process_counts_silence_afresh(cluster: Cluster) -> None:
    c = cluster
    await c.at(50, renewing=("other", *HEALTHY))
    assert NOEXEC in c.taints("lost")
    await c.stop()  # kill -9: the new process knows nothing but what the API says
    c2 = await start(c.api, c.clock)
    c2.renew("lost", "other", *HEALTHY)  # the leases as its informer first lists them
    await c2.sweep()
    assert NOEXEC in c2.taints("lost"), "not lifted for a node not seen renewing"
    await c2.at(99, renewing=("other", *HEALTHY))
    assert not c2.evicted("web"), "the new clock: 99 s, not 149 s, of silence"
    await c2.at(1, renewing=("other", *HEALTHY))
    assert c2.evicted("web")
    await c2.stop()


async def test_upstream_mode_tracks_silence_and_writes_nothing() -> None:
    c = await start(settings=SilenceSettings(mode=MODE_UPSTREAM))
    c.add_node("n", "unit-upstream")
    c.add_node("m", "unit-upstream")
    # kwok's initial taint: in upstream mode upstream's controller lifts it, not Pilotfish.
    node = c.node("n")
    node["spec"]["taints"] = [{"key": TAINT_NOT_READY, "effect": "NoSchedule"}]
    c.api.put("/api/v1/nodes/n", node)
    c.add_pod("p", "n")
    c.renew("n", "m")
    await c.sweep()
    await c.at(200, renewing=("m",))
    assert c.node_writes() == 0
    assert c.ready(c.pod("p"))[0] == "True"
    assert c.rt.silence.silent_for("n") == pytest.approx(200)
    assert c.ctrl.zones.is_lost("n")
    await c.stop()


async def test_pods_bound_to_a_lost_node_later_are_marked_too(cluster: Cluster) -> None:
    c = cluster
    await c.at(41, renewing=("other", *HEALTHY))
    c.add_pod("late", "lost")
    await c.sweep()
    assert c.ready(c.pod("late")) == ("False", "NodeUnreachable")


async def test_a_stale_pod_copy_is_refused_and_decided_again(cluster: Cluster) -> None:
    c = cluster
    path = "/api/v1/namespaces/ns/pods/web/status"

    def kubelet_writes() -> None:
        p = c.pod("web")
        p["metadata"]["labels"] = {"touched": "yes"}
        c.api.put("/api/v1/namespaces/ns/pods/web", p)

    c.api.before("PATCH", path, kubelet_writes)
    c.clock.advance(40)
    c.renew("other", *HEALTHY)
    await c.api.settle()
    result = await c.ctrl.reconcile("lost")
    assert result.retry or result.after is not None
    await c.sweep()
    assert c.ready(c.pod("web")) == ("False", "NodeUnreachable")
    assert c.pod("web")["metadata"]["labels"] == {"touched": "yes"}
    assert len([w for w in c.api.writes(path) if w.method == "PATCH"]) == 2, "refused, redone"
