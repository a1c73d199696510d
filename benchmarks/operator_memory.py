"""operator_memory: the operator's resident memory and its watches with 30,000 pods on 500
nodes (issue 9: RSS at most 300 MB, one watch per resource kind and selector).

    .venv/bin/python -m benchmarks.operator_memory --nodes 500 --pods 30000 --out mem.json
    .venv/bin/python -m benchmarks.operator_memory --nodes 50 --pods 3000 \\
        --state /tmp/pf-mem --port-offset 3000        # reuse (or make) a cluster, leave it up

About 6 minutes at full scale on 2 shared cores, half of it the API server creating pods
(about 160/s); a fresh temporary cluster unless `--state` is given. `make bench` runs it
with the defaults.

One run, one local control plane, the real `pilotfish operator` process (every controller)
restarted under its supervisor for each phase:

1. idle: a fresh operator on the empty cluster, waited until synced;
2. the pods: `--pods` real pods in namespaces the admission webhooks skip (the tenant webhook
   refuses a preset `spec.nodeName`), created by a bounded pool of concurrent requests, bound
   round-robin to the kwok nodes (the scheduler is not in the way). A tenth hold a scheduling
   gate with the record the webhook writes (the gate controller's view), three tenths carry
   the ServiceWorkload label (the rollout and endpoints controllers' views; no ServiceWorkload
   owns them, so nothing writes to them), all are in a team's namespaces (the quota
   controller's). `--webhook-pods` more go through the webhooks, to say what they cost: half
   for a team with batch limits (every admission reserves in its TeamQuota), half for a team
   whose batch band is unlimited (the webhooks alone);
3. the operator that watched them arrive, then a fresh one that lists them all;
4. the floor: the operator with no controller (`--controllers=`, which never imports kopf);
   what importing kopf adds to a fresh interpreter (None when kopf is not installed); and
   which views kopf watches in the full operator (the NodeMaintenances only: pods and nodes
   are watched once, by the runtime's informers).

Synced means, from the API server's side: every (resource, selector) the process listed has a
watch opened after its last list (the audit log, which logs the operator's lists and watches),
nothing new listed for a while, resident memory steady, and, where the operator exports
`pilotfish_informer_objects`, its pod views hold the pods. Watches are counted from the audit
log by resource, namespace and selector (attributed to this process and to kopf or the
runtime by user agent) and cross-checked with `apiserver_longrunning_requests{verb="WATCH"}`
(v1.36 no longer has `apiserver_registered_watchers`): the change per resource when the
operator starts. Prints one JSON object (also to `--out`) and exits 0 whether or not the
targets are met.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Final

if __package__ in (None, ""):  # run as `python benchmarks/operator_memory.py` (make bench)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (
    bounded,
    create_namespace,
    delete_namespace,
    emit,
    log,
    wait_default_service_account,
)
from benchmarks.gate_release import pod_body as gated_pod_body
from benchmarks.probes.operator import OPERATOR, Bench, measure_synced, phase
from benchmarks.probes.watches import AuditTail, proc_memory
from pilotfish import names
from pilotfish.devcluster import cluster, nodes, supervisor
from pilotfish.devcluster.cluster import ClusterSpec
from pilotfish.devcluster.components import Layout
from pilotfish.kube.client import api_client
from pilotfish.kube.rest import GATESIGNALS, NAMESPACES, PODS, TEAMQUOTAS, ApiError, Rest
from pilotfish.workloads import LABEL_WORKLOAD

TARGETS: Final = {"rss_mb_max": 300.0, "watches_per_resource_and_selector_max": 1}
# The only views kopf may watch (the maintenance controller's NodeMaintenances).
KOPF_VIEWS: Final = frozenset({f"{names.GROUP}/nodemaintenances"})
TEAM: Final = "bench-mem"
TEAM_OPEN: Final = "bench-mem-open"
BIG: Final = {"cpu": "100000", "memory": "100000Gi", "pods": 1_000_000}
NS_PREFIX: Final = "bench-mem-"
PODS_PER_NAMESPACE: Final = 3000
GATE: Final = "gates.pilotfish.io/bench-hold"


def plain_pod(name: str, node: str | None, labels: dict[str, str]) -> dict[str, Any]:
    """A pod bound to `node` at creation, or (None) left to the scheduler."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "bench-mem", **labels}},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "example/app:1",
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                }
            ],
        },
    }
    if node is not None:
        body["spec"]["nodeName"] = node
    return body


