"""batch_job: a BatchWorkload's completion time and API writes against the built-in Job's.

One local control plane (`--nodes` kwok nodes, ports +16000, state in a temp dir) with
Pilotfish installed as `pilotfish dev up` installs it. The same work runs twice, one after
the other (`--order`), each in a fresh namespace of the same team with the same labels:

- `job`: an indexed Job (kube-controller-manager's Job controller);
- `batchworkload`: a BatchWorkload (Pilotfish's batch operator);

`--tasks` completions, `--parallelism`, and the same pod template, whose annotation
`kwok.pilotfish.io/run-seconds` makes kwok end every task `--run-seconds` after it started.

Each phase starts once the machine is quiet again (`common.quiet_machine`: the first phase's
clean-up left the second starting at load 4.7 against 2.0). Per phase: completion time
(create request sent -> Complete condition seen, polled every 0.5 s), pods/s, the peak of
unbound pods (sampled every second), load average at start and end, a BatchWorkload's
`status.pacing` each second (its create rate cap, the API server's queueing it measured, its
binds/s), and API writes from the audit log, per writer and per task: the controller's own
(Job controller / Pilotfish's operator, pods and the owner's status), kwok's (the kubelet's
part) and the scheduler's. Figures: completion time batchworkload / job, target <= 1.0; the
batch operator's writes per task, target <= 3.

A phase that makes no progress for `--stall` seconds stops with an error naming what it
waited for (e.g. a BatchWorkload no controller acts on); the other phase still reports.

Prints one JSON object and exits 0 whether or not the targets are met. `--nodes 20 --tasks
200 --parallelism 50` for a smoke run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python benchmarks/batch_job.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (
    delete_namespace,
    emit,
    load,
    log,
    open_team,
    quiet_machine,
    rounded,
    team_namespace,
)
from benchmarks.probes.watches import AuditTail
from benchmarks.probes.writes import WriteCounts, by_role, count_writes, per_task
from pilotfish import names
from pilotfish.devcluster.cluster import ClusterSpec, running_cluster
from pilotfish.devcluster.components import Layout
from pilotfish.devcluster.stages import ANNOTATION_RUN_SECONDS
from pilotfish.kube.client import api_client
from pilotfish.kube.rest import BATCHWORKLOADS, PODS, ApiError, Resource, Rest

PORT_OFFSET = 16000
TARGET_RATIO = 1.0
TARGET_WRITES_PER_TASK = 3.0
TEAM = "bench-batch"
JOBS = Resource("batch", "v1", "jobs")
KINDS = ("job", "batchworkload")
NAMESPACE = {"job": "batch-job", "batchworkload": "batch-bw"}
CONTROLLER_ROLE = {"job": "job_controller", "batchworkload": "batch_operator"}


def pod_template(run_seconds: float) -> dict[str, Any]:
    return {
        "metadata": {
            "labels": {names.LABEL_BAND: "batch", "bench": "batch-job"},
            "annotations": {ANNOTATION_RUN_SECONDS: f"{run_seconds:g}"},
        },
        "spec": {
            "restartPolicy": "Never",
            "priorityClassName": names.PRIORITY_CLASS["batch"],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "task",
                    "image": "example/task:1",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                }
            ],
        },
    }


def owner(kind: str, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The API path to create at and the object: the same work for either controller."""
    template = pod_template(args.run_seconds)
    namespace = NAMESPACE[kind]
    if kind == "job":
        return JOBS.path(namespace), {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "bench"},
            "spec": {
                "completions": args.tasks,
                "parallelism": args.parallelism,
                "completionMode": "Indexed",
                "template": template,
            },
        }
    return BATCHWORKLOADS.path(namespace), {
        "apiVersion": names.API_VERSION,
        "kind": "BatchWorkload",
        "metadata": {"name": "bench"},
        "spec": {
            "completions": args.tasks,
            "parallelism": args.parallelism,
            "team": TEAM,
            "band": "batch",
            "template": template,
        },
    }


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return dict(c)
    return None


