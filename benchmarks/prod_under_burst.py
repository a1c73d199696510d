"""prod_under_burst: production placement latency while a large batch burst is queued.

The seeds' promise: "a 100,000-task batch job may queue but never delays production". One
local control plane (`--nodes` kwok nodes in three zones, ports +11000, state in a temp
dir), Pilotfish installed as `pilotfish dev up` installs it, every pod scheduled by the
cluster's own kube-scheduler through the extender.

1. idle: `--production` production pods (priorityClassName pilotfish-production, one
   30-replica-style workload), created one every `--interval` seconds on a quiet cluster.
2. burst: `--batch` batch tasks (pilotfish-batch, 1 CPU each) submitted as fast as the
   API server takes them; once `--head-start` of them are in, another `--production`
   production pods are created at the same pace, while the rest of the burst is still
   being submitted and the scheduler's queue is thousands deep.
created -> bound is measured per production pod from the moment its create request is sent
(what its owner experiences, admission and storage included) to the moment a watch shows
`spec.nodeName` set. Figure: p99 during the burst / p99 idle, target <= 1.5. With 50 pods
the nearest-rank p99 is the slowest pod, so the figure is a worst case.

The namespace opts out of the admission webhooks (`pilotfish.io/webhooks: disabled`) so the
figure is about scheduling; admission latency is the same idle and in the burst anyway.

Prints one JSON object and exits 0 whether or not the target is met. `--nodes 50 --batch
1000` for a quick run on a small machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python benchmarks/prod_under_burst.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.extender_overhead import (
    PORT_OFFSET,
    BindWatch,
    bench_pod,
    create_pods,
    delete_namespace,
    fresh_namespace,
    kube_scheduler,
    log,
    percentile,
    scheduler_config,
)
from pilotfish import names
from pilotfish.devcluster.cluster import ClusterSpec, running_cluster
from pilotfish.devcluster.components import Layout
from pilotfish.kube.client import api_client
from pilotfish.kube.rest import PODS, ApiError, Rest

TARGET = 1.5


@dataclass
class Paced:
    """Wall-clock times (time.time()) per pod: request sent, create acknowledged."""

    sent: dict[str, float] = field(default_factory=dict)
    acked: dict[str, float] = field(default_factory=dict)


async def create_paced(
    rest: Rest, namespace: str, bodies: list[dict[str, Any]], interval: float
) -> Paced:
    """Create one pod every `interval` seconds, noting when each request went out and when
    the API server acknowledged it."""
    out = Paced()
    path = PODS.path(namespace)
    next_slot = time.monotonic()
    for body in bodies:
        delay = next_slot - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        next_slot += interval
        name = body["metadata"]["name"]
        out.sent[name] = time.time()
        for attempt in range(10):
            try:
                await rest.create(path, body)
                break
            except ApiError as e:
                if e.status in (429, 500, 503, 504) and attempt < 9:
                    await asyncio.sleep(0.1 * (attempt + 1))
                    continue
                raise
        out.acked[name] = time.time()
    return out


async def scheduled_times(rest: Rest, namespace: str) -> dict[str, float]:
    """When kube-scheduler bound each pod, from its `Scheduled` events (eventTime has
    microseconds and is taken right after the binding succeeded): the server's own clock,
    unaffected by how late this process's watch hears about it."""
    items, _ = await rest.list_pages(
        f"/apis/events.k8s.io/v1/namespaces/{namespace}/events",
        {"fieldSelector": "reason=Scheduled"},
    )
    out: dict[str, float] = {}
    for event in items:
        name = (event.get("regarding") or {}).get("name")
        when = event.get("eventTime")
        if name and when:
            out[name] = datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()
    return out


async def pending(rest: Rest, namespace: str) -> int:
    """Pods of the namespace not bound yet (a list from the API server's cache)."""
    items, _ = await rest.list_pages(PODS.path(namespace), {"fieldSelector": "spec.nodeName="})
    return len(items)


async def wait_none_pending(rest: Rest, namespace: str, within: float) -> None:
    deadline = time.monotonic() + within
    while (left := await pending(rest, namespace)) > 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{left} pods still pending after {within:.0f}s")
        await asyncio.sleep(2)


def latencies(start: dict[str, float], end: dict[str, float]) -> list[float]:
    return [end[name] - at for name, at in start.items() if name in end]


def summary(values: list[float]) -> dict[str, float | int | None]:
    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 4)

    return {
        "count": len(values),
        "p50_s": r(statistics.median(values)) if values else None,
        "p90_s": r(percentile(values, 90)),
        "p99_s": r(percentile(values, 99)),
        "max_s": r(max(values)) if values else None,
    }


def production_pods(prefix: str, count: int, scheduler: str | None) -> list[dict[str, Any]]:
    return [
        bench_pod(
            f"{prefix}-{i}",
            band="production",
            scheduler=scheduler,
            workload=prefix,
            cpu="500m",
            memory="512Mi",
        )
        for i in range(count)
    ]


