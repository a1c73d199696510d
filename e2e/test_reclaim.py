"""Reclaim against the real control plane: batch runs on what production reserved but does
not use, measured by a real Prometheus from kwok's emulated usage, and gives it back.

Three kwok nodes of this module's own (`e2e.reclaim.reclaim_nodes`: 8 cores, 40 GiB,
tainted so only these tests' pods land there), each with two production pods of a
ServiceWorkload asking 2800m and 14 GiB and using 1600m and 8 GiB: production requests
70 % of the node and uses 40 %. With the 10 % margin the expected figure is

    batch cpu    = 8000m - 2 x 1600m - 800m = 4000m   (reclaimed: 4000m - 2400m unreserved)
    batch memory = 40Gi  - 2 x 8Gi   - 4Gi  = 20Gi    (reclaimed: 20Gi - 12Gi)

The cluster runs Prometheus scraping every 5 s and the reclaim controller every 15 s over a
2-minute window, stale after 30 s (`e2e.conftest.E2E_RECLAIM_ENV`). With a constant usage
the p95 equals it whatever part of the window has data, so no test waits a whole window.

Memory is a gauge and exact. CPU comes through `rate()` of kwok's cumulative counter, which
kwok advances only when scraped (by the interval since its last scrape times the usage then)
while Prometheus stamps the sample at the scrape's start: the rate carries the scrape
latency's jitter (well under 1 % of the 3.2 cores). And the controller rewrites a figure
only when it moves by more than 2 % of allocatable (160m here), so the figure on the node
may trail the measurement by that much. CPU figures are asserted within CPU_TOLERANCE
(200m: 160m + 40m), the annotation's own arithmetic to the millicore.

The tests run in order on one set-up: (a) the figure, (b) batch placed on it beside
production's own fit, (c) production's usage rising to its request taking the capacity
back, (d) Prometheus stopped and started again (last: every node decays meanwhile).

Marked `lostnodes`: the module waits out reclaim cycles (about four minutes in all) and
stops the cluster's Prometheus, so it runs on the cluster of its own that `make e2e` runs
beside the rest of the suite, whose Prometheus tests it would otherwise disturb.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

import pytest
from kubernetes import client as k8s

from benchmarks.probes import reclaim as probe
from e2e import batch
from e2e import maintenance as nm
from e2e import reclaim as rc
from e2e.conftest import Env, Tenant, team_namespace, tenant_of, wait_until
from e2e.test_serviceworkload import create_sw, service_workload, template
from pilotfish import names
from pilotfish.devcluster import supervisor
from pilotfish.workloads import LABEL_BATCH, LABEL_TASK_INDEX

pytestmark = [pytest.mark.e2e, pytest.mark.lostnodes]

ZONE: Final = "e2e-reclaim"
TEAM: Final = "e2e"
GI: Final = rc.GI
A_CPU, A_MEM = rc.CPU_MILLI, rc.MEMORY_BYTES
MARGIN_CPU, MARGIN_MEM = A_CPU // 10, A_MEM // 10
PROD_PODS: Final = 2
PROD_CPU, PROD_MEM = 2800, 14 * GI  # each production pod asks
USE_CPU, USE_MEM = 1600, 8 * GI  # and uses
RESERVED_CPU, RESERVED_MEM = PROD_PODS * PROD_CPU, PROD_PODS * PROD_MEM
EXPECT_CPU = A_CPU - PROD_PODS * USE_CPU - MARGIN_CPU  # 4000m
EXPECT_MEM = A_MEM - PROD_PODS * USE_MEM - MARGIN_MEM  # 20Gi
CPU_TOLERANCE: Final = 200
TASK_CPU, TASK_MEM = 900, 4 * GI  # 4 tasks fit 4000m - 200m; one fits 1600m
# The first figure needs two scrapes (a rate) and a cycle; a loaded machine doubles that.
MEASURED_WITHIN: Final = 180.0


def near(value: int | Fraction | None, want: int, tolerance: int = CPU_TOLERANCE) -> bool:
    return value is not None and abs(Fraction(value) - want) <= tolerance


@dataclass(frozen=True)
class Site:
    nodes: list[str]
    prod: str
    tenant: Tenant  # of the reclaim-enabled namespace

    @property
    def batch_ns(self) -> str:
        return self.tenant.namespace


def production(name: str, node: str) -> dict[str, Any]:
    """PROD_PODS replicas on `node`, each asking PROD_* and using USE_*."""
    tpl = template(**rc.pinned(node))
    tpl["metadata"]["annotations"] = rc.usage(f"{USE_CPU}m", str(USE_MEM))
    tpl["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": f"{PROD_CPU}m", "memory": str(PROD_MEM)}
    }
    return service_workload(name, TEAM, PROD_PODS, template=tpl)


def prod_pods(env: Env, site: Site, node: str) -> list[dict[str, Any]]:
    return [p for p in rc.raw_pods(env, site.prod) if p["spec"].get("nodeName") == node]


@pytest.fixture(scope="module")
def site(env: Env) -> Iterator[Site]:
    suffix = uuid.uuid4().hex[:6]
    with ExitStack() as stack:
        nodes = stack.enter_context(rc.reclaim_nodes(env, ZONE, 3))
        prod = stack.enter_context(team_namespace(env, f"e2e-reclaim-prod-{suffix}", TEAM))
        batch_ns = stack.enter_context(team_namespace(env, f"e2e-reclaim-batch-{suffix}", TEAM))
        rc.enable(env, batch_ns)
        tenant = tenant_of(env, batch_ns)
        for i, node in enumerate(nodes):
            create_sw(env, prod, production(f"prod-{i}", node))
        s = Site(nodes, prod, tenant)

        def placed() -> bool:
            return all(
                sum(probe.running(p) for p in prod_pods(env, s, node)) == PROD_PODS
                for node in nodes
            )

        wait_until(f"{PROD_PODS} production pods running on each node", placed, timeout=90)
        yield s


def wait_measured(env: Env, node: str) -> probe.NodeFigure:
    """The node's figure once it is measured from production's constant usage."""
    return rc.wait_figure(
        env,
        node,
        f"measured at {EXPECT_CPU}m ±{CPU_TOLERANCE}m cpu and {EXPECT_MEM} bytes",
        lambda f: f.measured and near(f.cpu, EXPECT_CPU) and f.memory == EXPECT_MEM,
        timeout=MEASURED_WITHIN,
    )


def test_batch_allocatable_is_allocatable_minus_p95_minus_margin(env: Env, site: Site) -> None:
    node = site.nodes[0]
    f = wait_measured(env, node)

    assert f.capacity_cpu == f.cpu, "capacity and allocatable carry one figure"
    assert (f.allocatable_cpu, f.allocatable_memory) == (A_CPU, A_MEM), "regular cpu untouched"
    d = f.detail
    assert (d.get("state"), d.get("window")) == ("Measured", "2m"), d
    # Memory: exact, from the gauge.
    assert f.shown("memory", "allocatable") == A_MEM
    assert f.shown("memory", "reserved") == RESERVED_MEM
    assert f.shown("memory", "p95") == PROD_PODS * USE_MEM
    assert f.shown("memory", "margin") == MARGIN_MEM
    assert f.shown("memory", "batch") == EXPECT_MEM
    assert f.shown("memory", "reclaimed") == EXPECT_MEM - (A_MEM - RESERVED_MEM)
    # CPU: the measured p95 near the emulated usage; the annotation's arithmetic exact.
    p95 = f.shown("cpu", "p95")
    assert near(p95, PROD_PODS * USE_CPU), d
    assert f.shown("cpu", "allocatable") == A_CPU
    assert f.shown("cpu", "reserved") == RESERVED_CPU
    assert f.shown("cpu", "margin") == MARGIN_CPU
    shown_batch = f.shown("cpu", "batch")
    assert p95 is not None and shown_batch is not None
    assert abs(shown_batch - (A_CPU - p95 - MARGIN_CPU)) <= 1, d  # strings round to 1m
    reclaimed = f.shown("cpu", "reclaimed")
    assert reclaimed is not None and abs(reclaimed - (shown_batch - (A_CPU - RESERVED_CPU))) <= 1
    assert f.cpu is not None and abs(f.cpu - shown_batch) < 1, (f.cpu, d)


def task_template(node: str) -> dict[str, Any]:
    tpl = batch.template({**batch.HELD, **rc.usage(f"{TASK_CPU}m", str(TASK_MEM))})
    tpl["spec"].update(rc.pinned(node))
    tpl["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": f"{TASK_CPU}m", "memory": str(TASK_MEM)}
    }
    return tpl


def bound_tasks(env: Env, site: Site, job: str, node: str) -> list[dict[str, Any]]:
    pods = rc.raw_pods(env, site.batch_ns, f"{LABEL_BATCH}={job}")
    return [p for p in pods if probe.running(p) and p["spec"]["nodeName"] == node]


def test_batch_lands_on_reclaimed_capacity_beside_production_fit(env: Env, site: Site) -> None:
    node = site.nodes[0]
    wait_measured(env, node)
    body = batch.batchworkload("fill", TEAM, 4, 4, template=task_template(node))
    try:
        with batch.job(env, site.tenant, body, lambda i, a: None):
            tasks = wait_until(
                f"4 tasks running on {node}",
                lambda: t if len(t := bound_tasks(env, site, "fill", node)) == 4 else None,
                timeout=90,
            )
            # 4 x 900m: more than the 2400m production left unreserved, so they run on
            # what production reserved, and asked for no cpu or memory of their own.
            for t in tasks:
                res = t["spec"]["containers"][0]["resources"]
                want = {names.BATCH_CPU: str(TASK_CPU), names.BATCH_MEMORY: str(TASK_MEM)}
                assert res == {"requests": want, "limits": want}, res
                assert names.ANNOTATION_ORIGINAL_RESOURCES in t["metadata"]["annotations"]
            on_node = [p for p in rc.raw_pods(env, site.batch_ns) if probe.live(p)]
            assert probe.allocated(on_node, node) == 4 * TASK_CPU

            # Production's fit is by its own cpu: what it has not reserved is still there.
            extra = {
                "metadata": {"name": "fits", "labels": {names.LABEL_BAND: "production"}},
                "spec": {
                    **rc.pinned(node),
                    "containers": [
                        {
                            "name": "app",
                            "image": "example/app:1",
                            "resources": {
                                "requests": {
                                    "cpu": f"{A_CPU - RESERVED_CPU}m",
                                    "memory": str(A_MEM - RESERVED_MEM),
                                }
                            },
                        }
                    ],
                    "terminationGracePeriodSeconds": 0,
                },
            }
            core = k8s.CoreV1Api(env.api)
            core.create_namespaced_pod(site.prod, extra)
            wait_until(
                f"the production pod running on {node}",
                lambda: any(
                    p["metadata"]["name"] == "fits" and probe.running(p)
                    for p in prod_pods(env, site, node)
                ),
                timeout=60,
            )
    finally:
        rc.stop_job(env, site.batch_ns, "fill")
        k8s.CoreV1Api(env.api).delete_namespaced_pod("fits", site.prod, grace_period_seconds=0)


def test_production_rising_to_its_request_evicts_the_newest_batch_pods(
    env: Env, site: Site
) -> None:
    node = site.nodes[1]
    before = wait_measured(env, node)
    body = batch.batchworkload("spill", TEAM, 4, 1, template=task_template(node))
    custom = k8s.CustomObjectsApi(env.api)
    try:
        with batch.job(env, site.tenant, body, lambda i, a: None) as (watch, _):
            # One task at a time, each started in a later second than the one before
            # (startTime has one-second precision): "newest" is then unambiguous.
            order: list[dict[str, Any]] = []

            def tasks_up(n: int) -> list[dict[str, Any]] | None:
                t = bound_tasks(env, site, "spill", node)
                return t if len(t) == n else None

            def later_than(started: str) -> bool:
                return _now_rfc3339() > started

            for n in range(1, 5):
                if n > 1:
                    custom.patch_namespaced_custom_object(
                        names.GROUP,
                        names.VERSION,
                        site.batch_ns,
                        batch.PLURAL,
                        "spill",
                        {"spec": {"parallelism": n}},
                    )
                running = wait_until(
                    f"{n} tasks running on {node}", functools.partial(tasks_up, n), timeout=60
                )
                seen = {p["metadata"]["uid"] for p in order}
                order.append(next(p for p in running if p["metadata"]["uid"] not in seen))
                started = order[-1]["status"]["startTime"]
                wait_until("a later second", functools.partial(later_than, started), timeout=5)
            by_age = [p["metadata"]["uid"] for p in order]
            indexes = [int(p["metadata"]["labels"][LABEL_TASK_INDEX]) for p in order]
            assert indexes == [0, 1, 2, 3], indexes
            prod_before = {p["metadata"]["uid"] for p in prod_pods(env, site, node)}
            assert len(prod_before) == PROD_PODS
            audit = nm.Audit.begin(env)

            for p in prod_pods(env, site, node):
                rc.set_usage(env, site.prod, p["metadata"]["name"], f"{PROD_CPU}m")
            # The next cycle sees the rise (one scrape, then a cycle); a loaded machine may
            # take one more.
            reduced = rc.wait_figure(
                env,
                node,
                "batch allocatable reduced",
                lambda f: f.cpu is not None and before.cpu is not None and f.cpu < before.cpu,
                timeout=60,
            )
            assert reduced.measured, reduced
            # Down to what production's full request leaves (rate() over 1 m ramps up to
            # the new usage within a minute), with the newest tasks evicted until it fits.
            after_cpu = A_CPU - RESERVED_CPU - MARGIN_CPU  # 1600m: one task
            final = rc.wait_figure(
                env,
                node,
                f"figure {after_cpu}m ±{CPU_TOLERANCE}m and only the oldest task left",
                lambda f: (
                    near(f.cpu, after_cpu)
                    and [p["metadata"]["uid"] for p in bound_tasks(env, site, "spill", node)]
                    == by_age[:1]
                ),
                timeout=180,
            )
            assert final.memory == EXPECT_MEM, "memory usage did not change"

            # Each evicted task counted as disrupted, none as failed, and recreated by the
            # batch operator (pending: there is no room for it now) or still to be: the
            # operator paces a job's unbound pods to what the scheduler binds.
            def accounted() -> tuple[dict[str, Any], dict[int, dict[str, Any]]] | None:
                st = batch.status(batch.get(env.api, site.batch_ns, "spill"))
                live = [
                    p
                    for p in rc.raw_pods(env, site.batch_ns, f"{LABEL_BATCH}=spill")
                    if not p["metadata"].get("deletionTimestamp")
                    and p["status"].get("phase") not in probe.TERMINAL
                ]
                fresh = {
                    int(p["metadata"]["labels"][LABEL_TASK_INDEX]): p
                    for p in live
                    if p["metadata"]["uid"] not in by_age
                }
                done = st.get("disrupted") == 3 and len(fresh) + st.get("waiting", 0) == 3
                return (st, fresh) if done and fresh else None

            st, replaced = wait_until("3 disruptions accounted for", accounted, timeout=60)
            assert st.get("failed", 0) == 0, st
            assert set(replaced) <= {1, 2, 3}, replaced.keys()
            assert not any(p["spec"].get("nodeName") for p in replaced.values()), "no room"
            evicted_uids = set(by_age[1:])
            for uid in evicted_uids:
                assert watch.first(uid, evicted_by_api), f"task {uid} left without an Eviction"
            if audit is not None:
                gone = {p["metadata"]["name"] for p in order[1:]}
                assert gone <= audit.evicted(site.batch_ns), audit.pod_writes(site.batch_ns)
                assert [w for w in audit.pod_writes(site.prod) if w.subresource == "eviction"] == []
            prod_after = prod_pods(env, site, node)
            assert {p["metadata"]["uid"] for p in prod_after} == prod_before
            assert not [p for p in prod_after if probe.disrupted(p)], "production touched"
    finally:
        rc.stop_job(env, site.batch_ns, "spill")


def evicted_by_api(pod: dict[str, Any]) -> bool:
    """Marked by the API server's Eviction handler (a delete would not mark it)."""
    return any(
        c.get("type") == probe.DISRUPTION_TARGET
        and c.get("status") == "True"
        and c.get("reason") == "EvictionByEvictionAPI"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def test_prometheus_down_decays_batch_allocatable_and_back_recovers(env: Env, site: Site) -> None:
    env.require_local()
    node = site.nodes[2]
    start = wait_measured(env, node)
    assert start.cpu is not None
    env.kill("prometheus")
    try:
        down = rc.wait_figure(
            env,
            node,
            "BatchCapacity False PrometheusUnavailable",
            lambda f: f.condition_status == "False" and f.reason == "PrometheusUnavailable",
            timeout=60,
        )
        assert "decaying toward 0" in down.message, down.message
        assert down.detail.get("state") == "PrometheusUnavailable", down.detail
        assert down.cpu is not None and down.cpu <= start.cpu // 2 + 1, (start, down)
        again = rc.wait_figure(
            env,
            node,
            "halved again",
            lambda f: (
                f.cpu is not None
                and down.cpu is not None
                and f.cpu <= down.cpu // 2 + 1
                and f.cpu < down.cpu
            ),
            timeout=60,
        )
        assert again.reason == "PrometheusUnavailable", again
        assert rc.node_events(env, node, "ReclaimStale"), "no ReclaimStale Event"
    finally:
        if env.layout is not None and not _running(env, "prometheus"):
            env.restart("prometheus")
    back = wait_measured(env, node)
    assert back.detail.get("state") == "Measured", back.detail
    wait_until(
        "a ReclaimRecovered Event",
        lambda: rc.node_events(env, node, "ReclaimRecovered"),
        timeout=30,
    )


def _running(env: Env, name: str) -> bool:
    return supervisor.running(env.require_local(), name) is not None
