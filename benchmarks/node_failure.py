"""node_failure: a machine that stops renewing its lease, and a zone-sized silence.

PERFORMANCE.md: one node with 30 pods of 3 services (10 each) stops its lease; time to
not-ready (configured 40 s: within 2 s), to its endpoints removed, to replacements bound
(<= 40 + 60 + 5 s); the same against upstream's defaults on the same cluster (50 s + 300 s);
then 60 % of the nodes silent at once: 0 evictions, 0 endpoints removed.

One local cluster (`--nodes` kwok nodes in three zones, ports +`--port-offset`), every figure
read from a recording sampled every 0.5 s (`benchmarks.probes.nodefailure`: node Ready,
taints and lease renewal; pods; EndpointSlice endpoints), in seconds from the silent node's
last lease renewal. The 30 pods are put on the victim by cordoning every other node while
they are created; the others are uncordoned before the victim goes silent, so the
replacements have somewhere to go.

1. pilotfish: the cluster's default mode (upstream's node lifecycle and taint eviction
   controllers off), Pilotfish's timings from PILOTFISH_NODE_UNREACHABLE_SECONDS and
   PILOTFISH_EVICTION_WAIT_SECONDS (this process's environment, which the cluster's host
   processes inherit: shorten them for a smoke run only, and keep the first well above
   kwok's lease renewal interval, ~10 s, or live nodes look silent between renewals).
2. brake: `--brake-fraction` of the nodes (round-robin over the zones, so every zone loses
   some) silent at once, pods of 3 services spread over every node; evictions, pods made
   not ready and endpoints removed among the silent nodes' pods over `--brake-window` s of
   silence and the heal after it (the nodes return together; a brake that lifts as the
   first of them renews would evict the pods of those a moment behind).
3. upstream: the same cluster switched to upstream mode (`switch_node_lifecycle`:
   kube-controller-manager with both controllers at their defaults), two victims at once in
   two zones: one in a tenant namespace, whose pods Pilotfish's webhook gives the eviction
   wait as NoExecute toleration ("upstream_with_pilotfish_webhook"), and one in a namespace
   that opts out of Pilotfish's webhooks, whose pods keep the API server's 300 s
   ("upstream_defaults"); recorded for up to `--upstream-window` s.

Prints one JSON object (also written to `--out`) and exits 0 whether or not the targets
are met; `--skip-upstream` leaves phase 3 out (it waits out upstream's 5 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

if __package__ in (None, ""):  # run as `python benchmarks/node_failure.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (
    create_namespace,
    delete_namespace,
    load,
    log,
    run_on_own_cluster,
    wait_default_service_account,
)
from benchmarks.probes import nodefailure as nf
from benchmarks.probes.lostnodes import Recorder, cordon, restore, silence
from pilotfish import names
from pilotfish.devcluster import cluster
from pilotfish.devcluster import nodes as fleet
from pilotfish.devcluster.cluster import ClusterSpec
from pilotfish.devcluster.components import Layout
from pilotfish.kube.client import api_client
from pilotfish.kube.rest import (
    SERVICEWORKLOADS,
    TEAMQUOTAS,
    Rest,
)
from pilotfish.nodesilence import SilenceSettings

PORT_OFFSET: Final = 12000
TEAM: Final = "bench-nf"
OPT_OUT: Final = {names.LABEL_WEBHOOKS: names.WEBHOOKS_DISABLED}
UPSTREAM_GRACE: Final = 50.0  # kube-controller-manager's --node-monitor-grace-period default
UPSTREAM_TOLERATION: Final = 300.0  # DefaultTolerationSeconds
RETURN_WITHIN: Final = 120.0
HEALED: Final = 5.0  # recorded on after a return: what the return sets off shows then


def workload(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "ServiceWorkload",
        "metadata": {"name": name},
        "spec": {
            "team": TEAM,
            "replicas": replicas,
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
                },
            },
            "service": {"ports": [{"name": "http", "port": 80}]},
        },
    }


async def namespace(rest: Rest, name: str, opt_out: bool) -> None:
    labels = {names.LABEL_TEAM: TEAM, **(OPT_OUT if opt_out else {})}
    await create_namespace(rest, name, labels)

    await wait_default_service_account(rest, name)


@dataclass
class Bench:
    rest: Rest
    layout: Layout
    spec: ClusterSpec
    args: argparse.Namespace
    nodes: list[str]  # fleet order: round-robin over the zones

    def services(self, ns: str) -> dict[str, int]:
        return {f"{ns}/svc-{i}": self.args.replicas for i in range(self.args.services)}

    def names(self) -> list[str]:
        return [f"svc-{i}" for i in range(self.args.services)]

    async def fill(self, rec: Recorder, ns: str, only: str | None) -> None:
        """The namespace's services at full ready count; with `only`, every pod on that node."""
        others = [n for n in self.nodes if n != only] if only else []
        await cordon(self.rest, others, True)
        try:
            for name in self.names():
                await self.rest.create(
                    SERVICEWORKLOADS.path(ns), workload(name, self.args.replicas)
                )
            wanted = nf.full_ready(self.services(ns))
            if not await rec.until(f"{ns} at full ready count", wanted, 300):
                raise TimeoutError(f"the services of {ns} never reached full ready count")
        finally:
            await cordon(self.rest, others, False)

    async def lone(
        self, victims: dict[str, str], opt_out: set[str], window: float
    ) -> dict[str, Any]:
        """victims: namespace -> node; each node gets that namespace's 30 pods, then all go
        silent together; recorded until replaced or `window` s."""
        rec = Recorder(self.rest, list(victims))
        runner = asyncio.create_task(rec.run())
        load_start = load()
        try:
            for ns, node in victims.items():
                await namespace(self.rest, ns, ns in opt_out)
                await self.fill(rec, ns, node)
            await rec.renewed(list(victims.values()))
            since = time.time()
            for node in victims.values():
                await silence(self.rest, node)
            log(f"silenced {', '.join(victims.values())}")

            def over(s: nf.Sample) -> bool:
                return all(
                    nf.replaced(self.services(ns), [node])(s)
                    and nf.full_ready(self.services(ns))(s)
                    for ns, node in victims.items()
                )

            await rec.until("replacements at full ready count", over, window)
            restored = time.time()
            for node in victims.values():
                await restore(self.rest, node)
            back = [nf.returned(n) for n in victims.values()]
            await rec.until("the victims back", lambda s: all(b(s) for b in back), RETURN_WITHIN)
        finally:
            runner.cancel()
        out: dict[str, Any] = {"load_average": {"start": load_start, "end": load()}}
        before = [s for s in rec.samples if s.done <= since][-1]
        for ns, node in victims.items():
            pods = {p for p in nf.pods_on(before, [node]) if p.startswith(f"{ns}/")}
            wanted = self.services(ns)
            out[ns] = nf.timeline(rec.samples, node, pods, wanted, wanted, since, restored)
        out["recorder_errors"] = rec.errors[:5]
        for ns in victims:
            await delete_namespace(self.rest, ns)
        return out

    async def brake(self) -> dict[str, Any]:
        ns = "nf-brake"
        silent = nf.brake_choice(self.nodes, self.args.brake_fraction)
        rec = Recorder(self.rest, [ns])
        runner = asyncio.create_task(rec.run())
        load_start = load()
        try:
            await namespace(self.rest, ns, False)
            await self.fill(rec, ns, None)
            await rec.renewed(silent)
            since = time.time()
            for node in silent:
                await silence(self.rest, node)
            log(f"silenced {len(silent)} of {len(self.nodes)} nodes for {self.args.brake_window}s")
            await asyncio.sleep(self.args.brake_window)  # the measurement window itself
            restored = time.time()
            for node in silent:
                await restore(self.rest, node)
            back = [nf.returned(n) for n in silent]
            await rec.until(
                "the brake's nodes back", lambda s: all(b(s) for b in back), RETURN_WITHIN
            )
            await asyncio.sleep(HEALED)  # the healed zone recorded too
        finally:
            runner.cancel()
        events = await self.rest.get("/api/v1/events", fieldSelector="reason=ZoneBrake")
        out = nf.brake_figures(rec.samples, silent, since, restored)
        out["zone_brake_events"] = len(events.get("items") or [])
        out["load_average"] = {"start": load_start, "end": load()}
        out["recorder_errors"] = rec.errors[:5]
        await delete_namespace(self.rest, ns)
        return out


