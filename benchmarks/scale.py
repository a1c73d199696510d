"""scale: the whole stack at the design's proportions: `--nodes` kwok nodes, `--pods` pods.

One local control plane (`--nodes` kwok nodes in three zones, ports +`--port-offset`, state
in a temp dir) with Pilotfish installed as `pilotfish dev up` installs it (operator,
extender, webhooks as host processes; every pod through the webhooks and the cluster's own
kube-scheduler with the extender). One team, two namespaces:

- production, a third of the pods: ServiceWorkloads of `--replicas` pods each (100m, 128Mi);
- batch, two thirds: BatchWorkloads of `--tasks` tasks each (1 CPU, 1 GiB, running for a
  day), paced by the batch operator to what the scheduler binds.

Every workload is submitted at once; the clock starts with the first. Sampled every
`--sample` seconds: pods the operator created and the scheduler bound (their counters), the
operator's resident memory and work-queue depths; beside it, a probe ServiceWorkload of 0
replicas whose template is bumped every `--sample` seconds: reconcile lag is the time from
that write to the rollout controller's `status.observedGeneration` showing it (what a
ServiceWorkload's owner waits for while the operator is busy with 30,000 pods).

Figures: time to all bound; production created -> bound p50/p99 (the API server's audit
log: create answered -> binding answered); CPU seconds over the run and peak RSS of the API
server, etcd, scheduler, controller manager, kwok and each Pilotfish process (/proc of the
pids their supervisor recorded); the extender's handler p99 (its histogram, a bucket bound);
queue depths and reconcile lag over time; the operator's RSS at the end against 300 MB; the
load average at both ends. `--sweep 250,500,1000` runs each size (pods per node kept) on a
fresh cluster and reports each figure's growth from one size to the next, flagging the
figures that grew faster than the cluster.

Prints one JSON object (also written to `--out`) and exits 0 whether or not the targets are
met. Smoke run: `--nodes 30 --pods 600`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Final

if __package__ in (None, ""):  # run as `python benchmarks/scale.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.batch_job import TEAM
from benchmarks.common import (
    bounded,
    delete_namespace,
    latency_summary,
    log,
    on_own_cluster,
    open_team,
    sample_every,
    team_namespace,
)
from benchmarks.probes import batchworkload as bwl
from benchmarks.probes import scale as sc
from benchmarks.probes.scheduling import Probe, Reading, Window, reading, server_times
from pilotfish.devcluster import cluster, supervisor
from pilotfish.devcluster.cluster import ClusterSpec
from pilotfish.devcluster.components import Layout
from pilotfish.kube.client import api_client
from pilotfish.kube.rest import BATCHWORKLOADS, PODS, SERVICEWORKLOADS, ApiError, Rest

PORT_OFFSET: Final = 13000
OPERATOR: Final = "pilotfish-operator"
PROD_NS: Final = "scale-prod"
BATCH_NS: Final = "scale-batch"
LAG_PROBE: Final = "lag-probe"
PROBE_ANNOTATION: Final = "bench.pilotfish.io/probe"
TASK_SECONDS: Final = 86_400  # longer than any run: every task stays bound
# One kwok process renews every fake node's lease, on the same two cores as the whole
# control plane: at 1,000 nodes and ~25,000 pods its renewals fell 40 s behind (lease age
# p90 41 s), and the operator rightly took the fleet for silent. Real kubelets renew their
# own. The run measures placement, so the operator is told a node is silent only after
# this long (PILOTFISH_NODE_UNREACHABLE_SECONDS, inherited by the host processes; a value
# already in the environment wins).
UNREACHABLE_AFTER_S: Final = "180"


class Run:
    def __init__(self, layout: Layout, spec: ClusterSpec, rest: Rest, args: argparse.Namespace):
        self.layout, self.spec, self.rest, self.args = layout, spec, rest, args
        self.probe = Probe(layout, spec)
        self.operator = next(
            c for c in cluster.host_processes(layout, spec.ports) if c.name == OPERATOR
        ).health
        self.started = time.monotonic()
        self.base_bound = 0
        self.samples: list[sc.Sample] = []
        self.lag: list[list[float]] = []
        self.errors: list[str] = []

    async def metrics(self) -> tuple[Reading, Reading]:
        """The operator's and the scheduler's /metrics (the probe knows the scheduler's
        address and credentials)."""
        op, sched = await asyncio.gather(
            asyncio.to_thread(supervisor.fetch, self.operator, "/metrics"),
            asyncio.to_thread(supervisor.fetch, self.probe._health("kube-scheduler"), "/metrics"),
        )
        return reading(op), reading(sched)

    async def sample(self) -> sc.Sample:
        op, sched = await self.metrics()
        return sc.Sample(
            round(time.monotonic() - self.started, 2),
            sc.pods_created(op),
            sc.scheduled(sched) - self.base_bound,
            sc.rss_mb(self.layout, OPERATOR),
            sc.queue_depths(op),
        )

    async def lag_once(self) -> list[float]:
        """Bump the probe's template; seconds until its status shows the new generation."""
        at = time.monotonic()
        path = SERVICEWORKLOADS.path(PROD_NS, LAG_PROBE)
        bump = {"metadata": {"annotations": {PROBE_ANNOTATION: f"{at:.3f}"}}}
        obj = await self.rest.patch(path, {"spec": {"template": bump}})
        generation = obj["metadata"]["generation"]
        while ((await self.rest.get(path)).get("status") or {}).get(
            "observedGeneration", 0
        ) < generation:
            if time.monotonic() - at > self.args.stall:
                raise TimeoutError(f"{LAG_PROBE} generation {generation} not observed")
            await asyncio.sleep(0.1)
        return [round(at - self.started, 2), round(time.monotonic() - at, 3)]

    async def setup(self) -> None:
        await open_team(self.rest, TEAM)
        for ns in (PROD_NS, BATCH_NS):
            await delete_namespace(self.rest, ns)  # an earlier run's, on a kept cluster
            await team_namespace(self.rest, ns, TEAM)
        await self.rest.create(SERVICEWORKLOADS.path(PROD_NS), sc.service(LAG_PROBE, TEAM, 0))
        await self.lag_once()  # the controller answers before the clock starts

    async def submit(self) -> None:
        a = self.args
        production = a.pods // 3
        bodies = [
            (SERVICEWORKLOADS.path(PROD_NS), sc.service(f"web-{i}", TEAM, n))
            for i, n in enumerate(sc.split(production, a.replicas))
        ]
        bodies += [
            (BATCHWORKLOADS.path(BATCH_NS), bwl.body(f"etl-{i}", n, TEAM, TASK_SECONDS))
            for i, n in enumerate(sc.split(a.pods - production, a.tasks))
        ]
        log(f"submitting {len(bodies)} workloads: {production} production, rest batch")
        await bounded(bodies, 8, lambda b: self.rest.create(*b))

    async def unbound(self) -> int:
        count = 0
        for ns in (PROD_NS, BATCH_NS):
            items, _ = await self.rest.list_pages(
                PODS.path(ns), {"fieldSelector": "spec.nodeName="}
            )
            count += len(items)
        return count

    async def until_bound(self) -> float:
        """Seconds from submission until every pod exists and is bound; a run that stops
        moving for `--stall` seconds fails naming how far it got."""
        a, last, since = self.args, -1, time.monotonic()
        while True:
            await asyncio.sleep(a.sample)
            if not self.samples:
                continue
            s = self.samples[-1]
            if s.bound != last:
                last, since = s.bound, time.monotonic()
            elif time.monotonic() - since > a.stall:
                raise TimeoutError(
                    f"no pod bound for {a.stall:.0f}s: {s.created} of {a.pods} created, "
                    f"{s.bound} bound; queues {s.queue_depth}"
                )
            if s.created >= a.pods and s.bound >= a.pods and await self.unbound() == 0:
                return time.monotonic() - self.started

    async def measure(self) -> dict[str, Any]:
        await self.setup()
        _, sched = await self.metrics()
        self.base_bound = sc.scheduled(sched)
        before = sc.processes(self.layout)
        window = await Window(self.probe).open()
        self.started = time.monotonic()
        tasks = [
            asyncio.create_task(
                sample_every(self.args.sample, self.sample, self.samples, self.errors)
            ),
            asyncio.create_task(
                sample_every(self.args.sample, self.lag_once, self.lag, self.errors)
            ),
        ]
        try:
            await self.submit()
            all_bound = await self.until_bound()
            self.samples.append(await self.sample())
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        components = await window.close()
        used = sc.used(before, sc.processes(self.layout))
        server = server_times(self.layout.logs / "audit.log", PROD_NS)
        prod = [server.bind_done[n] - c for n, c in server.created.items() if n in server.bind_done]
        return self.result(all_bound, latency_summary(prod), components, used)

    def result(
        self,
        all_bound: float,
        prod: dict[str, Any],
        components: dict[str, Any],
        used: dict[str, dict[str, float | None]],
    ) -> dict[str, Any]:
        a = self.args
        comp = components["components"]
        rss_end = self.samples[-1].operator_rss_mb if self.samples else None
        lags = [lag for _, lag in self.lag]
        depth_max = {
            c: max(s.queue_depth.get(c, 0) for s in self.samples)
            for c in sorted({c for s in self.samples for c in s.queue_depth})
        }
        figures = {
            "all_bound_s": round(all_bound, 2),
            "bound_per_second": round(a.pods / all_bound, 2),
            "production_created_to_bound_p50_s": prod["p50_s"],
            "production_created_to_bound_p99_s": prod["p99_s"],
            "extender_filter_p99_le_s": comp["extender_filter_handler"]["p99_le_s"],
            "extender_prioritize_p99_le_s": comp["extender_prioritize_handler"]["p99_le_s"],
            "operator_rss_end_mb": rss_end,
            "operator_queue_depth_max": max(depth_max.values(), default=0),
            "reconcile_lag_p50_s": latency_summary(lags)["p50_s"],
            "reconcile_lag_p99_s": latency_summary(lags)["p99_s"],
        }
        return {
            "benchmark": "scale",
            "inputs": inputs(a, self.spec.nodes, a.pods),
            "figures": figures,
            "production_created_to_bound": prod,
            "processes": used,
            "operator_queue_depth_max": depth_max,
            "components": comp,
            "cpu_cores_used": components["cpu_cores_used"],
            "series": sc.series(self.samples) | {"reconcile_lag": self.lag},
            "sample_errors": self.errors[:20],
            "targets": {"operator_rss_end_mb": f"<= {sc.RSS_TARGET_MB}"},
            "met": rss_end is not None and rss_end <= sc.RSS_TARGET_MB,
        }


