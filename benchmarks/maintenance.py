"""maintenance: a NodeMaintenance drain against a sequential `kubectl drain`, same run.

The issue's figure: 20 of 100 kwok nodes drained by one NodeMaintenance with
`maxConcurrent: 5`, 50 ServiceWorkloads (4 replicas each, strategy maxUnavailable 1, so
each one's PodDisruptionBudget allows one pod down), 0 budget violations in samples every
0.5 s, the drain's time at most 0.3 of the time `kubectl drain --ignore-daemonsets
--delete-emptydir-data` of 20 other nodes, one after the other, takes on the same cluster;
and how many evictions the API server refused with 429 (the operator's
`pilotfish_maintenance_evictions_total{result="refused"}`; kubectl's own refusals from its
output).

One local cluster (`--nodes` kwok nodes, ports +`--port-offset`), the pods a few per node
all over it (`workload`). kubectl goes first, while the maintenance's nodes are cordoned so
that none of the pods it moves lands there; they are uncordoned again before the
NodeMaintenance is created. Each then drains the pods placed at the start (each phase's
count is in the JSON), and kubectl's nodes stay cordoned, as it leaves them. Between the
phases every workload is back at full Ready count with its budget allowing a disruption. A
violation is a sample, in either phase, with a workload below replicas - 1 Ready (not
terminating) pods.

Prints one JSON object (also written to `--out`) and exits 0 whether or not the targets
are met.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

if __package__ in (None, ""):  # run as `python benchmarks/maintenance.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (
    bounded,
    create_namespace,
    log,
    run_on_own_cluster,
    sample_every,
    wait_default_service_account,
    wait_for,
)
from benchmarks.probes import maintenance as probe
from benchmarks.probes.lostnodes import cordon
from pilotfish import names
from pilotfish.devcluster import binaries, cluster, supervisor
from pilotfish.devcluster import nodes as fleet
from pilotfish.devcluster.cluster import ClusterSpec
from pilotfish.devcluster.components import Layout
from pilotfish.kube.client import api_client
from pilotfish.kube.rest import (
    NODEMAINTENANCES,
    NODES,
    PODS,
    SERVICEWORKLOADS,
    TEAMQUOTAS,
    ApiError,
    Resource,
    Rest,
)
from pilotfish.workloads import LABEL_WORKLOAD

PORT_OFFSET: Final = 13000
TEAM: Final = "bench-maint"
NAMESPACE: Final = "bench-maint"
MAINTENANCE: Final = "bench-maint"
OPERATOR: Final = "pilotfish-operator"
TARGET_RATIO: Final = 0.3
SAMPLE_EVERY: Final = 0.5
PDBS: Final = Resource("policy", "v1", "poddisruptionbudgets")
ERROR_CHARS: Final = 1500
NUDGE_EVERY: Final = 5.0
NUDGE_ANNOTATION: Final = "bench.pilotfish.io/resync"


def workload(name: str, replicas: int, window: list[str]) -> dict[str, Any]:
    """A workload preferring the nodes of `window` (one of overlapping windows sliding along
    the fleet) and spreading over them: the pods end up a few per node all over the fleet,
    as a production cluster's would, where the scheduler alone would pack them onto a few
    nodes of an otherwise empty one. Preferred, not required: replacements go anywhere."""
    prefer = {
        "weight": 100,
        "preference": {
            "matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": window}
            ]
        },
    }
    spread = {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {LABEL_WORKLOAD: name}},
    }
    return {
        "apiVersion": names.API_VERSION,
        "kind": "ServiceWorkload",
        "metadata": {"name": name},
        "spec": {
            "team": TEAM,
            "replicas": replicas,
            "strategy": {"maxSurge": 1, "maxUnavailable": 1},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "app",
                            "image": "example/app:1",
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                        }
                    ],
                    "terminationGracePeriodSeconds": 5,
                    "topologySpreadConstraints": [spread],
                    "affinity": {
                        "nodeAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [prefer]
                        }
                    },
                },
            },
        },
    }


@dataclass
class Recorder:
    """Every SAMPLE_EVERY s: the benchmark's pods, every node and the NodeMaintenance."""

    rest: Rest
    samples: list[probe.Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    async def take(self) -> probe.Sample:
        at = time.time()
        pods, _ = await self.rest.list_pages(PODS.path(NAMESPACE))
        nodes, _ = await self.rest.list_pages(NODES.path())
        try:
            nm: dict[str, Any] | None = await self.rest.get(NODEMAINTENANCES.path(name=MAINTENANCE))
        except ApiError as e:
            if not e.not_found:
                raise
            nm = None
        return probe.sample(at, pods, nodes, nm)

    async def run(self) -> None:
        await sample_every(SAMPLE_EVERY, self.take, self.samples, self.errors)

    def between(self, start: float, end: float) -> list[probe.Sample]:
        return [s for s in self.samples if start <= s.at <= end]

    async def until(self, what: str, holds: Any, within: float) -> probe.Sample:
        async def check() -> bool:
            return bool(self.samples) and bool(holds(self.samples[-1]))

        await wait_for(what, check, within)
        return self.samples[-1]


@dataclass
class Bench:
    rest: Rest
    layout: Layout
    spec: ClusterSpec
    args: argparse.Namespace
    rec: Recorder

    def floors(self) -> dict[str, int]:
        return {f"{NAMESPACE}/w-{i}": self.args.replicas - 1 for i in range(self.args.workloads)}

    def full(self, s: probe.Sample) -> bool:
        return all(s.ready(w) == self.args.replicas for w in self.floors())

    async def refused(self) -> int | None:
        c = next(
            c for c in cluster.host_processes(self.layout, self.spec.ports) if c.name == OPERATOR
        )
        try:
            text = await asyncio.to_thread(supervisor.fetch, c.health, "/metrics")
        except OSError as e:
            log(f"operator metrics unreadable: {e}")
            return None
        return probe.refused_evictions(text)

    async def settle(self) -> None:
        """Every workload at full Ready count and its budget computed to allow one
        disruption: a phase started before the disruption controller has seen the pods
        would measure its lag (every eviction refused), not the drain."""
        await self.rec.until("every workload at full Ready count", self.full, self.args.timeout)
        wanted = {w.split("/", 1)[1] for w in self.floors()}

        late: list[dict[str, Any]] = []
        nudged = [0.0]

        async def budgets() -> bool:
            pdbs, _ = await self.rest.list_pages(PDBS.path(NAMESPACE))
            ok = {p["metadata"]["name"] for p in pdbs if probe.budget_allows(p, 1)}
            late[:] = [p for p in pdbs if p["metadata"]["name"] not in ok]
            failed = [p for p in late if probe.budget_sync_failed(p)]
            if failed and time.monotonic() - nudged[0] >= NUDGE_EVERY:
                nudged[0] = time.monotonic()
                await bounded(failed, 8, self.nudge)
            return wanted <= ok

        try:
            await wait_for("every budget allowing a disruption", budgets, self.args.timeout)
        except TimeoutError as e:
            first = late[0] if late else {}
            shown = {"name": (first.get("metadata") or {}).get("name"), **first.get("status", {})}
            raise TimeoutError(f"{e}; {len(late)} not, such as {json.dumps(shown)}") from None

    async def nudge(self, pdb: dict[str, Any]) -> None:
        """Touch a budget the disruption controller failed to sync, so it syncs it now.

        In a fresh cluster kube-controller-manager learns of the ServiceWorkload kind only at
        its next discovery refresh (every 30 s); a budget synced before that fails ("no
        matches for kind") and is retried with a backoff that doubles from 5 ms, minutes by
        the time the kind is known. An update event queues it again at once."""
        name = pdb["metadata"]["name"]
        body = {"metadata": {"annotations": {NUDGE_ANNOTATION: f"{time.time():.0f}"}}}
        try:
            await self.rest.patch(PDBS.path(NAMESPACE, name=name), body)
        except ApiError as e:
            log(f"budget {name} not touched: {e}")

    async def kubectl(self, nodes: list[str]) -> dict[str, Any]:
        """`kubectl drain` of each node in turn, as an admin would script it."""
        kubectl = str(binaries.bin_dir() / "kubectl")
        pods = probe.pods_on(self.rec.samples[-1], nodes)
        output: list[str] = []
        start = time.time()
        for node in nodes:
            cmd = [
                kubectl,
                "--kubeconfig",
                str(self.layout.admin_kubeconfig),
                "drain",
                node,
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                f"--timeout={int(self.args.timeout)}s",
            ]
            res = await asyncio.to_thread(
                subprocess.run, cmd, capture_output=True, text=True, check=False
            )
            output.append(res.stdout + res.stderr)
            if res.returncode != 0:
                last = res.stderr[-ERROR_CHARS:]
                raise RuntimeError(f"kubectl drain {node} exited {res.returncode}: ...{last}")
        end = time.time()
        return self.figures(start, end, pods) | {
            "refused_evictions": probe.kubectl_refusals("".join(output)),
        }

    async def maintenance(self, nodes: list[str]) -> dict[str, Any]:
        pods = probe.pods_on(self.rec.samples[-1], nodes)
        refused_before = await self.refused()
        body = {
            "apiVersion": names.API_VERSION,
            "kind": "NodeMaintenance",
            "metadata": {"name": MAINTENANCE},
            "spec": {"nodes": nodes, "maxConcurrent": self.args.max_concurrent},
        }
        start = time.time()
        await self.rest.create(NODEMAINTENANCES.path(), body)
        try:
            await self.rec.until(
                "the NodeMaintenance Done", lambda s: s.phase == "Done", self.args.timeout
            )
        except TimeoutError:
            nm = await self.rest.get(NODEMAINTENANCES.path(name=MAINTENANCE))
            raise TimeoutError(f"not Done: {json.dumps(nm.get('status'))[:2000]}") from None
        end = self.rec.samples[-1].at
        refused_after = await self.refused()
        samples = self.rec.between(start, end)
        refused = (
            None
            if refused_before is None or refused_after is None
            else refused_after - refused_before
        )
        return self.figures(start, end, pods) | {
            "refused_evictions": refused,
            "most_nodes_draining": probe.most_holding(samples, MAINTENANCE),
        }

    def figures(self, start: float, end: float, pods: int) -> dict[str, Any]:
        samples = self.rec.between(start, end)
        found = probe.budget_violations(samples, self.floors())
        return {
            "seconds": round(end - start, 2),
            "pods_on_drained_nodes": pods,
            "samples": len(samples),
            "violations": len(found),
            "violation_examples": found[:5],
        }


async def setup(rest: Rest, args: argparse.Namespace) -> None:
    quota = {
        "apiVersion": names.API_VERSION,
        "kind": "TeamQuota",
        "metadata": {"name": TEAM},
        "spec": {"team": TEAM, "bands": {band: {} for band in names.BANDS}},
    }
    await rest.create(TEAMQUOTAS.path(), quota)
    await create_namespace(rest, NAMESPACE, {names.LABEL_TEAM: TEAM})

    await wait_default_service_account(rest, NAMESPACE)

    every = [n["metadata"]["name"] for n in fleet.fleet(args.nodes)]
    step = max(1, len(every) // max(1, args.workloads))

    async def one(i: int) -> None:
        window = [every[(i * step + k) % len(every)] for k in range(args.replicas)]
        body = workload(f"w-{i}", args.replicas, window)
        await rest.create(SERVICEWORKLOADS.path(NAMESPACE), body)

    await bounded(range(args.workloads), 8, one)


async def measure(layout: Layout, spec: ClusterSpec, args: argparse.Namespace) -> dict[str, Any]:
    api = await api_client(str(layout.admin_kubeconfig))
    rest = Rest(api)
    rec = Recorder(rest)
    runner = asyncio.create_task(rec.run())
    bench = Bench(rest, layout, spec, args, rec)
    every = [n["metadata"]["name"] for n in fleet.fleet(spec.nodes)]
    by_kubectl, by_maintenance = every[: args.drain], every[args.drain : 2 * args.drain]
    out: dict[str, Any] = {}

    async def phase(name: str, run: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        """A phase that fails is reported by name; the next one still runs."""
        try:
            await bench.settle()
            log(f"phase {name}")
            out[name] = await run()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            if len(error) > ERROR_CHARS:  # kubectl's retries: its last words say why
                error = f"{error[:200]} ... {error[-ERROR_CHARS:]}"
            out[name] = {"error": error, "trace": traceback.format_exc(3)[-ERROR_CHARS:]}

    try:
        await setup(rest, args)
        log(f"{args.workloads} workloads of {args.replicas} created")
        await bench.settle()  # placed first: the cordon below must not steer the placement
        # The maintenance's nodes take none of the pods kubectl moves, so that both drain
        # the pods placed at the start, about as many each.
        await cordon(rest, by_maintenance, True)
        await phase("kubectl", lambda: bench.kubectl(by_kubectl))
        await cordon(rest, by_maintenance, False)
        await phase("maintenance", lambda: bench.maintenance(by_maintenance))
    finally:
        runner.cancel()
        await api.close()
    out["recorder_errors"] = rec.errors[:5]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--drain", type=int, default=20, help="nodes drained by each of the two")
    p.add_argument("--workloads", type=int, default=50)
    p.add_argument("--replicas", type=int, default=4, help="pods per workload")
    p.add_argument("--max-concurrent", type=int, default=5)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds a phase may take")
    p.add_argument("--port-offset", type=int, default=PORT_OFFSET)
    p.add_argument("--state", help="state directory (default: a fresh temp dir, removed after)")
    p.add_argument("--out", help="also write the JSON object to this file")
    args = p.parse_args(argv)
    if 2 * args.drain > args.nodes:
        p.error(f"--drain {args.drain}: two sets of it must fit in --nodes {args.nodes}")
    spec = ClusterSpec(nodes=args.nodes, port_offset=args.port_offset)
    inputs = {
        "nodes": args.nodes,
        "drained_each": args.drain,
        "workloads": args.workloads,
        "replicas": args.replicas,
        "max_concurrent": args.max_concurrent,
        "machine_cpus": os.cpu_count(),
    }

    def run(layout: Layout) -> dict[str, Any]:
        figures = asyncio.run(measure(layout, spec, args))
        out = probe.result(inputs, figures["maintenance"], figures["kubectl"], TARGET_RATIO)
        out["recorder_errors"] = figures["recorder_errors"]
        return out

    return run_on_own_cluster(
        "maintenance", spec, run, inputs=inputs, state=args.state, out_path=args.out
    )


if __name__ == "__main__":
    sys.exit(main())
