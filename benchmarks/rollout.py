"""rollout: a ServiceWorkload rollout against a built-in apps/v1 Deployment doing the same
(PERFORMANCE.md: 30 replicas, maxSurge 3, maxUnavailable 0, 2 s readiness delay; target:
Pilotfish's duration ÷ the Deployment's ≤ 1.1).

Both run in one namespace of a local cluster this benchmark starts (30 kwok nodes), with the
same pod template, the same labels (team and production band, so admission does the same
work for both) and the same scheduler. The readiness delay is the same mechanism for both:
the new template carries a scheduling gate of the benchmark's own, which it removes from each
pod READY_DELAY seconds after the pod appears (kwok marks a pod Ready as soon as it runs, and
its fast stage sets readinessGates True at once, so a gate before scheduling is the delay).

A rollout's duration runs from the template write to the moment the benchmark's watch shows
30 Ready pods of the new template and no pod of an older one left. Rounds alternate which
of the two goes first; the ratio is of the summed durations. The watch also records the most
pods each rollout had at once (the surge bound: 33). Prints one JSON object; exits 0
whether or not the target is met.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from benchmarks.common import load, wait_default_service_account
from pilotfish import names
from pilotfish.devcluster import supervisor
from pilotfish.devcluster.cluster import ClusterSpec, running_cluster
from pilotfish.devcluster.components import Layout
from pilotfish.kube.client import api_client
from pilotfish.kube.informer import Informer, Obj
from pilotfish.kube.rest import (
    JSON_PATCH,
    NAMESPACES,
    PODS,
    SERVICEWORKLOADS,
    TEAMQUOTAS,
    ApiError,
    Resource,
    Rest,
)

NODES: Final = 30
PORT_OFFSET: Final = 7000
REPLICAS: Final = 30
MAX_SURGE: Final = 3
MAX_UNAVAILABLE: Final = 0
READY_DELAY: Final = 2.0
TARGET_RATIO: Final = 1.1
ROUNDS: Final = 2
ROLLOUT_TIMEOUT: Final = 600.0

NAMESPACE: Final = "bench-rollout"
TEAM: Final = "bench-rollout"
GATE: Final = "bench.example.com/ready-after"
LABEL_KIND: Final = "bench.pilotfish.io/kind"  # which workload a pod belongs to
LABEL_VERSION: Final = "bench.pilotfish.io/version"
DEPLOYMENT: Final = "deployment"
SERVICEWORKLOAD: Final = "serviceworkload"

DEPLOYMENTS: Final = Resource("apps", "v1", "deployments")


def log(message: str) -> None:
    """Progress on stderr; stdout is kept for the one JSON object (run as a script by
    `make bench`, so this file imports nothing from the benchmarks package)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def wait_for(what: str, check: Callable[[], Awaitable[bool]], within: float) -> None:
    """Set-up only (never a measurement): poll until `check` holds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"timed out after {within:.0f}s waiting for {what}")


def template(kind: str, version: int, gated: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "app",
                "image": f"example/app:{version}",
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
            }
        ],
        "terminationGracePeriodSeconds": 5,
    }
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    return {
        "metadata": {
            "labels": {
                LABEL_KIND: kind,
                LABEL_VERSION: str(version),
                names.LABEL_TEAM: TEAM,
                names.LABEL_BAND: "production",
            }
        },
        "spec": spec,
    }


def deployment() -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": {LABEL_KIND: DEPLOYMENT}},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": MAX_SURGE, "maxUnavailable": MAX_UNAVAILABLE},
            },
            "template": template(DEPLOYMENT, 1, gated=False),
        },
    }


def service_workload() -> Obj:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "ServiceWorkload",
        "metadata": {"name": "web"},
        "spec": {
            "team": TEAM,
            "replicas": REPLICAS,
            "strategy": {"maxSurge": MAX_SURGE, "maxUnavailable": MAX_UNAVAILABLE},
            "template": template(SERVICEWORKLOAD, 1, gated=False),
        },
    }


def ready(pod: Obj) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def counted(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Failed", "Succeeded")


@dataclass
class Watch:
    """The benchmark's view of the pods: releases gates, detects completion, tracks peaks."""

    rest: Rest
    informer: Informer
    targets: dict[str, tuple[int, asyncio.Event]] = field(default_factory=dict)
    done_at: dict[str, float] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    released: int = 0
    seen: set[str] = field(default_factory=set)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def handle(self, kind: str, pod: Obj, _old: Obj | None) -> None:
        meta = pod["metadata"]
        name = meta["name"]
        gates = [g.get("name") for g in (pod.get("spec") or {}).get("schedulingGates") or []]
        if kind != "DELETED" and GATE in gates and name not in self.seen:
            self.seen.add(name)
            task = asyncio.get_running_loop().create_task(self._release(name))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        workload = (meta.get("labels") or {}).get(LABEL_KIND)
        if workload in self.targets:
            self._check(workload)

    async def _release(self, name: str) -> None:
        await asyncio.sleep(READY_DELAY)
        ops = [
            {"op": "test", "path": "/spec/schedulingGates/0/name", "value": GATE},
            {"op": "remove", "path": "/spec/schedulingGates/0"},
        ]
        try:
            await self.rest.patch(PODS.path(NAMESPACE, name), ops, JSON_PATCH)
        except ApiError as e:
            if e.status not in (404, 422):
                log(f"gate release of {name} failed: {e}")
            return
        self.released += 1

    def pods(self, workload: str) -> list[Obj]:
        return [
            p
            for p in self.informer.store.values()
            if (p["metadata"].get("labels") or {}).get(LABEL_KIND) == workload
        ]

    def _check(self, workload: str) -> None:
        version, event = self.targets[workload]
        pods = self.pods(workload)
        self.peak[workload] = max(self.peak.get(workload, 0), sum(1 for p in pods if counted(p)))
        done = all(
            (p["metadata"].get("labels") or {}).get(LABEL_VERSION) == str(version) for p in pods
        ) and (
            sum(1 for p in pods if ready(p) and not p["metadata"].get("deletionTimestamp"))
            == REPLICAS
        )
        if done and not event.is_set():
            self.done_at[workload] = time.monotonic()
            event.set()

    def expect(self, workload: str, version: int) -> asyncio.Event:
        event = asyncio.Event()
        self.targets[workload] = (version, event)
        self.peak[workload] = 0
        self._check(workload)
        return event


