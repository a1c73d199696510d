"""endpoint_freshness: how fast readiness flips reach EndpointSlices, against the built-in
EndpointSlice controller on the same pods (PERFORMANCE.md).

300 ready pods of one ServiceWorkload sit behind two Services: Pilotfish's (no selector, its
slices written by the endpoints controller) and a plain Service with a selector over the same
pods, whose slices kube-controller-manager's EndpointSlice controller maintains. The
benchmark flips pods' readiness 100 times a second for 30 s (readiness gate + Ready through
pods/status, as a kubelet would report it; kwok does not) and watches both sets of slices.

- lag of one flip, per controller: from sending the flip to the first slice event showing
  the pod in the flipped state (both measured from the same send time, on one watch);
- writes per change, per controller: slice write events seen ÷ flips sent.

Figures: Pilotfish p99 lag ÷ built-in p99 lag (target ≤ 1.0) and Pilotfish writes per change
(target ≤ 1). Prints one JSON object and exits 0 whether or not the targets are met.

`--min-write-interval S` restarts the operator with the endpoints controller's coalescing
interval set to S (default: the operator as installed, with the controller's own default).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp

from benchmarks.common import wait_default_service_account
from pilotfish import names
from pilotfish.devcluster import supervisor
from pilotfish.devcluster.cluster import ClusterSpec, host_processes, running_cluster
from pilotfish.devcluster.components import Layout
from pilotfish.kube.client import api_client
from pilotfish.kube.rest import (
    NAMESPACES,
    PODS,
    SERVICEWORKLOADS,
    STRATEGIC_MERGE_PATCH,
    TEAMQUOTAS,
    ApiError,
    Rest,
)
from pilotfish.operators.endpoints import (
    ENDPOINTSLICES,
    ENV_MIN_WRITE_INTERVAL,
    LABEL_MANAGED_BY,
    MIN_WRITE_INTERVAL_SECONDS,
    SERVICES,
)
from pilotfish.operators.runner import CONTROLLERS
from pilotfish.workloads import ENDPOINTSLICE_MANAGED_BY, LABEL_WORKLOAD

NODES: Final = 20
PORT_OFFSET: Final = 9000
PODS_COUNT: Final = 300
FLIPS_PER_SECOND: Final = 100.0
DURATION_SECONDS: Final = 30.0
TARGET_LAG_RATIO: Final = 1.0
TARGET_WRITES_PER_CHANGE: Final = 1.0

NAMESPACE: Final = "bench-endpoints"
NAME: Final = "fresh"
BUILTIN: Final = "fresh-builtin"
BUILTIN_MANAGED_BY: Final = "endpointslice-controller.k8s.io"
GATE: Final = "pilotfish.io/bench-ready"
SETUP_TIMEOUT: Final = 300.0
DRAIN_TIMEOUT: Final = 20.0
IN_FLIGHT: Final = 64
ROLLOUT_CONTROLLERS: Final = ("serviceworkload", "rollout")
TEAM: Final = "bench"

MANAGERS: Final = {ENDPOINTSLICE_MANAGED_BY: "pilotfish", BUILTIN_MANAGED_BY: "builtin"}


@dataclass
class Watcher:
    """Both controllers' slices on one watch: what each shows, and when each flip showed."""

    shown: dict[str, dict[str, bool | None]] = field(
        default_factory=lambda: {"pilotfish": {}, "builtin": {}}
    )
    # manager -> pod -> (wanted ready, sent at)
    pending: dict[str, dict[str, tuple[bool, float]]] = field(
        default_factory=lambda: {"pilotfish": {}, "builtin": {}}
    )
    lags: dict[str, list[float]] = field(default_factory=lambda: {"pilotfish": [], "builtin": []})
    missed: dict[str, int] = field(default_factory=lambda: {"pilotfish": 0, "builtin": 0})
    writes: dict[str, int] = field(default_factory=lambda: {"pilotfish": 0, "builtin": 0})
    counting: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def expect(self, pod: str, ready: bool, sent: float) -> None:
        for manager, pending in self.pending.items():
            if pod in pending:
                self.missed[manager] += 1  # flipped again before the last flip ever showed
            pending[pod] = (ready, sent)

    def see(self, kind: str, obj: dict[str, Any], now: float) -> None:
        labels = obj["metadata"].get("labels") or {}
        manager = MANAGERS.get(labels.get(LABEL_MANAGED_BY, ""))
        if manager is None:
            return
        if self.counting:
            self.writes[manager] += 1
        if kind == "DELETED":
            return
        shown = self.shown[manager]
        pending = self.pending[manager]
        for ep in obj.get("endpoints") or []:
            pod = (ep.get("targetRef") or {}).get("name")
            if not pod:
                continue
            ready = (ep.get("conditions") or {}).get("ready")
            shown[pod] = ready
            want = pending.get(pod)
            if want is not None and ready is want[0]:
                self.lags[manager].append(now - want[1])
                del pending[pod]
        self.changed.set()

    def ready_count(self, manager: str) -> int:
        return sum(1 for v in self.shown[manager].values() if v is True)


