"""extender_overhead: kube-scheduler's throughput with the Pilotfish extender vs without.

One local control plane (`--nodes` kwok nodes in three zones, ports +11000, state in a temp
dir) with Pilotfish installed as `pilotfish dev up` installs it: the extender runs as a host
process with its ServiceAccount token and its snapshot fed by informers.

Extenders in a KubeSchedulerConfiguration apply to every profile, so "without" needs its own
kube-scheduler process. To measure both the same way, each run gets a fresh kube-scheduler
started by this benchmark, serving its own schedulerName:
- `bench-with`: the cluster's own configuration (components.scheduler_config: the extender
  with its weight, nodeCacheCapable, ignorable), only the profile renamed;
- `bench-without`: the same configuration minus the `extenders` entry.
Each run creates `--pods` pods for that schedulerName while no scheduler serves it (so they
are all pending at once), then starts the scheduler and timestamps every binding from a
watch. Rate = pods / (first binding -> last binding), which leaves out the scheduler's own
start-up. Runs alternate (without, with, with, without, ...) so drift on a shared machine
falls on both sides; every run's pods are deleted before the next.

The pods are a realistic mix for the extender: a third production replicas of 30-replica
workloads (the spread path), the rest batch tasks (the pack path), small requests.

Prints one JSON object (inputs, per-run raw figures, ratio = with / without, target >= 0.90)
and exits 0 whether or not the target is met. `--nodes 50 --pods 500` for a quick run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import load, wait_default_service_account
from benchmarks.probes.scheduling import EXTENDER, cpu_seconds
from pilotfish import names
from pilotfish.devcluster import binaries, components, pki, supervisor
from pilotfish.devcluster.cluster import ClusterSpec, running_cluster
from pilotfish.devcluster.components import Layout
from pilotfish.kube.client import api_client
from pilotfish.kube.informer import Informer
from pilotfish.kube.rest import NAMESPACES, PODS, ApiError, Rest

TARGET = 0.90
PORT_OFFSET = 11000
# The chart's admission webhooks skip namespaces labelled so: what is measured is scheduling,
# and every pod is admitted exactly as written (no band rewrite, no team quota).
NAMESPACE_LABELS = {names.LABEL_WEBHOOKS: names.WEBHOOKS_DISABLED}


def log(message: str) -> None:
    """Progress on stderr; stdout carries only the JSON object."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100): a value that was actually observed."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 100)) - 1))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# --- pods --------------------------------------------------------------------------------


def bench_pod(
    name: str,
    *,
    band: str,
    scheduler: str | None = None,
    workload: str | None = None,
    cpu: str = "100m",
    memory: str = "128Mi",
) -> dict[str, Any]:
    labels = {names.LABEL_BAND: band, "bench": "extender"}
    if workload is not None:
        labels["pilotfish.io/workload"] = workload
    spec: dict[str, Any] = {
        "priorityClassName": names.PRIORITY_CLASS[band],
        "containers": [
            {
                "name": "c",
                "image": "example/bench:1",
                "resources": {"requests": {"cpu": cpu, "memory": memory}},
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }


def mixed_pods(count: int, scheduler: str | None) -> list[dict[str, Any]]:
    """A third production replicas (workloads of 30), the rest batch tasks."""
    out = []
    for i in range(count):
        if i % 3 == 0:
            out.append(
                bench_pod(
                    f"svc-{i}", band="production", scheduler=scheduler, workload=f"svc-{i // 90}"
                )
            )
        else:
            out.append(bench_pod(f"task-{i}", band="batch", scheduler=scheduler))
    return out


async def bounded(items: list[Any], concurrency: int, fn: Callable[[Any], Awaitable[Any]]) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one(item: Any) -> None:
        async with sem:
            await fn(item)

    await asyncio.gather(*(one(i) for i in items))


async def create_pods(
    rest: Rest, namespace: str, pods: list[dict[str, Any]], concurrency: int = 32
) -> dict[str, float]:
    """Create the pods; name -> monotonic time the API server acknowledged the create."""
    created: dict[str, float] = {}
    path = PODS.path(namespace)

    async def one(body: dict[str, Any]) -> None:
        for attempt in range(10):
            try:
                await rest.create(path, body)
                break
            except ApiError as e:
                if e.status == 409:  # already there from a retried request
                    break
                if e.status in (429, 500, 503, 504) and attempt < 9:
                    await asyncio.sleep(0.2 * (attempt + 1))
                    continue
                raise
        created[body["metadata"]["name"]] = time.monotonic()

    await bounded(pods, concurrency, one)
    return created


class BindWatch:
    """Timestamps, from a watch, the moment each pod of a namespace is first seen bound."""

    def __init__(self, rest: Rest, namespace: str, label_selector: str | None = None) -> None:
        self.bound: dict[str, float] = {}  # monotonic
        self.bound_wall: dict[str, float] = {}  # time.time(), to compare with server times
        self.changed = asyncio.Event()
        self.informer = Informer(rest, PODS, namespace=namespace, label_selector=label_selector)
        self.informer.add_handler(self._on)
        self.task: asyncio.Task[None] | None = None

    def _on(self, kind: str, obj: dict[str, Any], _old: dict[str, Any] | None) -> None:
        name = obj["metadata"]["name"]
        if kind != "DELETED" and (obj.get("spec") or {}).get("nodeName") and name not in self.bound:
            self.bound[name] = time.monotonic()
            self.bound_wall[name] = time.time()
            self.changed.set()

    async def start(self) -> None:
        self.task = asyncio.create_task(self.informer.run())
        await asyncio.wait_for(self.informer.synced.wait(), 60)

    async def wait_for(self, count: int, within: float) -> None:
        deadline = time.monotonic() + within
        while len(self.bound) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{len(self.bound)}/{count} pods bound after {within:.0f}s")
            self.changed.clear()
            with suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(remaining, 5))

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


async def fresh_namespace(rest: Rest, name: str) -> None:
    await rest.create(
        NAMESPACES.path(),
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": NAMESPACE_LABELS},
        },
    )
    await wait_default_service_account(rest, name)