async def unbound(rest: Rest, namespace: str) -> int:
    items, _ = await rest.list_pages(
        PODS.path(namespace), {"fieldSelector": "spec.nodeName=,status.phase=Pending"}
    )
    return len(items)


class Stall:
    """Whether a phase has stopped moving: what it watches (owner status, writes seen) has
    not changed for `limit` seconds."""

    def __init__(self, limit: float, now: float) -> None:
        self.limit = limit
        self.last: object = None
        self.since = now

    def stalled(self, seen: object, now: float) -> bool:
        if seen != self.last:
            self.last, self.since = seen, now
            return False
        return now - self.since > self.limit


async def run_phase(
    rest: Rest, audit: AuditTail, kind: str, args: argparse.Namespace
) -> tuple[dict[str, Any], WriteCounts]:
    """Create the owner, wait for its Complete condition; its figures and its writes."""
    namespace = NAMESPACE[kind]
    await team_namespace(rest, namespace, TEAM)
    for _ in audit.events():  # everything before the phase is someone else's
        pass
    path, body = owner(kind, args)
    events: list[dict[str, Any]] = []
    waited = await quiet_machine()
    load_start = load()
    log(f"{kind}: {args.tasks} tasks of {args.run_seconds}s, parallelism {args.parallelism}")
    started = time.monotonic()
    await rest.create(path, body)
    peak, last_sample, stall = 0, 0.0, Stall(args.stall, started)
    pacing: list[list[float]] = []  # [s since start, createRate, apiQueueingSeconds, binds/s]
    while True:
        now = time.monotonic()
        obj = await rest.get(f"{path}/bench")
        if condition(obj, "Complete"):
            break
        failed = condition(obj, "Failed")
        if failed:
            raise RuntimeError(f"{kind} failed: {failed.get('reason')}: {failed.get('message')}")
        if now - last_sample >= 1.0:
            last_sample = now
            peak = max(peak, await unbound(rest, namespace))
            pace = (obj.get("status") or {}).get("pacing")
            if pace:
                pacing.append(
                    [
                        round(now - started, 1),
                        pace.get("createRate", 0),
                        pace.get("apiQueueingSeconds", 0),
                        pace.get("bindsPerSecond", 0),
                    ]
                )
            events.extend(e for e in audit.events() if _in(e, namespace))
        status = obj.get("status") or {}
        seen = (status.get("active"), status.get("succeeded"), status.get("failed"), len(events))
        if stall.stalled(seen, now):
            raise TimeoutError(
                f"{kind} {namespace}/bench made no progress for {args.stall:.0f}s "
                f"(status {status or 'empty'}, {len(events)} writes seen): is its controller "
                "running (for a BatchWorkload: the batch operator registered in "
                "operators/runner.py CONTROLLERS)?"
            )
        await asyncio.sleep(0.5)
    elapsed = time.monotonic() - started
    load_end = load()
    events.extend(e for e in audit.events() if _in(e, namespace))
    counts = count_writes(events, namespace)
    status = obj.get("status") or {}
    figures = {
        "completion_s": round(elapsed, 2),
        "pods_per_s": round(args.tasks / elapsed, 2),
        "peak_unbound_pods": peak,
        "succeeded": status.get("succeeded"),
        "failed": status.get("failed"),
        "load_average_1_5_15": {"start": load_start, "end": load_end},
        "waited_for_a_quiet_machine_s": waited,
        "writes_per_task": per_task(counts, args.tasks),
        "writes": by_role(counts),
        "writes_by_user": {u: dict(sorted(c.items())) for u, c in sorted(counts.items())},
    }
    if pacing:
        figures["pacing_each_second"] = {
            "columns": ["s", "createRate", "apiQueueingSeconds", "bindsPerSecond"],
            "rows": pacing,
        }
    log(f"{kind}: complete in {elapsed:.1f}s; deleting {namespace}")
    await delete_namespace(rest, namespace, within=max(300.0, args.tasks / 10))
    return figures, counts