def phase(paced: Paced, scheduled: dict[str, float], seen: dict[str, float]) -> dict[str, Any]:
    """The figures of one phase: created -> bound (the figure), and its two halves."""
    return {
        "created_to_bound": summary(latencies(paced.sent, scheduled)),
        "create_request_seconds": summary(latencies(paced.sent, paced.acked)),
        "acked_to_bound": summary(latencies(paced.acked, scheduled)),
        "bound_to_seen_by_watch": summary(
            latencies({n: scheduled[n] for n in paced.sent if n in scheduled}, seen)
        ),
        "missing_scheduled_events": len(set(paced.sent) - set(scheduled)),
    }


async def measure(
    layout: Layout, spec: ClusterSpec, args: argparse.Namespace, scheduler: str | None
) -> dict[str, Any]:
    """One idle phase and one burst; `scheduler` names the schedulerName of every pod (None:
    the cluster's own kube-scheduler, through the extender)."""
    api = await api_client(str(layout.admin_kubeconfig))
    rest = Rest(api)
    namespace = "burst"
    try:
        await fresh_namespace(rest, namespace)
        # Only production pods are watched (this process's own load is part of the machine's);
        # batch progress is polled, and bind times come from the scheduler's events.
        watch = BindWatch(rest, namespace, label_selector=f"{names.LABEL_BAND}=production")
        await watch.start()

        log(f"idle: {args.production} production pods, one every {args.interval}s")
        idle = await create_paced(
            rest, namespace, production_pods("web-idle", args.production, scheduler), args.interval
        )
        await watch.wait_for(args.production, within=300)

        log(f"burst: {args.batch} batch tasks")
        batch = [
            bench_pod(
                f"task-{i}",
                band="batch",
                scheduler=scheduler,
                workload="etl",
                cpu="1",
                memory="1Gi",
            )
            for i in range(args.batch)
        ]
        started = time.monotonic()
        head, tail = batch[: args.head_start], batch[args.head_start :]
        await create_pods(rest, namespace, head)

        log(f"burst: {len(head)} tasks in; production pods start")
        tail_task = asyncio.create_task(create_pods(rest, namespace, tail))
        burst = await create_paced(
            rest, namespace, production_pods("web-burst", args.production, scheduler), args.interval
        )
        pending_at_last_production = await pending(rest, namespace)
        tail_running = not tail_task.done()
        await watch.wait_for(2 * args.production, within=600)
        await tail_task
        submitted = time.monotonic()
        log("burst: submitted; waiting for every pod to be bound")
        await wait_none_pending(rest, namespace, within=max(900.0, args.batch / 3))
        all_bound = time.monotonic()
        await watch.stop()
        scheduled = await scheduled_times(rest, namespace)
        idle_figures = phase(idle, scheduled, watch.bound_wall)
        burst_figures = phase(burst, scheduled, watch.bound_wall)
        idle_p99 = idle_figures["created_to_bound"]["p99_s"] or 0.0
        burst_p99 = burst_figures["created_to_bound"]["p99_s"] or 0.0
        ratio = burst_p99 / idle_p99 if idle_p99 > 0 else float("inf")
        last_production = max(scheduled.get(n, 0.0) for n in burst.sent)
        tasks_after = sum(
            1 for n, t in scheduled.items() if n.startswith("task-") and t > last_production
        )
        await delete_namespace(rest, namespace)
    finally:
        await api.close()
    return {
        "benchmark": "prod_under_burst",
        "inputs": {
            "scheduler": "without extender (reference)" if scheduler else "cluster's, via extender",
            "nodes": spec.nodes,
            "batch_tasks": args.batch,
            "production_pods_per_phase": args.production,
            "production_interval_s": args.interval,
            "batch_submitted_before_production": args.head_start,
            "machine_cpus": os.cpu_count(),
        },
        "raw": {
            "idle": idle_figures,
            "burst": burst_figures,
            "pods_pending_when_last_production_pod_was_created": pending_at_last_production,
            "batch_tasks_bound_after_the_last_production_pod": tasks_after,
            "batch_submission_still_running_when_production_was_created": tail_running,
            "batch_submit_seconds": round(submitted - started, 2),
            "batch_all_bound_after_s": round(all_bound - started, 2),
            "batch_bound_per_second": round(args.batch / (all_bound - started), 2),
        },
        "ratios": {"production_p99_burst_over_idle": round(ratio, 3)},
        "targets": {"production_p99_burst_over_idle": f"<= {TARGET}"},
        "met": ratio <= TARGET,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--batch", type=int, default=5000)
    p.add_argument("--production", type=int, default=50)
    p.add_argument("--interval", type=float, default=0.2, help="seconds between production pods")
    p.add_argument("--head-start", type=int, default=500, help="tasks submitted before production")
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