async def roll(rest: Rest, watch: Watch, workload: str, version: int) -> dict[str, Any]:
    """Write the new template and wait until the watch sees the rollout done."""
    tpl = template(workload, version, gated=True)
    event = watch.expect(workload, version)
    started = time.monotonic()
    op = [{"op": "replace", "path": "/spec/template", "value": tpl}]
    resource = DEPLOYMENTS if workload == DEPLOYMENT else SERVICEWORKLOADS
    await rest.patch(resource.path(NAMESPACE, "web"), op, JSON_PATCH)
    await asyncio.wait_for(event.wait(), ROLLOUT_TIMEOUT)
    duration = watch.done_at[workload] - started
    log(f"{workload} rolled out to version {version} in {duration:.2f}s")
    return {"seconds": round(duration, 3), "max_pods": watch.peak[workload]}


async def measure(layout: Layout) -> dict[str, Any]:
    api = await api_client(str(layout.admin_kubeconfig))
    rest = Rest(api)
    informer = Informer(rest, PODS, namespace=NAMESPACE, label_selector=LABEL_KIND)
    watch = Watch(rest, informer)
    informer.add_handler(watch.handle)
    runner = asyncio.create_task(informer.run())
    try:
        await rest.create(
            NAMESPACES.path(),
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": NAMESPACE, "labels": {names.LABEL_TEAM: TEAM}},
            },
        )

        await wait_default_service_account(rest, NAMESPACE)
        # Production pods of a team no TeamQuota grants are refused at admission.
        await rest.create(
            TEAMQUOTAS.path(),
            {
                "apiVersion": names.API_VERSION,
                "kind": "TeamQuota",
                "metadata": {"name": TEAM},
                "spec": {"team": TEAM, "bands": {"production": {}}},
            },
        )

        async def quota_seen() -> bool:
            probe = template(DEPLOYMENT, 0, gated=False)
            body = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "probe", **probe["metadata"]},
                "spec": probe["spec"],
            }
            try:
                await rest.request(
                    "POST", PODS.path(NAMESPACE), params={"dryRun": "All"}, body=body
                )
            except ApiError as e:
                if e.status == 403:
                    return False
                raise
            return True

        await wait_for("the TeamQuota seen by admission", quota_seen, 60)
        await informer.synced.wait()
        await rest.create(DEPLOYMENTS.path(NAMESPACE), deployment())
        await rest.create(SERVICEWORKLOADS.path(NAMESPACE), service_workload())
        for workload in (DEPLOYMENT, SERVICEWORKLOAD):
            await asyncio.wait_for(watch.expect(workload, 1).wait(), ROLLOUT_TIMEOUT)
        log("both workloads have 30 ready pods")

        rounds: list[dict[str, Any]] = []
        version = 1
        for i in range(ROUNDS):
            version += 1
            order = (DEPLOYMENT, SERVICEWORKLOAD) if i % 2 == 0 else (SERVICEWORKLOAD, DEPLOYMENT)
            results = {w: await roll(rest, watch, w, version) for w in order}
            rounds.append({"first": order[0], **results})
        total_sw = sum(r[SERVICEWORKLOAD]["seconds"] for r in rounds)
        total_dep = sum(r[DEPLOYMENT]["seconds"] for r in rounds)
        ratio = total_sw / total_dep if total_dep else None
        return {
            "rounds": rounds,
            "pilotfish_seconds": round(total_sw / ROUNDS, 3),
            "deployment_seconds": round(total_dep / ROUNDS, 3),
            "ratio": None if ratio is None else round(ratio, 3),
            "met": ratio is not None and ratio <= TARGET_RATIO,
            "gates_released": watch.released,
            "pilotfish_max_pods": max(r[SERVICEWORKLOAD]["max_pods"] for r in rounds),
            "deployment_max_pods": max(r[DEPLOYMENT]["max_pods"] for r in rounds),
        }
    finally:
        runner.cancel()
        for t in list(watch.tasks):
            t.cancel()
        await api.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--state", help="use this state directory (default: a fresh one)")
    args = parser.parse_args(argv)
    spec = ClusterSpec(nodes=NODES, port_offset=PORT_OFFSET)
    result: dict[str, Any] = {
        "benchmark": "rollout",
        "inputs": {
            "nodes": NODES,
            "replicas": REPLICAS,
            "max_surge": MAX_SURGE,
            "max_unavailable": MAX_UNAVAILABLE,
            "readiness_delay_seconds": READY_DELAY,
            "rounds": ROUNDS,
        },
        "target": {"ratio_max": TARGET_RATIO},
    }
    state = Path(args.state) if args.state else Path(tempfile.mkdtemp(prefix="pf-bench-ro-"))
    load_start = load()
    try:
        with running_cluster(state, spec) as layout:
            result.update(asyncio.run(measure(layout)))
    except Exception as e:  # a benchmark reports, it does not fail
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc(limit=5)
        result["operator_log_tail"] = supervisor.log_tail(Layout(state), "pilotfish-operator", 20)
    finally:
        if not args.state:
            shutil.rmtree(state, ignore_errors=True)
    result["load_average"] = {"start": load_start, "end": load()}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