def bulk_pods(count: int, node_names: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(namespace, body): a tenth gated, three tenths ServiceWorkload-labelled, the rest plain."""
    for i in range(count):
        ns = f"{NS_PREFIX}{i // PODS_PER_NAMESPACE}"
        name = f"p-{i}"
        if i % 10 == 0:
            yield ns, gated_pod_body(name, GATE, signal="hold")
        elif i % 10 <= 3:
            yield ns, plain_pod(name, node_names[i % len(node_names)], {LABEL_WORKLOAD: "web"})
        else:
            yield ns, plain_pod(name, node_names[i % len(node_names)], {})


async def create_all(
    rest: Rest, items: Iterable[tuple[str, dict[str, Any]]], concurrency: int
) -> dict[str, Any]:
    errors: Counter[str] = Counter()

    async def one(item: tuple[str, dict[str, Any]]) -> None:
        try:
            await rest.create(PODS.path(item[0]), item[1])
        except ApiError as e:
            errors[f"{e.status} {e.message[:300]}"] += 1

    todo = list(items)
    start = time.monotonic()
    await bounded(todo, concurrency, one)
    seconds = time.monotonic() - start
    return {
        "pods": len(todo) - sum(errors.values()),
        "seconds": round(seconds, 1),
        "pods_per_second": round(len(todo) / seconds, 1) if seconds else None,
        "errors": dict(errors),
    }


async def bench_namespaces(rest: Rest) -> list[str]:
    items, _ = await rest.list_pages(NAMESPACES.path())
    return [
        str(n["metadata"]["name"]) for n in items if n["metadata"]["name"].startswith(NS_PREFIX)
    ]


async def make_namespace(rest: Rest, name: str, labels: dict[str, str]) -> None:
    await create_namespace(rest, name, labels)
    await rest.create(
        GATESIGNALS.path(name),
        {"apiVersion": names.API_VERSION, "kind": "GateSignal", "metadata": {"name": "hold"}},
    )

    await wait_default_service_account(rest, name)


async def team_quota(rest: Rest, team: str, batch: dict[str, Any]) -> None:
    body = {
        "apiVersion": names.API_VERSION,
        "kind": "TeamQuota",
        "metadata": {"name": team},
        "spec": {"team": team, "bands": {"production": BIG, "batch": batch}},
    }
    try:
        await rest.create(TEAMQUOTAS.path(), body)
    except ApiError as e:
        if not e.conflict:
            raise


async def create_objects(rest: Rest, args: argparse.Namespace) -> dict[str, Any]:
    """The pods, and two samples through the webhooks: a team with batch limits (each
    admission reserves in the TeamQuota's status) and one whose batch band is unlimited
    (nothing to reserve: the webhooks' own cost)."""
    spaces = -(-args.pods // PODS_PER_NAMESPACE)
    for i in range(spaces):
        labels = {names.LABEL_TEAM: TEAM, names.LABEL_WEBHOOKS: names.WEBHOOKS_DISABLED}
        await make_namespace(rest, f"{NS_PREFIX}{i}", labels)
    await team_quota(rest, TEAM, BIG)
    await team_quota(rest, TEAM_OPEN, {})
    node_names = [n["metadata"]["name"] for n in nodes.fleet(args.nodes)]
    log(f"creating {args.pods} pods in {spaces} namespaces the webhooks skip")
    out: dict[str, Any] = {
        "namespaces": spaces,
        "skipping_webhooks": await create_all(
            rest, bulk_pods(args.pods, node_names), args.concurrency
        ),
    }
    log(f"created: {out['skipping_webhooks']}")
    rate = out["skipping_webhooks"]["pods_per_second"]
    for key, team in (("reserving", TEAM), ("unlimited", TEAM_OPEN)):
        ns = f"{NS_PREFIX}webhooks-{key}"
        await make_namespace(rest, ns, {names.LABEL_TEAM: team})
        sample = [(ns, plain_pod(f"w-{i}", None, {})) for i in range(args.webhook_pods // 2)]
        made = await create_all(rest, sample, args.concurrency)
        hooked = made["pods_per_second"]
        made["rate_over_skipping"] = round(hooked / rate, 3) if rate and hooked else None
        out[f"through_webhooks_{key}"] = made
        log(f"through the webhooks ({key} quota): {made}")
    return out


def kopf_import_mb() -> float | None:
    """What importing kopf adds to a process that already has the operator's other libraries
    (each measured in a fresh interpreter): kopf's floor, before it watches anything. None
    when kopf is not installed."""
    base = "import aiohttp, prometheus_client, pilotfish.kube.rest"
    probe = "; print(open('/proc/self/status').read())"
    rss = []
    for code in (base, base + ", kopf"):
        done = subprocess.run(
            [sys.executable, "-c", code + probe], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            return None
        rss.append(proc_memory(done.stdout)["VmRSS"])
    return round(rss[1] - rss[0], 1)


async def run(b: Bench, args: argparse.Namespace, out: dict[str, Any]) -> None:
    """The phases, each one's figures added to `out` as soon as measured (a later failure
    keeps them)."""
    leftovers = await bench_namespaces(b.rest)
    if leftovers:
        log(f"deleting leftovers of an earlier run: {leftovers}")
        await asyncio.gather(*(delete_namespace(b.rest, n, args.timeout) for n in leftovers))
    try:
        await phases(b, args, out)
    finally:
        if b.extra:
            log("restoring the operator as installed")
            await b.restart_operator(())
    out["kopf_import_mb"] = kopf_import_mb()


async def phases(b: Bench, args: argparse.Namespace, out: dict[str, Any]) -> None:
    log("idle: a fresh operator on the empty cluster")
    op = await b.restart_operator(())
    out["idle"] = await measure_synced(b, op, 0, args.timeout)
    out["creation"] = await create_objects(b.rest, args)
    made = out["creation"]
    total = out["pods"] = sum(v["pods"] for k, v in made.items() if k != "namespaces")
    log("after: the operator that watched the pods arrive")
    out["after_watching"] = await measure_synced(b, op, total, args.timeout)
    log("after: a fresh operator listing every pod")
    out["after_fresh_start"] = await phase(b, (), total, args.timeout)
    log("the floor: no controller (--controllers=)")
    out["no_hot_path_controllers"] = await phase(
        b, ("--controllers=",), 0, args.timeout, lists=False
    )


def summary(raw: dict[str, Any]) -> dict[str, Any]:
    idle, fresh = raw["idle"], raw["after_fresh_start"]
    after = max(fresh["vmrss_mb"], raw["after_watching"]["vmrss_mb"])
    kopf_views = sorted({w["resource"] for w in fresh["watches"] if w["client"] == "kopf"})
    kopf: dict[str, Any] = {
        # kopf carries the NodeMaintenances alone (the maintenance controller); a pod or node
        # watch of kopf's would be a second copy of the hot path.
        "watches_in_full_operator": sum(
            w["watches"] for w in fresh["watches"] if w["client"] == "kopf"
        ),
        "resources": kopf_views,
        "import_mb": raw.get("kopf_import_mb"),
    }
    full = (idle, raw["after_watching"], fresh)
    most = max(p["most_watches_per_resource_and_selector"] for p in full)
    return {
        "rss_idle_mb": idle["vmrss_mb"],
        "rss_after_mb": after,
        "rss_after_peak_mb": fresh["vmhwm_mb"],
        "process_resident_memory_mb": {
            k: raw[k]["process_resident_memory_mb"]
            for k in ("idle", "after_watching", "after_fresh_start")
        },
        "per_pod_kb": round((after - idle["vmrss_mb"]) * 1024 / raw["pods"], 2)
        if raw["pods"]
        else None,
        "most_watches_per_resource_and_selector": most,
        "views_with_several_watches": fresh["views_with_several_watches"],
        "no_controllers_vmrss_mb": raw["no_hot_path_controllers"]["vmrss_mb"],
        "kopf": kopf,
        "met": {
            "rss": after <= TARGETS["rss_mb_max"],
            "one_watch_per_resource_and_selector": 0
            < most
            <= TARGETS["watches_per_resource_and_selector_max"],
            "kopf_watches_only_nodemaintenances": set(kopf_views) <= KOPF_VIEWS,
        },
    }


async def main_async(
    layout: Layout, spec: ClusterSpec, args: argparse.Namespace, out: dict[str, Any]
) -> None:
    api = await api_client(str(layout.admin_kubeconfig))
    try:
        await run(Bench(layout, spec, Rest(api), AuditTail(layout.logs / "audit.log")), args, out)
    finally:
        await api.close()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=500)
    p.add_argument("--pods", type=int, default=30_000)
    p.add_argument(
        "--webhook-pods", type=int, default=300, help="pods created through the webhooks"
    )
    p.add_argument("--concurrency", type=int, default=32, help="pod creates in flight")
    p.add_argument("--port-offset", type=int, default=13000)
    p.add_argument("--state", help="reuse (or make) the cluster here and leave it up")
    p.add_argument("--timeout", type=float, default=900.0, help="per wait, seconds")
    p.add_argument("--out", help="also write the JSON object to this file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    state = Path(args.state) if args.state else Path(tempfile.mkdtemp(prefix="pf-bench-mem-"))
    spec = ClusterSpec(nodes=args.nodes, port_offset=args.port_offset)
    result: dict[str, Any] = {
        "benchmark": "operator_memory",
        "inputs": {k: v for k, v in vars(args).items() if k not in ("out", "state")},
        "targets": TARGETS,
        "cpus": os.cpu_count(),
        "load_average_start": os.getloadavg(),
    }
    log(f"cluster with {args.nodes} nodes in {state}")
    try:
        layout = cluster.up(state, spec)
        raw = result["raw"] = {}
        asyncio.run(main_async(layout, spec, args, raw))
        result["summary"] = summary(raw)
    except Exception as e:  # a benchmark reports, it does not fail
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc(limit=6)
        result["operator_log_tail"] = supervisor.log_tail(Layout(state), OPERATOR, 20)
    finally:
        result["load_average_end"] = os.getloadavg()
        if not args.state:
            cluster.down(state)
            shutil.rmtree(state, ignore_errors=True)
    emit(result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