async def watch_slices(rest: Rest, watcher: Watcher, rv: str) -> None:
    path = ENDPOINTSLICES.path(NAMESPACE)
    while True:
        try:
            async for event in rest.watch(path, rv, timeout_seconds=600):
                obj = event["object"]
                rv = obj["metadata"].get("resourceVersion", rv)
                if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    watcher.see(event["type"], obj, time.monotonic())
        except ApiError as e:
            if not e.gone:
                raise
            items, rv = await rest.list_pages(path)
            for obj in items:
                watcher.see("MODIFIED", obj, time.monotonic())


async def wait_for(what: str, check: Any, within: float = SETUP_TIMEOUT) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.5)
    raise TimeoutError(f"timed out after {within:.0f}s waiting for {what}")


def workload() -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "ServiceWorkload",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "team": TEAM,
            "replicas": PODS_COUNT,
            "strategy": {"maxSurge": 50, "maxUnavailable": 0},
            "template": {
                "metadata": {"labels": {"app": NAME}},
                "spec": {
                    "readinessGates": [{"conditionType": GATE}],
                    "containers": [
                        {
                            "name": "app",
                            "image": "example/web:1",
                            "ports": [{"name": "web", "containerPort": 8080}],
                        }
                    ],
                },
            },
            "service": {"ports": [{"name": "http", "port": 80, "targetPort": "web"}]},
        },
    }