def inputs(args: argparse.Namespace, nodes: int, pods: int) -> dict[str, Any]:
    return {
        "nodes": nodes,
        "zones": 3,
        "pods": pods,
        "production_pods": pods // 3,
        "batch_pods": pods - pods // 3,
        "replicas_per_serviceworkload": args.replicas,
        "tasks_per_batchworkload": args.tasks,
        "sample_s": args.sample,
        "machine_cpus": os.cpu_count(),
        "node_unreachable_after_s": float(
            os.environ.get("PILOTFISH_NODE_UNREACHABLE_SECONDS", UNREACHABLE_AFTER_S)
        ),
    }


def one_size(args: argparse.Namespace, nodes: int, pods: int, state: str | None) -> dict[str, Any]:
    sized = argparse.Namespace(**(vars(args) | {"nodes": nodes, "pods": pods}))
    spec = ClusterSpec(nodes=nodes, port_offset=args.port_offset)

    def measure(layout: Layout) -> dict[str, Any]:
        return asyncio.run(measure_async(layout, spec, sized))

    return on_own_cluster(
        "scale", spec, measure, inputs=inputs(sized, nodes, pods), state=state, operator=OPERATOR
    )


async def measure_async(layout: Layout, spec: ClusterSpec, args: argparse.Namespace) -> Any:
    api = await api_client(str(layout.admin_kubeconfig))
    try:
        return await Run(layout, spec, Rest(api), args).measure()
    except ApiError as e:
        raise RuntimeError(f"API error {e.status}: {e.message}") from e
    finally:
        await api.close()