def _in(event: dict[str, Any], namespace: str) -> bool:
    return (event.get("objectRef") or {}).get("namespace") == namespace


async def measure(layout: Layout, args: argparse.Namespace) -> dict[str, Any]:
    api = await api_client(str(layout.admin_kubeconfig))
    rest = Rest(api)
    phases: dict[str, Any] = {}
    try:
        await open_team(rest, TEAM)
        audit = AuditTail(layout.logs / "audit.log")
        order = KINDS if args.order == "job-first" else tuple(reversed(KINDS))
        for kind in order:
            try:
                phases[kind], _ = await run_phase(rest, audit, kind, args)
            except (ApiError, RuntimeError, TimeoutError) as exc:
                log(f"{kind}: {type(exc).__name__}: {exc}")
                phases[kind] = {"error": f"{type(exc).__name__}: {exc}"}
                try:  # the next phase starts on a quiet cluster, or says why it could not
                    await delete_namespace(
                        rest, NAMESPACE[kind], within=max(300.0, args.tasks / 10)
                    )
                except (ApiError, TimeoutError) as gone:
                    phases[kind]["cleanup_error"] = f"{type(gone).__name__}: {gone}"
    finally:
        await api.close()
    return phases


def summary(phases: dict[str, Any], args: argparse.Namespace, spec: ClusterSpec) -> dict[str, Any]:
    job, bw = phases.get("job", {}), phases.get("batchworkload", {})
    ratio = (
        bw["completion_s"] / job["completion_s"]
        if "completion_s" in job and "completion_s" in bw
        else None
    )
    writes = (bw.get("writes_per_task") or {}).get(CONTROLLER_ROLE["batchworkload"])
    return {
        "benchmark": "batch_job",
        "inputs": {
            "nodes": spec.nodes,
            "tasks": args.tasks,
            "parallelism": args.parallelism,
            "run_seconds": args.run_seconds,
            "order": args.order,
            "machine_cpus": os.cpu_count(),
        },
        "raw": phases,
        "ratios": {
            "completion_batchworkload_over_job": rounded(ratio, 3),
            "batch_operator_writes_per_task": writes,
            "job_controller_writes_per_task": (job.get("writes_per_task") or {}).get(
                CONTROLLER_ROLE["job"]
            ),
        },
        "targets": {
            "completion_batchworkload_over_job": f"<= {TARGET_RATIO}",
            "batch_operator_writes_per_task": f"<= {TARGET_WRITES_PER_TASK}",
        },
        "met": ratio is not None
        and ratio <= TARGET_RATIO
        and writes is not None
        and writes <= TARGET_WRITES_PER_TASK,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--parallelism", type=int, default=1000)
    p.add_argument("--run-seconds", type=float, default=5.0)
    p.add_argument("--order", choices=("job-first", "batchworkload-first"), default="job-first")
    p.add_argument("--stall", type=float, default=120.0, help="seconds without progress: fail")
    p.add_argument("--port-offset", type=int, default=PORT_OFFSET)
    p.add_argument("--state", help="state directory (default: a fresh temp dir, removed after)")
    args = p.parse_args(argv)
    state = Path(args.state) if args.state else Path(tempfile.mkdtemp(prefix="pilotfish-bench-"))
    spec = ClusterSpec(nodes=args.nodes, port_offset=args.port_offset)
    result: dict[str, Any]
    try:
        log(f"starting a {args.nodes}-node cluster in {state}")
        with running_cluster(state, spec) as layout:
            result = summary(asyncio.run(measure(layout, args)), args, spec)
    except Exception as exc:  # one JSON object whatever happens
        result = {"benchmark": "batch_job", "error": f"{type(exc).__name__}: {exc}"}
    finally:
        if not args.state:
            shutil.rmtree(state, ignore_errors=True)
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