def own_pod(sw: dict[str, Any], i: int) -> dict[str, Any]:
    meta = sw["metadata"]
    template = sw["spec"]["template"]
    return {
        "metadata": {
            "name": f"{NAME}-{i}",
            "namespace": NAMESPACE,
            "labels": {"app": NAME, LABEL_WORKLOAD: NAME},
            "ownerReferences": [
                {
                    "apiVersion": names.API_VERSION,
                    "kind": "ServiceWorkload",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": template["spec"],
    }


async def gather_limited(coros: list[Any], limit: int = 20) -> None:
    sem = asyncio.Semaphore(limit)

    async def one(c: Any) -> None:
        async with sem:
            await c

    await asyncio.gather(*(one(c) for c in coros))


async def setup(rest: Rest) -> bool:
    """Namespace, workload (and its pods unless a rollout controller makes them), and the
    built-in Service; returns whether the benchmark created the pods itself."""
    # A pod's team is its namespace's: the workload's team owns the namespace.
    await rest.create(
        NAMESPACES.path(), {"metadata": {"name": NAMESPACE, "labels": {names.LABEL_TEAM: TEAM}}}
    )

    await wait_default_service_account(rest, NAMESPACE)
    # Production pods of a team without a TeamQuota are refused at admission.
    await rest.create(
        TEAMQUOTAS.path(),
        {
            "apiVersion": names.API_VERSION,
            "kind": "TeamQuota",
            "metadata": {"name": TEAM},
            "spec": {
                "team": TEAM,
                "bands": {"production": {"cpu": "10000", "memory": "100000Gi", "pods": 5000}},
            },
        },
    )
    sw = await rest.create(SERVICEWORKLOADS.path(NAMESPACE), workload())
    own = not any(n in CONTROLLERS for n in ROLLOUT_CONTROLLERS)
    if own:
        await gather_limited(
            [rest.create(PODS.path(NAMESPACE), own_pod(sw, i)) for i in range(PODS_COUNT)]
        )
    await rest.create(
        SERVICES.path(NAMESPACE),
        {
            "metadata": {"name": BUILTIN, "namespace": NAMESPACE},
            "spec": {
                "selector": {"app": NAME},
                "ports": [{"name": "http", "port": 80, "targetPort": "web"}],
            },
        },
    )
    return own


async def flip(rest: Rest, pod: str, ready: bool) -> None:
    status = "True" if ready else "False"
    body = {
        "status": {
            "conditions": [{"type": GATE, "status": status}, {"type": "Ready", "status": status}]
        }
    }
    await rest.patch(PODS.path(NAMESPACE, pod, "status"), body, STRATEGIC_MERGE_PATCH)


async def operator_writes(port: int) -> dict[str, float]:
    """pilotfish_endpoints_slice_writes_total by verb, from the operator's /metrics."""
    out: dict[str, float] = {}
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{port}/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r,
        ):
            text = await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return out
    for line in text.splitlines():
        if line.startswith("pilotfish_endpoints_slice_writes_total{"):
            verb = line.split('verb="', 1)[1].split('"', 1)[0]
            out[verb] = float(line.rsplit(" ", 1)[1])
    return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def measure(layout: Layout, spec: ClusterSpec) -> dict[str, Any]:
    api = await api_client(str(layout.admin_kubeconfig))
    rest = Rest(api)
    watcher = Watcher()
    out: dict[str, Any] = {}
    try:
        out["pods_created_by"] = "benchmark" if await setup(rest) else "rollout controller"
        items, rv = await rest.list_pages(ENDPOINTSLICES.path(NAMESPACE))
        for obj in items:
            watcher.see("ADDED", obj, time.monotonic())
        watch = asyncio.create_task(watch_slices(rest, watcher, rv))

        async def all_ready() -> bool:
            return all(watcher.ready_count(m) >= PODS_COUNT for m in ("pilotfish", "builtin"))

        try:
            await wait_for(f"{PODS_COUNT} ready endpoints in both controllers' slices", all_ready)
        except TimeoutError as e:
            pods_seen, _ = await rest.list_pages(PODS.path(NAMESPACE))
            counts = {m: watcher.ready_count(m) for m in ("pilotfish", "builtin")}
            raise TimeoutError(f"{e}: ready {counts}, pods {len(pods_seen)}") from None
        pods = sorted(watcher.shown["builtin"])[:PODS_COUNT]
        random.Random(7).shuffle(pods)
        state = dict.fromkeys(pods, True)
        writes_before = await operator_writes(spec.ports.operator_metrics)

        watcher.counting = True
        sem = asyncio.Semaphore(IN_FLIGHT)
        errors = 0
        sent = 0

        patch_seconds: list[float] = []

        async def one(pod: str, ready: bool) -> None:
            nonlocal errors
            async with sem:
                # Lag counts from the moment the flip leaves for the API server, so time spent
                # queued in this process (when the API server falls behind) is not counted.
                sent_at = time.monotonic()
                watcher.expect(pod, ready, sent_at)
                try:
                    await flip(rest, pod, ready)
                except ApiError:
                    errors += 1
                patch_seconds.append(time.monotonic() - sent_at)

        tasks = []
        total = int(FLIPS_PER_SECOND * DURATION_SECONDS)
        start = time.monotonic()
        for i in range(total):
            due = start + i / FLIPS_PER_SECOND
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # paced: the next flip's send time, not a poll
            pod = pods[i % len(pods)]
            state[pod] = not state[pod]
            tasks.append(asyncio.create_task(one(pod, state[pod])))
            sent += 1
        flip_seconds = time.monotonic() - start
        await asyncio.gather(*tasks)

        async def drained() -> bool:
            return not any(watcher.pending.values())

        with contextlib.suppress(TimeoutError):
            await wait_for("every flip to show", drained, DRAIN_TIMEOUT)
        watcher.counting = False
        writes_after = await operator_writes(spec.ports.operator_metrics)
        watch.cancel()

        for m in ("pilotfish", "builtin"):
            lags = watcher.lags[m]
            out[m] = {
                "flips_seen": len(lags),
                "never_shown": watcher.missed[m] + len(watcher.pending[m]),
                "lag_p50_s": percentile(lags, 0.50),
                "lag_p99_s": percentile(lags, 0.99),
                "lag_max_s": max(lags) if lags else None,
                "lag_mean_s": statistics.fmean(lags) if lags else None,
                "slice_writes": watcher.writes[m],
                "writes_per_change": watcher.writes[m] / sent if sent else None,
            }
        out["flips_sent"] = sent
        out["flip_errors"] = errors
        out["flip_rate_achieved"] = sent / flip_seconds if flip_seconds else None
        out["flip_patch_p50_s"] = percentile(patch_seconds, 0.50)
        out["flip_patch_p99_s"] = percentile(patch_seconds, 0.99)
        out["load_average"] = os.getloadavg()
        out["cpus"] = os.cpu_count()
        out["operator_slice_writes_by_verb"] = {
            k: v - writes_before.get(k, 0.0) for k, v in writes_after.items()
        }
        p99_pf, p99_bi = out["pilotfish"]["lag_p99_s"], out["builtin"]["lag_p99_s"]
        out["lag_p99_ratio"] = p99_pf / p99_bi if p99_pf is not None and p99_bi else None
        out["writes_per_change"] = out["pilotfish"]["writes_per_change"]
        out["met"] = {
            "lag_p99_ratio": out["lag_p99_ratio"] is not None
            and out["lag_p99_ratio"] <= TARGET_LAG_RATIO,
            "writes_per_change": out["writes_per_change"] is not None
            and out["writes_per_change"] <= TARGET_WRITES_PER_CHANGE,
        }
    finally:
        await api.close()
    return out


def restart_operator(layout: Layout, spec: ClusterSpec, interval: float) -> None:
    """Run the operator with the endpoints controller's write interval overridden."""
    operator = next(c for c in host_processes(layout, spec.ports) if c.name == "pilotfish-operator")
    supervisor.stop(layout, operator.name)
    supervisor.start(
        layout, operator, env={ENV_MIN_WRITE_INTERVAL: str(interval)}, ready_timeout=60
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-write-interval", type=float, default=None)
    args = parser.parse_args(argv)
    spec = ClusterSpec(nodes=NODES, port_offset=PORT_OFFSET)
    interval = args.min_write_interval
    result: dict[str, Any] = {
        "benchmark": "endpoint_freshness",
        "inputs": {
            "nodes": NODES,
            "pods": PODS_COUNT,
            "flips_per_second": FLIPS_PER_SECOND,
            "duration_seconds": DURATION_SECONDS,
            "min_write_interval_seconds": MIN_WRITE_INTERVAL_SECONDS
            if interval is None
            else interval,
        },
        "target": {
            "lag_p99_ratio_max": TARGET_LAG_RATIO,
            "writes_per_change_max": TARGET_WRITES_PER_CHANGE,
        },
    }
    state = Path(tempfile.mkdtemp(prefix="pf-bench-ep-"))  # a fresh cluster every run
    try:
        with running_cluster(state, spec) as layout:
            if interval is not None:
                restart_operator(layout, spec, interval)
            result.update(asyncio.run(measure(layout, spec)))
    except Exception as e:  # a benchmark reports, it does not fail
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc(limit=5)
        result["operator_log_tail"] = supervisor.log_tail(Layout(state), "pilotfish-operator", 20)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
