"""prod_under_burst: production placement latency while a large batch burst is queued.

The seeds' promise: "a 100,000-task batch job may queue but never delays production". One
local control plane (`--nodes` kwok nodes in three zones, ports +`--port-offset`, state in a
temp dir), Pilotfish installed as `pilotfish dev up` installs it, every pod scheduled by the
cluster's own kube-scheduler through the extender. Production and batch live in namespaces
of their own, each written to by a tenant holding `edit` there (so API Priority and
Fairness queues each team as its own flow; `--as-admin`: everything as the APF-exempt admin).

1. idle: `--production` production pods (one workload), one every `--interval` seconds.
2. raw burst: `--batch` raw batch pods (1 CPU each) created as fast as the API server takes
   them; once `--head-start` are in, another `--production` production pods at the same pace.
   Then the burst's pods are removed.
3. BatchWorkload burst: the same `--batch` tasks as one BatchWorkload (the batch operator
   paces creation to the bind rate); production starts once it has created `--head-start`
   pods, while it still creates the rest. A job that creates nothing within
   `--bw-start-within` seconds fails the run, naming it.
Each phase starts once the machine is quiet (`common.quiet_machine`), so the raw burst's
clean-up does not load the BatchWorkload phase. created -> bound per production pod: from
its create request being sent to the scheduler's `Scheduled` event (taken right after the
binding). Figures per burst: p99 / idle p99 (target <= 1.5) and the p99 itself (< 5 s); the
main figure is the BatchWorkload burst's. With 50 pods the nearest-rank p99 is the slowest
pod. Each phase also reports the load average at both ends, CPU per component, the
scheduler's own histograms and the API server's per-pod view (audit log: create answered ->
binding requested -> binding answered).

Where the time goes (50 nodes, 1,500 tasks, shared 2-core machine). Not the scheduler's
queue (production pops first; the active queue stayed under 30 pods, the scheduler placing
as fast as pods arrived), nor the extender (handler p99 <= 5 ms; the scheduling algorithm,
extender calls included, 3-5 ms mean idle and in a burst), nor the scheduler's client rate
limit (qps 500 / burst 1000: zero wait); APF waits stay <= 20 ms p99 with a BatchWorkload
(0.2-0.5 s in a raw burst, the scheduler's bindings included). It is the API server's
CPU: in a raw burst a production pod's create is answered, then 1.5-4.5 s (p50) pass before
its binding request arrives. The scheduler's queue and cycle take <= 0.1 s of that (its
queue-to-bound minus its Bind); the rest is the pod's watch event reaching the scheduler late
(the watch cache force-closes 50-140 lagging pod watchers per burst, the scheduler's among
them) and the binding request reaching the server late; the binding itself grows from 3 ms
to 0.1-1 s. The API server is the largest CPU user (0.4-0.7 of a core); extender and operator
~0.1 each. A BatchWorkload paced to the bind rate closes no watcher and cuts the p99 4-10x,
but takes the control plane's whole throughput (50-75 binds/s), so production still waits
~0.5 s. Capped below that, production keeps its pace: `--creation-rate 40` gave 8.8x
(p99 0.40 s), `--creation-rate 20` 1.09x (p99 0.064 s against 0.059 s idle). Yielding
once production is seen left the first six to eight production pods 0.2-0.6 s (6-9x): they
arrived into queues the job had filled already. Paced on the API server's own delays
(`operators/batchworkload/apidelay.py`: its creates' round trips, its writes shown late), a
job keeps those queues short before production comes (200 nodes: 1.1x, the head start's 500
pods at ~15/s instead of ~31/s). The
namespaces opt out of the admission webhooks (`pilotfish.io/webhooks: disabled`): the
webhooks' own latency under load is not in these figures.

Prints one JSON object and exits 0 whether or not the target is met. `--nodes 50 --batch
1000` for a quick run on a small machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python benchmarks/prod_under_burst.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import quiet_machine, wait_for
from benchmarks.extender_overhead import (
    PORT_OFFSET,
    BindWatch,
    bench_pod,
    create_pods,
    delete_namespace,
    fresh_namespace,
    kube_scheduler,
    log,
    scheduler_config,
)
from benchmarks.probes import batchworkload as bwl
from benchmarks.probes.production import (
    Paced,
    create_paced,
    pending,
    production_figures,
    production_pods,
    scheduled_times,
    tenant,
)
from benchmarks.probes.scheduling import Probe, Window, server_times
from pilotfish import names
from pilotfish.devcluster.cluster import ClusterSpec, running_cluster
from pilotfish.devcluster.components import Layout
from pilotfish.kube.client import api_client
from pilotfish.kube.rest import PODS, Rest

TARGET = 1.5
ABSOLUTE_TARGET_S = 5.0
# Production and the batch team each in a namespace of their own, each written to by its
# own tenant (the built-in `edit` role there): API Priority and Fairness then queues the
# batch team's creates in its own flow, as it would on a real cluster.
PROD_NS = "burst-prod"
BATCH_NS = "burst-batch"
BW_NAME = "etl"


@dataclass
class Run:
    prod: Rest  # the production owner's client
    batch: Rest  # the batch team's
    probe: Probe
    watch: BindWatch
    args: argparse.Namespace
    scheduler: str | None
    bound: int = 0  # production pods the watch must have seen bound so far

    async def production(self, prefix: str) -> Paced:
        pods = production_pods(prefix, self.args.production, self.scheduler)
        paced = await create_paced(self.prod, PROD_NS, pods, self.args.interval)
        self.bound += len(pods)
        await self.watch.wait_for(self.bound, within=600)
        return paced

    async def idle(self) -> tuple[Paced, dict[str, Any]]:
        log(f"idle: {self.args.production} production pods, one every {self.args.interval}s")
        waited = await quiet_machine()
        window = await Window(self.probe).open()
        paced = await self.production("web-idle")
        return paced, {**await window.close(), "waited_for_a_quiet_machine_s": waited}

    async def raw(self) -> tuple[Paced, dict[str, Any]]:
        """Raw batch pods as fast as the API server takes them; production once `head_start`
        are in, while the rest is still being submitted."""
        a = self.args
        log(f"raw burst: {a.batch} batch pods")
        batch = [
            bench_pod(f"task-{i}", band="batch", scheduler=self.scheduler, workload="etl", cpu="1")
            for i in range(a.batch)
        ]
        for pod in batch:
            pod["spec"]["containers"][0]["resources"]["requests"]["memory"] = "1Gi"
        waited = await quiet_machine()
        window = await Window(self.probe).open()
        head, tail = batch[: a.head_start], batch[a.head_start :]
        await create_pods(self.batch, BATCH_NS, head)
        log(f"raw burst: {len(head)} pods in; production pods start")
        tail_task = asyncio.create_task(create_pods(self.batch, BATCH_NS, tail))
        paced = await self.production("web-raw")
        figures_ = await window.close()
        figures_["waited_for_a_quiet_machine_s"] = waited
        figures_["batch_submission_still_running_at_last_production_bind"] = not tail_task.done()
        await tail_task
        figures_["batch_submit_seconds"] = round(time.monotonic() - window.started, 2)

        async def none_pending() -> bool:
            return await pending(self.batch, BATCH_NS) == 0

        await wait_for("every raw burst pod to be bound", none_pending, max(900.0, a.batch / 3), 2)
        all_bound = time.monotonic() - window.started
        figures_["batch_all_bound_after_s"] = round(all_bound, 2)
        figures_["batch_bound_per_second"] = round(a.batch / all_bound, 2)
        log("raw burst: all bound; removing its pods")
        # Thousands of pods: the API server answers when all are deleted, well past 30 s.
        await self.batch.request("DELETE", PODS.path(BATCH_NS), request_timeout=600)

        async def gone() -> bool:
            items, _ = await self.batch.list_pages(PODS.path(BATCH_NS))
            return not items

        await wait_for("the raw burst's pods to be gone", gone, 600, 2)
        return paced, figures_

    async def batchworkload(self) -> tuple[Paced, dict[str, Any]]:
        """The same burst as one BatchWorkload: production once it has created `head_start`
        of its pods, while it is still creating the rest at the pace of the binds."""
        a = self.args
        log(f"BatchWorkload burst: {a.batch} tasks")
        waited = await quiet_machine()
        window = await Window(self.probe).open()
        await bwl.submit(
            self.batch,
            BATCH_NS,
            bwl.body(BW_NAME, a.batch, bwl.TEAM, a.task_seconds, self.scheduler, a.creation_rate),
        )
        took = await bwl.wait_started(
            self.batch, BATCH_NS, BW_NAME, a.head_start, a.bw_start_within, 600
        )
        log(f"BatchWorkload burst: {a.head_start} pods created in {took:.1f}s; production starts")
        paced = await self.production("web-bw")
        figures_ = await window.close()
        figures_["waited_for_a_quiet_machine_s"] = waited
        figures_["batchworkload_head_start_seconds"] = round(took, 2)
        status = await bwl.status(self.batch, BATCH_NS, BW_NAME)
        figures_["batchworkload_status_at_last_production_bind"] = status
        figures_["batchworkload_pods_created_at_last_production_bind"] = await bwl.created(
            self.batch, BATCH_NS, BW_NAME
        )
        figures_["batchworkload_still_creating_at_last_production_bind"] = (
            int(status.get("waiting") or 0) > 0
        )
        await bwl.delete(self.batch, BATCH_NS, BW_NAME)
        return paced, figures_


def verdict(idle_p99: float, p99: float) -> dict[str, Any]:
    ratio = p99 / idle_p99 if idle_p99 > 0 else float("inf")
    return {
        "p99_s": p99,
        "p99_over_idle": round(ratio, 3),
        "met": ratio <= TARGET and p99 < ABSOLUTE_TARGET_S,
    }


async def measure(
    layout: Layout, spec: ClusterSpec, args: argparse.Namespace, scheduler: str | None
) -> dict[str, Any]:
    """An idle phase, then the raw burst and/or the BatchWorkload burst; `scheduler` names
    the schedulerName of every production and raw pod (None: the cluster's own
    kube-scheduler, through the extender)."""
    api = await api_client(str(layout.admin_kubeconfig))
    rest = Rest(api)
    phases: dict[str, tuple[Paced, dict[str, Any]]] = {}
    try:
        for namespace in (PROD_NS, BATCH_NS):
            await fresh_namespace(rest, namespace)
        if args.as_admin:
            prod = batch = rest
        else:
            prod = await tenant(rest, PROD_NS, f"owner-{PROD_NS}", [("", "pods")])
            batch = await tenant(
                rest, BATCH_NS, f"owner-{BATCH_NS}", [("", "pods"), (names.GROUP, "batchworkloads")]
            )
        # Only production pods are watched (this process's own load is part of the machine's);
        # bind times come from the scheduler's events.
        watch = BindWatch(rest, PROD_NS)
        await watch.start()
        run = Run(prod, batch, Probe(layout, spec), watch, args, scheduler)
        phases["idle"] = await run.idle()
        if args.mode in ("raw", "both"):
            phases["raw_burst"] = await run.raw()
        if args.mode in ("batchworkload", "both"):
            phases["batchworkload_burst"] = await run.batchworkload()
        await watch.stop()
        scheduled = await scheduled_times(rest, PROD_NS)
        server = server_times(layout.logs / "audit.log", PROD_NS)
        for namespace in (PROD_NS, BATCH_NS):
            await delete_namespace(rest, namespace)
    finally:
        await api.close()
    out: dict[str, Any] = {}
    for name, (paced, window) in phases.items():
        out[name] = {"production": production_figures(paced, scheduled, watch.bound_wall, server)}
        out[name] |= window
    idle_p99 = out["idle"]["production"]["created_to_bound"]["p99_s"] or 0.0
    verdicts = {
        name: verdict(idle_p99, out[name]["production"]["created_to_bound"]["p99_s"] or 0.0)
        for name in out
        if name != "idle"
    }
    main_figure = "batchworkload_burst" if "batchworkload_burst" in verdicts else "raw_burst"
    return {
        "benchmark": "prod_under_burst",
        "inputs": {
            "scheduler": "without extender (reference)" if scheduler else "cluster's, via extender",
            "nodes": spec.nodes,
            "batch_tasks": args.batch,
            "task_seconds_in_batchworkload": args.task_seconds,
            "batchworkload_creation_rate": args.creation_rate,
            "production_pods_per_phase": args.production,
            "production_interval_s": args.interval,
            "batch_created_before_production": args.head_start,
            "machine_cpus": os.cpu_count(),
            "writers": "the cluster admin (APF-exempt)"
            if args.as_admin
            else f"tenants with edit in {PROD_NS} and in {BATCH_NS}",
        },
        "phases": out,
        "idle_p99_s": idle_p99,
        "ratios": {
            f"production_p99_{n}_over_idle": v["p99_over_idle"] for n, v in verdicts.items()
        },
        "absolute_p99_s": {n: v["p99_s"] for n, v in verdicts.items()},
        "targets": {"p99_over_idle": f"<= {TARGET}", "absolute_p99_s": f"< {ABSOLUTE_TARGET_S}"},
        "met_by_phase": {n: v["met"] for n, v in verdicts.items()},
        "main_figure": main_figure,
        "met": verdicts[main_figure]["met"] if verdicts else False,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--batch", type=int, default=5000)
    p.add_argument("--production", type=int, default=50)
    p.add_argument("--interval", type=float, default=0.2, help="seconds between production pods")
    p.add_argument("--head-start", type=int, default=500, help="tasks created before production")
    p.add_argument("--mode", choices=("both", "raw", "batchworkload"), default="both")
    p.add_argument(
        "--task-seconds", type=int, default=120, help="how long each BatchWorkload task runs"
    )
    p.add_argument(
        "--creation-rate",
        type=float,
        help="the BatchWorkload's spec.creationRate (creates/s); unset: pacing alone",
    )
    p.add_argument(
        "--bw-start-within",
        type=float,
        default=60.0,
        help="seconds the BatchWorkload has to create its first pod before the run fails",
    )
    p.add_argument(
        "--as-admin",
        action="store_true",
        help="create every pod as the cluster admin, whom API Priority and Fairness exempts",
    )
    p.add_argument("--port-offset", type=int, default=PORT_OFFSET)
    p.add_argument(
        "--without-extender",
        action="store_true",
        help="reference run: schedule every pod with a kube-scheduler that has no extender",
    )
    p.add_argument("--state", help="state directory (default: a fresh temp dir, removed after)")
    args = p.parse_args(argv)
    args.head_start = min(args.head_start, args.batch)
    state = (
        Path(args.state) if args.state else Path(tempfile.mkdtemp(prefix="pilotfish-bench-burst-"))
    )
    spec = ClusterSpec(nodes=args.nodes, port_offset=args.port_offset)
    result: dict[str, Any]
    try:
        log(f"starting a {args.nodes}-node cluster in {state}")
        with running_cluster(state, spec) as layout:
            if args.without_extender:
                name = "bench-without"
                config = scheduler_config(layout, spec, name, extender=False)
                with kube_scheduler(layout, config, name):
                    result = asyncio.run(measure(layout, spec, args, name))
            else:
                result = asyncio.run(measure(layout, spec, args, None))
    except Exception as exc:  # one JSON object whatever happens
        result = {"benchmark": "prod_under_burst", "error": f"{type(exc).__name__}: {exc}"}
    finally:
        if not args.state:
            shutil.rmtree(state, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