async def delete_namespace(rest: Rest, name: str, within: float = 600) -> None:
    """Delete and wait until gone, so the next run starts on an empty cluster."""
    try:
        await rest.delete(NAMESPACES.path(name=name))
    except ApiError as e:
        if not e.not_found:
            raise
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            await rest.get(NAMESPACES.path(name=name))
        except ApiError as e:
            if e.not_found:
                return
            raise
        await asyncio.sleep(1)
    raise TimeoutError(f"namespace {name} still there after {within:.0f}s")


# --- a kube-scheduler of our own ---------------------------------------------------------


def scheduler_config(
    layout: Layout, spec: ClusterSpec, scheduler_name: str, extender: bool
) -> dict[str, Any]:
    """The cluster's own scheduler configuration with one profile, with or without the
    extender entry: everything else (client QPS, extender weight and flags) stays equal."""
    config = components.scheduler_config(layout, spec.ports)
    config["profiles"] = [{"schedulerName": scheduler_name}]
    if not extender:
        del config["extenders"]
    return config


@contextmanager
def kube_scheduler(
    layout: Layout, config: dict[str, Any], label: str
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a kube-scheduler process for the block; it is stopped (by its own pid) after."""
    path = layout.config / f"bench-{label}.yaml"
    path.write_text(yaml.safe_dump(config))
    kubeconfig = str(layout.kubeconfig("kube-scheduler"))
    log_file = (layout.logs / f"bench-{label}.log").open("ab")
    proc = subprocess.Popen(
        [
            str(binaries.bin_dir() / "kube-scheduler"),
            f"--config={path}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--v=1",
        ],
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log_file.close()


# --- one run -----------------------------------------------------------------------------


async def extender_calls(layout: Layout, port: int) -> float:
    """Extender calls answered so far (from its /metrics), to show it was really used.

    Over HTTPS with the local probe's client certificate, as the extender requires."""
    context = pki.client_context(layout.pki)

    def read() -> float:
        url = f"https://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=5, context=context) as resp:
            text = resp.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("pilotfish_extender_requests_total{")
        )

    return await asyncio.to_thread(read)


def extender_cpu(layout: Layout) -> float | None:
    """CPU seconds of the extender process so far (None if it is not running)."""
    proc = supervisor.child(layout, EXTENDER)
    return cpu_seconds(proc.pid) if proc is not None else None