async def setup(rest: Rest) -> None:
    quota = {
        "apiVersion": names.API_VERSION,
        "kind": "TeamQuota",
        "metadata": {"name": TEAM},
        "spec": {"team": TEAM, "bands": {band: {} for band in names.BANDS}},
    }
    await rest.create(TEAMQUOTAS.path(), quota)


async def measure(layout: Layout, spec: ClusterSpec, args: argparse.Namespace) -> dict[str, Any]:
    settings = SilenceSettings.from_env()
    u, e = settings.unreachable_after, settings.eviction_wait
    api = await api_client(str(layout.admin_kubeconfig))
    rest = Rest(api)
    nodes = [n["metadata"]["name"] for n in fleet.fleet(spec.nodes)]
    bench = Bench(rest, layout, spec, args, nodes)
    out: dict[str, Any] = {}

    async def phase(name: str, run: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        """A phase that fails is reported by name; the next one still runs."""
        log(f"phase {name}")
        try:
            out[name] = await run()
        except Exception as exc:
            out[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(3)}

    async def pilotfish_mode() -> dict[str, Any]:
        lone = await bench.lone({"nf-pilotfish": nodes[0]}, set(), u + e + 60)
        figures: dict[str, Any] = lone.pop("nf-pilotfish")
        return {**figures, "verdict": nf.lone_verdict(figures, u, e), "phase": lone}

    async def upstream_mode() -> dict[str, Any]:
        await asyncio.to_thread(cluster.switch_node_lifecycle, layout, spec.ports, "upstream")
        victims = {"nf-upstream": nodes[0], "nf-upstream-defaults": nodes[1 % len(nodes)]}
        up = await bench.lone(victims, {"nf-upstream-defaults"}, args.upstream_window)
        return {
            "with_pilotfish_webhook": up.pop("nf-upstream"),
            "defaults": up.pop("nf-upstream-defaults"),
            "phase": up,
        }

    try:
        await setup(rest)
        await phase("pilotfish", pilotfish_mode)
        await phase("zone_brake", bench.brake)
        if not args.skip_upstream:
            await phase("upstream", upstream_mode)
    finally:
        await api.close()
    return out


def result(
    args: argparse.Namespace, figures: dict[str, Any], settings: SilenceSettings
) -> dict[str, Any]:
    """The one JSON object: inputs, every phase's figures, targets and whether each is met."""
    u, e = settings.unreachable_after, settings.eviction_wait
    upstream_evicted = UPSTREAM_GRACE + UPSTREAM_TOLERATION
    met = {
        "pilotfish_lone_node": bool((figures.get("pilotfish") or {}).get("verdict", {}).get("met")),
        "zone_brake": bool((figures.get("zone_brake") or {}).get("met")),
    }
    return {
        "benchmark": "node_failure",
        "inputs": {
            "nodes": args.nodes,
            "services": args.services,
            "pods_per_service": args.replicas,
            "unreachable_after_s": settings.unreachable_after,
            "eviction_wait_s": settings.eviction_wait,
            "brake_fraction": args.brake_fraction,
            "brake_window_s": args.brake_window,
            "upstream": "skipped" if args.skip_upstream else f"window {args.upstream_window}s",
            "machine_cpus": os.cpu_count(),
        },
        **figures,
        "targets": {
            "not_ready_s": f"{u} +- {nf.WITHIN}",
            "replacements_bound_s": f"<= {nf.replaced_by(u, e)}",
            "zone_brake": "0 evictions, 0 endpoints removed",
            "upstream_reference_s": f"not ready ~{UPSTREAM_GRACE}, evicted ~{upstream_evicted}",
        },
        "met_by_figure": met,
        "met": all(met.values()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=12)
    p.add_argument("--services", type=int, default=3)
    p.add_argument("--replicas", type=int, default=10, help="pods per service")
    p.add_argument("--brake-fraction", type=float, default=0.6)
    p.add_argument("--brake-window", type=float, default=130.0, help="seconds silent (>= 120)")
    p.add_argument(
        "--upstream-window",
        type=float,
        default=UPSTREAM_GRACE + UPSTREAM_TOLERATION + 60,
        help="seconds the upstream phase records at most",
    )
    p.add_argument("--skip-upstream", action="store_true")
    p.add_argument("--port-offset", type=int, default=PORT_OFFSET)
    p.add_argument("--state", help="state directory (default: a fresh temp dir, removed after)")
    p.add_argument("--out", help="also write the JSON object to this file")
    args = p.parse_args(argv)
    settings = SilenceSettings.from_env()
    spec = ClusterSpec(nodes=args.nodes, port_offset=args.port_offset)

    def run(layout: Layout) -> dict[str, Any]:
        return result(args, asyncio.run(measure(layout, spec, args)), settings)

    inputs = {"nodes": args.nodes}
    return run_on_own_cluster(
        "node_failure", spec, run, inputs=inputs, state=args.state, out_path=args.out
    )


if __name__ == "__main__":
    sys.exit(main())
