"""reclaim: cluster CPU used with reclaim off and on in one run, then a production spike.

The issue's figure: on `--nodes` kwok nodes (50; the fleet's 32-core machines) production
requests 70 % of each node's CPU and uses 40 % (`--production` ServiceWorkloads, one pod of
each on every node, spread by a hard topology constraint, with kwok usage annotations), and
a backlog of batch tasks (a BatchWorkload of 2-core tasks using what they ask, more than
fit) fills what it may:

- `off`: the backlog in a namespace without `pilotfish.io/reclaim`: its tasks ask for cpu
  and fit only into what production left unreserved;
- `on`: the same backlog in a namespace labelled `pilotfish.io/reclaim=enabled`: the webhook
  moves its requests to `batch.pilotfish.io/*`, placed against the reclaim controller's
  figure (allocatable - production's p95 - 10 % margin).

Each phase is measured once placement has settled (no bind for a cycle and a backlog still
waiting): CPU used ÷ capacity, where used is the usage kwok reports for the pods bound and
running (their `kwok.x-k8s.io/usage-cpu` annotations, what Prometheus scrapes), and, as a
cross-check, Prometheus's `sum(rate(node_cpu_usage_seconds_total[1m]))` (which lags a
placement by its 1-minute rate). The `off` job is suspended before `on` starts.

Then the spike: production's usage on `--spike-nodes` nodes rises to its request (a patch
of each pod's annotation; the clock starts when the last one is acknowledged). Sampled every
second: how long until each spiked node's batch figure went down, its first batch task was
evicted and what batch holds there fit the figure again, in seconds and in cycles of the
reclaim controller (`--interval`); production pods evicted (target 0) and batch tasks moved
off the other nodes. The full give-back trails the first reduction: `rate(...[1m])` takes a
minute to reach a new level, so the figure comes down over that minute, cycle by cycle.

Prints one JSON object (also written to `--out`) and exits 0 whether or not the targets are
met. Smoke run: `--nodes 6`.
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

if __package__ in (None, ""):  # run as `python benchmarks/reclaim.py`
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
from benchmarks.probes import reclaim as probe
from pilotfish import names, quantity
from pilotfish.devcluster import prometheus
from pilotfish.devcluster.cluster import ClusterSpec
from pilotfish.devcluster.components import Layout
from pilotfish.devcluster.kwokusage import ANNOTATION_USAGE_CPU, ANNOTATION_USAGE_MEMORY
from pilotfish.devcluster.stages import ANNOTATION_RUN_SECONDS
from pilotfish.kube.client import api_client
from pilotfish.kube.rest import BATCHWORKLOADS, NODES, PODS, SERVICEWORKLOADS, TEAMQUOTAS, Rest
from pilotfish.promql import PrometheusClient, PromQLError
from pilotfish.workloads import LABEL_BATCH, LABEL_WORKLOAD

PORT_OFFSET: Final = 17000
TEAM: Final = "bench-reclaim"
PROD: Final = "bench-reclaim-prod"
OFF: Final = "bench-reclaim-off"
ON: Final = "bench-reclaim-on"
JOB: Final = "backlog"
OPERATOR: Final = "pilotfish-operator"
TARGET_RATIO: Final = 0.6
SAMPLE_EVERY: Final = 1.0
GI: Final = 1024**3
MARGIN: Final = 0.1  # the reclaim controller's default, which the benchmark keeps
FAKE_NODES: Final = f"{names.LABEL_FAKE_NODE}=true"
NODE_CPU_QUERY: Final = 'sum(rate(node_cpu_usage_seconds_total{job="kubelet-resource"}[1m]))'


def settings(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    return (
        (prometheus.SCRAPE_INTERVAL_ENV, args.scrape),
        ("PILOTFISH_RECLAIM_INTERVAL_SECONDS", f"{args.interval:g}"),
        ("PILOTFISH_RECLAIM_WINDOW", args.window),
        ("PILOTFISH_RECLAIM_STALE_AFTER_SECONDS", f"{max(3 * args.interval, 30):g}"),
    )


def template(
    container: str, cpu: int, memory: str, use_cpu: int, use_memory: int, **spec: Any
) -> dict[str, Any]:
    """One container asking `cpu` millicores and `memory`, using `use_cpu` and
    `use_memory` bytes (kwok's usage annotations)."""
    usage = {ANNOTATION_USAGE_CPU: f"{use_cpu}m", ANNOTATION_USAGE_MEMORY: str(use_memory)}
    resources = {"requests": {"cpu": f"{cpu}m", "memory": memory}}
    return {
        "metadata": {"labels": {"app": container}, "annotations": usage},
        "spec": {
            "containers": [{"name": container, "image": "example/x:1", "resources": resources}],
            "terminationGracePeriodSeconds": 0,
            **spec,
        },
    }


def service(name: str, replicas: int, cpu: int, use: int) -> dict[str, Any]:
    """`replicas` production pods, one per node (a hard spread), asking `cpu` millicores and
    using `use`, 16 GiB asked and 8 GiB used."""
    spread = {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {LABEL_WORKLOAD: name}},
    }
    tpl = template("app", cpu, "16Gi", use, 8 * GI, topologySpreadConstraints=[spread])
    spec = {"team": TEAM, "replicas": replicas, "template": tpl}
    return {
        "apiVersion": names.API_VERSION,
        "kind": "ServiceWorkload",
        "metadata": {"name": name},
        "spec": spec,
    }