def sweep(args: argparse.Namespace, sizes: list[int]) -> dict[str, Any]:
    """Each size on a fresh cluster, pods per node as `--nodes`/`--pods` give them."""
    per_node = args.pods / args.nodes
    runs = []
    for n in sizes:
        log(f"sweep: {n} nodes, {round(n * per_node)} pods")
        runs.append(one_size(args, n, round(n * per_node), None))
    grown = sc.growth([(n, sc.flat_figures(r)) for n, r in zip(sizes, runs, strict=True)])
    return {
        "benchmark": "scale",
        "sweep": sizes,
        "pods_per_node": per_node,
        "runs": runs,
        "growth": grown,
        "super_linear": sorted({g["figure"] for g in grown if g["super_linear"]}),
        "targets": {"operator_rss_end_mb": f"<= {sc.RSS_TARGET_MB}"},
        "met": all(r.get("met") is True for r in runs),
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--pods", type=int, default=30_000)
    p.add_argument("--replicas", type=int, default=100, help="pods per ServiceWorkload")
    p.add_argument("--tasks", type=int, default=1000, help="tasks per BatchWorkload")
    p.add_argument("--sample", type=float, default=2.0, help="seconds between samples")
    p.add_argument("--stall", type=float, default=300.0, help="seconds without a bind: fail")
    p.add_argument("--sweep", help="comma-separated node counts, each on a fresh cluster")
    p.add_argument("--port-offset", type=int, default=PORT_OFFSET)
    p.add_argument(
        "--state",
        help="state directory of a single size (default: a fresh temp dir, removed after)",
    )
    p.add_argument("--out", help="also write the JSON object to this file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    os.environ.setdefault("PILOTFISH_NODE_UNREACHABLE_SECONDS", UNREACHABLE_AFTER_S)
    if args.sweep:
        result = sweep(args, [int(s) for s in args.sweep.split(",") if s.strip()])
    else:
        result = one_size(args, args.nodes, args.pods, args.state)
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