async def one_run(
    rest: Rest, layout: Layout, spec: ClusterSpec, pods: int, extender: bool, index: int
) -> dict[str, Any]:
    label = "with" if extender else "without"
    scheduler_name = f"bench-{label}"
    namespace = f"bench-{label}-{index}"
    await fresh_namespace(rest, namespace)
    watch = BindWatch(rest, namespace)
    await watch.start()
    log(f"run {index} ({label}): creating {pods} pods for {scheduler_name}")
    await create_pods(rest, namespace, mixed_pods(pods, scheduler_name))
    calls_before = await extender_calls(layout, spec.ports.extender)
    load_before = load()
    cpu_before = extender_cpu(layout)
    with kube_scheduler(
        layout, scheduler_config(layout, spec, scheduler_name, extender), f"{label}-{index}"
    ):
        started = time.monotonic()
        log(f"run {index} ({label}): scheduler started")
        await watch.wait_for(pods, within=max(300.0, pods / 5))
    cpu_after = extender_cpu(layout)
    load_after = load()
    calls = await extender_calls(layout, spec.ports.extender) - calls_before
    await watch.stop()
    times = sorted(watch.bound.values())
    first, last = times[0], times[-1]
    rate = (len(times) - 1) / (last - first) if last > first else float("inf")
    log(f"run {index} ({label}): {rate:.1f} pods/s, extender calls {calls:.0f}")
    await delete_namespace(rest, namespace)
    return {
        "run": index,
        "scheduler": label,
        "pods_bound": len(times),
        "first_bound_after_start_s": round(first - started, 3),
        "first_to_last_bound_s": round(last - first, 3),
        "pods_per_second": round(rate, 2),
        "extender_calls": calls,
        # The extender's own CPU while this run's pods were placed: its informers follow
        # every binding in both kinds of run, the calls only in `with`; on a machine whose
        # cores the control plane already fills, that CPU is taken from the scheduler's.
        "extender_cpu_ms_per_pod": (
            round((cpu_after - cpu_before) * 1000 / pods, 3)
            if cpu_before is not None and cpu_after is not None
            else None
        ),
        "load_average": {"start": load_before, "end": load_after},
    }


async def measure(layout: Layout, spec: ClusterSpec, args: argparse.Namespace) -> dict[str, Any]:
    api = await api_client(str(layout.admin_kubeconfig))
    rest = Rest(api)
    try:
        order = [False, True] * args.rounds
        for i in range(1, args.rounds, 2):  # without, with, with, without, ...
            order[2 * i], order[2 * i + 1] = True, False
        runs = [
            await one_run(rest, layout, spec, args.pods, extender, i)
            for i, extender in enumerate(order)
        ]
    finally:
        await api.close()
    with_rates = [r["pods_per_second"] for r in runs if r["scheduler"] == "with"]
    without_rates = [r["pods_per_second"] for r in runs if r["scheduler"] == "without"]
    ratio = statistics.mean(with_rates) / statistics.mean(without_rates)
    return {
        "benchmark": "extender_overhead",
        "inputs": {
            "nodes": spec.nodes,
            "zones": 3,
            "pods_per_run": args.pods,
            "rounds": args.rounds,
            "mix": "1/3 production replicas (workloads of 30), 2/3 batch tasks",
            "machine_cpus": os.cpu_count(),
        },
        "raw": {
            "runs": runs,
            "with_pods_per_second": round(statistics.mean(with_rates), 2),
            "without_pods_per_second": round(statistics.mean(without_rates), 2),
        },
        "ratios": {"bound_per_second_with_over_without": round(ratio, 3)},
        "load_average": load(),
        "targets": {"bound_per_second_with_over_without": f">= {TARGET}"},
        "met": ratio >= TARGET,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--pods", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=2, help="pairs of runs (without + with)")
    p.add_argument("--port-offset", type=int, default=PORT_OFFSET)
    p.add_argument("--state", help="state directory (default: a fresh temp dir, removed after)")
    args = p.parse_args(argv)
    state = (
        Path(args.state)
        if args.state
        else Path(tempfile.mkdtemp(prefix="pilotfish-bench-extender-"))
    )
    spec = ClusterSpec(nodes=args.nodes, port_offset=args.port_offset)
    result: dict[str, Any]
    try:
        log(f"starting a {args.nodes}-node cluster in {state}")
        with running_cluster(state, spec) as layout:
            result = asyncio.run(measure(layout, spec, args))
    except Exception as exc:  # one JSON object whatever happens
        result = {"benchmark": "extender_overhead", "error": f"{type(exc).__name__}: {exc}"}
    finally:
        if not args.state:
            shutil.rmtree(state, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