def backlog(tasks: int, cpu: int) -> dict[str, Any]:
    """`tasks` batch tasks asking `cpu` millicores and 4 GiB, using all the cpu they ask,
    all allowed at once, each running for an hour (longer than the benchmark)."""
    tpl = template("task", cpu, "4Gi", cpu, 2 * GI, restartPolicy="Never")
    tpl["metadata"]["annotations"][ANNOTATION_RUN_SECONDS] = "3600"
    spec = {"team": TEAM, "band": "batch", "completions": tasks, "parallelism": tasks}
    return {
        "apiVersion": names.API_VERSION,
        "kind": "BatchWorkload",
        "metadata": {"name": JOB},
        "spec": {**spec, "template": tpl},
    }


class Bench:
    def __init__(self, rest: Rest, prom: PrometheusClient, args: argparse.Namespace) -> None:
        self.rest, self.prom, self.args = rest, prom, args
        self.nodes: list[dict[str, Any]] = []
        self.samples: list[probe.Sample] = []
        self.errors: list[str] = []

    async def list_nodes(self) -> list[dict[str, Any]]:
        items, _ = await self.rest.list_pages(NODES.path(), {"labelSelector": FAKE_NODES})
        return items

    async def pods(self, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": selector} if selector else None
        items, _ = await self.rest.list_pages(PODS.path(namespace), params)
        return items

    async def setup(self) -> None:
        quota = {
            "apiVersion": names.API_VERSION,
            "kind": "TeamQuota",
            "metadata": {"name": TEAM},
            "spec": {"team": TEAM, "bands": {band: {} for band in names.BANDS}},
        }
        await self.rest.create(TEAMQUOTAS.path(), quota)
        await create_namespace(self.rest, PROD, {names.LABEL_TEAM: TEAM})
        await create_namespace(self.rest, OFF, {names.LABEL_TEAM: TEAM})
        await create_namespace(
            self.rest, ON, {names.LABEL_TEAM: TEAM, names.LABEL_RECLAIM: "enabled"}
        )
        for ns in (PROD, OFF, ON):
            await wait_default_service_account(self.rest, ns)
        await wait_for("the webhook translating batch pods in " + ON, self.translated, 60)
        self.nodes = await self.list_nodes()

    async def translated(self) -> bool:
        pod = {"apiVersion": "v1", "kind": "Pod", **template("c", 1000, "1Gi", 1, 1)}
        pod["metadata"] |= {"name": "probe", "labels": {names.LABEL_BAND: "batch"}}
        try:
            made = await self.rest.request(
                "POST", PODS.path(ON), body=pod, params={"dryRun": "All"}
            )
        except Exception as e:  # quota or namespaces not seen by admission yet
            log(f"dry run in {ON}: {e}")
            return False
        requests = made["spec"]["containers"][0].get("resources", {}).get("requests", {})
        return names.BATCH_CPU in requests

    def node_cpu(self) -> int:
        return quantity.milli(self.nodes[0]["status"]["capacity"]["cpu"])

    async def production(self) -> None:
        k, cpu = self.args.production, self.node_cpu()
        ask = int(cpu * self.args.request_share) // k
        use = int(cpu * self.args.usage_share) // k
        log(f"production: {k} ServiceWorkloads x {len(self.nodes)} pods, {ask}m asked, {use}m used")

        async def one(i: int) -> None:
            body = service(f"svc-{i}", len(self.nodes), ask, use)
            await self.rest.create(SERVICEWORKLOADS.path(PROD), body)

        await bounded(range(k), 4, one)
        want: int = k * len(self.nodes)

        async def placed() -> bool:
            running: int = sum(probe.running(p) for p in await self.pods(PROD))
            return running == want

        await wait_for(f"{want} production pods running", placed, self.args.timeout)

    async def measured(self) -> None:
        """Every node's figure measured from production's usage: the p95 within 5 % of it."""
        use = self.node_cpu() * self.args.usage_share

        async def ok() -> bool:
            figs = [probe.node_figure(n) for n in await self.list_nodes()]
            return all(
                f.measured and abs(float(f.shown("cpu", "p95") or 0) - use) <= 0.05 * use
                for f in figs
            )

        await wait_for("every node's batch figure measured", ok, self.args.timeout)

    async def settled(self, namespace: str) -> None:
        """No bind for a cycle and a scrape while tasks still wait: the backlog has what
        it may have."""
        quiet = self.args.interval + 5
        last: list[Any] = [None, time.monotonic()]

        async def still() -> bool:
            pods = await self.pods(namespace, f"{LABEL_BATCH}={JOB}")
            bound = sum(probe.running(p) for p in pods)
            waiting = sum(1 for p in pods if not p["spec"].get("nodeName"))
            if bound != last[0]:
                last[:] = [bound, time.monotonic()]
                return False
            return bound > 0 and waiting > 0 and time.monotonic() - last[1] >= quiet

        await wait_for(f"placement settled in {namespace}", still, self.args.timeout, 1.0)

    async def phase(self, namespace: str) -> dict[str, Any]:
        tasks = self.args.tasks_per_node * len(self.nodes)
        log(f"phase {namespace}: {tasks} tasks of {self.args.task_cpu}m")
        await self.rest.create(BATCHWORKLOADS.path(namespace), backlog(tasks, self.args.task_cpu))
        await self.settled(namespace)
        nodes = await self.list_nodes()
        pods = await self.pods(PROD) + await self.pods(namespace)
        out = probe.utilisation(nodes, pods).as_json()
        out["prometheus_node_cpu_cores"] = await self.prometheus_cpu()
        figs = [probe.node_figure(n) for n in nodes]
        cpus = [f.cpu for f in figs if f.cpu is not None]
        out["batch_allocatable_cores"] = {
            "min": min(cpus) / 1000 if cpus else None,
            "max": max(cpus) / 1000 if cpus else None,
        }
        log(f"phase {namespace}: {json.dumps(out)}")
        return out

    async def prometheus_cpu(self) -> float | None:
        try:
            found = await self.prom.query(NODE_CPU_QUERY)
        except PromQLError as e:
            log(f"prometheus: {e}")
            return None
        return round(found[0].value, 3) if found else None

    async def stop(self, namespace: str) -> None:
        path = BATCHWORKLOADS.path(namespace, name=JOB)
        await self.rest.patch(path, {"spec": {"suspend": True}})

        async def gone() -> bool:
            pods = await self.pods(namespace, f"{LABEL_BATCH}={JOB}")
            return not any(probe.live(p) for p in pods)

        await wait_for(f"the {namespace} backlog stopped", gone, self.args.timeout)

    async def take(self) -> probe.Sample:
        at = time.time()
        nodes = await self.list_nodes()
        return probe.sample(at, nodes, await self.pods(ON), await self.pods(PROD))

    async def spike(self) -> dict[str, Any]:
        chosen = sorted(n["metadata"]["name"] for n in self.nodes)[: self.args.spike_nodes]
        recorder = asyncio.create_task(
            sample_every(SAMPLE_EVERY, self.take, self.samples, self.errors)
        )
        try:
            await wait_for("a first sample", self.any_sample, 30)
            await asyncio.sleep(2 * SAMPLE_EVERY)
            prod = [p for p in await self.pods(PROD) if p["spec"].get("nodeName") in chosen]
            log(f"spike: {len(prod)} production pods on {len(chosen)} nodes to their request")
            spiked = self.after_spike(chosen, prod)

            async def rise(p: dict[str, Any]) -> None:
                asked = p["spec"]["containers"][0]["resources"]["requests"]["cpu"]
                body = {"metadata": {"annotations": {ANNOTATION_USAGE_CPU: asked}}}
                await self.rest.patch(PODS.path(PROD, name=p["metadata"]["name"]), body)

            await bounded(prod, 8, rise)
            spike_at = time.time()

            async def given_back() -> bool:
                got = probe.give_back(self.samples, spiked, spike_at)
                return got.get("to_fits_s") is not None

            within = self.args.spike_cycles * self.args.interval
            try:
                await wait_for("batch given back on every spiked node", given_back, within)
            except TimeoutError as e:
                log(str(e))
            await asyncio.sleep(2 * SAMPLE_EVERY)  # evictions elsewhere would show by now
        finally:
            recorder.cancel()
        out = probe.give_back(self.samples, spiked, spike_at)
        out["recorder_errors"] = self.errors[:5]
        return out

    def after_spike(self, chosen: list[str], prod: list[dict[str, Any]]) -> dict[str, int]:
        """Each spiked node's figure once production uses all it asks: A - R - margin."""
        out, a = {}, self.node_cpu()  # the fleet is of one machine class
        for name in chosen:
            asked = sum(
                quantity.milli(p["spec"]["containers"][0]["resources"]["requests"]["cpu"])
                for p in prod
                if p["spec"]["nodeName"] == name
            )
            out[name] = max(0, a - asked - int(a * MARGIN))
        return out

    async def any_sample(self) -> bool:
        return bool(self.samples)


async def measure(layout: Layout, spec: ClusterSpec, args: argparse.Namespace) -> dict[str, Any]:
    api = await api_client(str(layout.admin_kubeconfig))
    prom = PrometheusClient(prometheus.url(spec.ports))
    bench = Bench(Rest(api), prom, args)
    out: dict[str, Any] = {}
    try:
        await bench.setup()
        await bench.production()
        first = {p["metadata"]["uid"] for p in await bench.pods(PROD)}
        await bench.measured()
        out["off"] = await bench.phase(OFF)
        await bench.stop(OFF)
        out["on"] = await bench.phase(ON)
        out["spike"] = await bench.spike()
        last = {p["metadata"]["uid"] for p in await bench.pods(PROD) if probe.live(p)}
        out["production_pods_lost_whole_run"] = len(first - last)
    finally:
        await prom.close()
        await api.close()
    return out


def summary(
    figures: dict[str, Any], args: argparse.Namespace, inputs: dict[str, Any]
) -> dict[str, Any]:
    on = figures.get("on") or {}
    spike = figures.get("spike") or {}
    lost = figures.get("production_pods_lost_whole_run")
    ratio = on.get("used_over_capacity")
    judged = probe.verdict(ratio, spike, args.interval, TARGET_RATIO, lost or 0)
    return {
        "benchmark": "reclaim",
        "inputs": inputs,
        "used": "kwok's usage annotations of the pods bound and running (production + batch); "
        "prometheus_node_cpu_cores is Prometheus's sum(rate(node_cpu_usage_seconds_total[1m]))",
        "off": figures.get("off"),
        "on": on,
        "spike": spike,
        "figures": judged["figures"],
        "targets": {
            "used_over_capacity_on": f">= {TARGET_RATIO}",
            "spike_to_reduced_cycles": "<= 1",
            "spike_to_first_eviction_cycles": "<= 1",
            "production_evictions": "0",
        },
        "checks": judged["checks"],
        "met": judged["met"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=50)
    p.add_argument("--production", type=int, default=4, help="ServiceWorkloads, a pod per node")
    p.add_argument("--request-share", type=float, default=0.7, help="of each node's cpu")
    p.add_argument("--usage-share", type=float, default=0.4, help="of each node's cpu")
    p.add_argument("--task-cpu", type=int, default=2000, help="millicores per batch task")
    p.add_argument("--tasks-per-node", type=int, default=12, help="the backlog's size")
    p.add_argument("--spike-nodes", type=int, default=0, help="default: a fifth of the nodes")
    p.add_argument("--spike-cycles", type=float, default=8, help="cycles the give-back may take")
    p.add_argument("--interval", type=float, default=60.0, help="reclaim cycle, seconds")
    p.add_argument("--window", default="1h", help="reclaim p95 window")
    p.add_argument("--scrape", default="15s", help="Prometheus scrape interval")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a step may take")
    p.add_argument("--port-offset", type=int, default=PORT_OFFSET)
    p.add_argument("--state", help="state directory (default: a fresh temp dir, removed after)")
    p.add_argument("--out", help="also write the JSON object to this file")
    args = p.parse_args(argv)
    args.spike_nodes = args.spike_nodes or max(1, args.nodes // 5)
    if args.spike_nodes > args.nodes:
        p.error(f"--spike-nodes {args.spike_nodes}: more than --nodes {args.nodes}")
    spec = ClusterSpec(nodes=args.nodes, port_offset=args.port_offset, settings=settings(args))
    skipped = ("timeout", "port_offset", "state", "out")
    inputs = {k: v for k, v in vars(args).items() if k not in skipped}
    inputs |= {"margin": MARGIN, "machine_cpus": os.cpu_count()}

    def run(layout: Layout) -> dict[str, Any]:
        return summary(asyncio.run(measure(layout, spec, args)), args, inputs)

    return run_on_own_cluster(
        "reclaim", spec, run, inputs=inputs, state=args.state, out_path=args.out
    )


if __name__ == "__main__":
    sys.exit(main())
