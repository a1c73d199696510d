"""gate_release: how fast the gate controller releases gated pods, against the API server's own
ceiling (shared/PERFORMANCE.md).

One run, one local control plane (50 kwok nodes, ports +5000, state in a temp dir) with the
Pilotfish operator running as its ServiceAccount:

(a) raw: N pods holding one gate, each ungated by the strategic-merge `$patch: delete` patch
    carrying the resourceVersion read, from a bounded-concurrency asyncio client with the
    operator's own token (same identity, RBAC and admission policy as the controller's
    writes): the conditional patches per second this API server accepts. The pods carry no
    gated label, so the controller never sees them.
(b) release: N pods created with the gate contract the webhook writes (gate, label, record;
    condition GateSignal on one signal). Once the controller has seen every one of them
    (their State condition is written), the signal turns Ready; a watch timestamps each
    ungate. Release rate = N / (flip -> last ungate); ratio = release rate / raw rate.
    condition->ungated p99 over the burst is reported as measured (in a burst it includes
    the queueing behind N-1 other pods); so is the p99 of single flips (one pod, one signal,
    nothing else queued), the controller's reaction time.
(c) paced: a GatePolicy with pacing releasesPerSecond R in the namespace, pods released by
    one flip as in (b): the steady rate after the initial burst of floor(R) tokens, vs R.
    R defaults to half the unpaced rate of (b), at most 50/s: a rate above what the
    controller manages unpaced would measure its throughput again, not its pacing.

Prints ONE JSON object {benchmark, inputs, raw, ratios, targets, met} and exits 0 whether or
not the targets are met. `--pods 200` for a quick run while developing.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python benchmarks/gate_release.py` (make bench)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (
    bounded,
    create_namespace,
    delete_namespace,
    emit,
    load,
    log,
    percentile,
    rounded,
    wait_for,
)
from pilotfish import gates, names, timeutil
from pilotfish.devcluster.cluster import ClusterSpec, running_cluster
from pilotfish.devcluster.components import Layout
from pilotfish.kube.client import api_client
from pilotfish.kube.rest import (
    GATEPOLICIES,
    GATESIGNALS,
    PODS,
    STRATEGIC_MERGE_PATCH,
    ApiError,
    Rest,
)

GATE = "gates.pilotfish.io/bench-signal"
RAW_GATE = "gates.pilotfish.io/bench-raw"
GATE_SIGNALS = GATESIGNALS
GATE_POLICIES = GATEPOLICIES
# Pods here carry a hand-written gate contract; the webhooks would strip it (only they may
# write a record), so these namespaces opt out of them, as the chart allows.
NS_LABELS = {names.LABEL_WEBHOOKS: names.WEBHOOKS_DISABLED, names.LABEL_TEAM: "bench"}
TARGETS = {
    "release_ratio_min": 0.8,
    "condition_to_ungated_p99_s_max": 1.0,
    "paced_rel_error_max": 0.10,
}


def now_utc() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def pod_body(name: str, gate: str, *, signal: str | None, policy: str = "bench") -> dict[str, Any]:
    """A pod holding `gate`; with `signal`, also the label and record the webhook would write."""
    meta: dict[str, Any] = {"name": name, "labels": {"app": "bench"}}
    if signal is not None:
        created = now_utc()
        record = gates.GateRecord(
            policy=policy,
            generation=1,
            condition={"type": "GateSignal", "signalName": signal},
            timeout_seconds=3600,
            deadline=timeutil.format_time(created + datetime.timedelta(hours=1)),
        )
        meta["labels"][gates.LABEL_GATED] = "true"
        meta["annotations"] = {
            gates.ANNOTATION_CREATED: timeutil.format_time(created),
            gates.ANNOTATION_RECORD: gates.PodGates(
                timeutil.format_time(created), {gate: record}
            ).encode(),
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "schedulingGates": [{"name": gate}],
            "containers": [
                {
                    "name": "app",
                    "image": "example/batch:1",
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                }
            ],
        },
    }


async def gate_policy(
    admin: Rest, ns: str, name: str, signal_name: str, pacing: dict[str, Any] | None = None
) -> None:
    """The GatePolicy the pods' records name: the controller releases a gate only on the
    condition its policy declares, and holds one whose record no policy confirms. It selects
    nothing: the pods carry their contract already."""
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"bench.pilotfish.io/never": "true"}},
        "gates": [
            {
                "name": GATE,
                "condition": {"type": "GateSignal", "signalName": signal_name},
                "timeoutSeconds": 3600,
            }
        ],
    }
    if pacing:
        spec["pacing"] = pacing
    body = {
        "apiVersion": names.API_VERSION,
        "kind": "GatePolicy",
        "metadata": {"name": name},
        "spec": spec,
    }
    await admin.create(GATE_POLICIES.path(ns), body)


async def create_pods(rest: Rest, ns: str, bodies: list[dict[str, Any]], concurrency: int) -> None:
    async def one(body: dict[str, Any]) -> None:
        await rest.create(PODS.path(ns), body)

    await bounded(bodies, concurrency, one)


async def signal(rest: Rest, ns: str, name: str, ready: bool | None) -> None:
    """Create the GateSignal (ready None) or set its Ready condition."""
    if ready is None:
        await rest.create(
            GATE_SIGNALS.path(ns),
            {
                "apiVersion": names.API_VERSION,
                "kind": "GateSignal",
                "metadata": {"name": name},
                "spec": {"description": "gate_release benchmark"},
            },
        )
        return
    status = "True" if ready else "False"
    await rest.patch(
        GATE_SIGNALS.path(ns, name, "status"),
        {
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": status,
                        "reason": "Benchmark",
                        "message": "raised by the gate_release benchmark",
                        "lastTransitionTime": timeutil.format_time(now_utc()),
                    }
                ]
            }
        },
    )


def holds(pod: dict[str, Any], gate: str) -> bool:
    return gate in gates.scheduling_gates(pod)


def seen_by_controller(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == gates.POD_CONDITION
        for c in (pod.get("status") or {}).get("conditions") or []
    )


async def wait_all_seen(rest: Rest, ns: str, count: int, within: float) -> str:
    """Wait until the controller has written its State condition on all `count` pods (it has
    observed and decided about every one), so the flip measures release, not discovery.
    Returns the resourceVersion of the last list, where the timing watch starts."""
    rv = ""

    async def check() -> bool:
        nonlocal rv
        items, rv = await rest.list_pages(
            PODS.path(ns), {"labelSelector": f"{gates.LABEL_GATED}=true"}
        )
        return len(items) >= count and all(seen_by_controller(p) for p in items)

    await wait_for(f"the gate controller to see {count} pods in {ns}", check, within, interval=1.0)
    return rv


async def time_ungates(
    rest: Rest, ns: str, rv: str, gate: str, names_: set[str], within: float
) -> dict[str, float]:
    """Watch from `rv` and record the monotonic time at which each pod stops holding `gate`."""
    seen: dict[str, float] = {}

    async def watch() -> None:
        version = rv
        while len(seen) < len(names_):
            try:
                async for ev in rest.watch(
                    PODS.path(ns), version, {"labelSelector": f"{gates.LABEL_GATED}=true"}, 60
                ):
                    obj = ev["object"]
                    version = (obj.get("metadata") or {}).get("resourceVersion", version)
                    name = (obj.get("metadata") or {}).get("name")
                    if ev["type"] == "BOOKMARK" or name not in names_ or name in seen:
                        continue
                    if not holds(obj, gate):
                        seen[name] = time.monotonic()
                        if len(seen) == len(names_):
                            return
            except ApiError as e:
                if not e.gone:
                    raise
                items, version = await rest.list_pages(
                    PODS.path(ns), {"labelSelector": f"{gates.LABEL_GATED}=true"}
                )
                t = time.monotonic()
                for p in items:
                    n = p["metadata"]["name"]
                    if n in names_ and n not in seen and not holds(p, gate):
                        seen[n] = t

    await asyncio.wait_for(watch(), within)
    return seen


# --- (a) raw conditional-patch rate ---------------------------------------------------------


async def raw_rate(admin: Rest, op: Rest, pods: int, concurrency: int) -> dict[str, Any]:
    ns = "bench-raw"
    await create_namespace(admin, ns, NS_LABELS)
    log(f"(a) creating {pods} pods holding {RAW_GATE}")
    await create_pods(
        admin, ns, [pod_body(f"raw-{i}", RAW_GATE, signal=None) for i in range(pods)], concurrency
    )
    items, _ = await admin.list_pages(PODS.path(ns))
    versions = {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in items}
    conflicts = 0

    async def ungate(name: str) -> None:
        nonlocal conflicts
        patch = gates.remove_gate_patch(RAW_GATE)
        patch["metadata"] = {"resourceVersion": versions[name]}
        try:
            await op.patch(PODS.path(ns, name), patch, STRATEGIC_MERGE_PATCH)
        except ApiError as e:
            if not e.conflict:
                raise
            conflicts += 1

    log(f"(a) ungating {len(versions)} pods with conditional patches, concurrency {concurrency}")
    start = time.monotonic()
    await bounded(sorted(versions), concurrency, ungate)
    elapsed = time.monotonic() - start
    await delete_namespace(admin, ns)
    return {
        "pods": len(versions),
        "seconds": rounded(elapsed),
        "pods_per_second": rounded(len(versions) / elapsed, 2),
        "conflicts": conflicts,
    }


# --- (b) release after one signal flip -----------------------------------------------------


async def warm_up(admin: Rest, within: float) -> None:
    """One gated pod released end to end: the operator leads and its gate controller runs."""
    ns = "bench-warmup"
    await create_namespace(admin, ns, NS_LABELS)
    await gate_policy(admin, ns, "bench", "warm")
    await signal(admin, ns, "warm", None)
    await signal(admin, ns, "warm", True)
    await admin.create(PODS.path(ns), pod_body("warm", GATE, signal="warm"))

    async def released() -> bool:
        return not holds(await admin.get(PODS.path(ns, "warm")), GATE)

    await wait_for("the gate controller to release a warm-up pod", released, within)
    await delete_namespace(admin, ns)


async def burst(admin: Rest, ns: str, pods: int, concurrency: int, within: float) -> dict[str, Any]:
    """Create `pods` gated pods on one signal, flip it, time every ungate."""
    await signal(admin, ns, "go", None)
    names_ = {f"gated-{i}" for i in range(pods)}
    log(f"{ns}: creating {pods} gated pods")
    await create_pods(
        admin, ns, [pod_body(n, GATE, signal="go") for n in sorted(names_)], concurrency
    )
    rv = await wait_all_seen(admin, ns, pods, within)
    watcher = asyncio.create_task(time_ungates(admin, ns, rv, GATE, names_, within))
    await asyncio.sleep(0.5)  # let the watch connect before the flip (not a timing input)
    log(f"{ns}: signal go -> Ready")
    flip = time.monotonic()
    await signal(admin, ns, "go", True)
    seen = await watcher
    lat = sorted(t - flip for t in seen.values())
    return {"pods": pods, "flip": flip, "latencies": lat, "released": len(seen)}


async def single_flips(admin: Rest, probes: int, within: float) -> list[float]:
    """One pod per signal, flipped one at a time: the controller's reaction time, unqueued."""
    ns = "bench-latency"
    await create_namespace(admin, ns, NS_LABELS)
    for i in range(probes):
        await gate_policy(admin, ns, f"probe-{i}", f"s-{i}")
        await signal(admin, ns, f"s-{i}", None)
        body = pod_body(f"probe-{i}", GATE, signal=f"s-{i}", policy=f"probe-{i}")
        await admin.create(PODS.path(ns), body)
    rv = await wait_all_seen(admin, ns, probes, within)
    out: list[float] = []
    for i in range(probes):
        watcher = asyncio.create_task(time_ungates(admin, ns, rv, GATE, {f"probe-{i}"}, within))
        await asyncio.sleep(0.2)  # the watch connects before the flip (not a timing input)
        flip = time.monotonic()
        await signal(admin, ns, f"s-{i}", True)
        seen = await watcher
        out.append(seen[f"probe-{i}"] - flip)
        rv = (await admin.list_pages(PODS.path(ns), {"limit": 1}))[1]
    await delete_namespace(admin, ns)
    return out


async def release(admin: Rest, pods: int, concurrency: int, within: float) -> dict[str, Any]:
    ns = "bench-release"
    await create_namespace(admin, ns, NS_LABELS)
    await gate_policy(admin, ns, "bench", "go")
    b = await burst(admin, ns, pods, concurrency, within)
    lat = b["latencies"]
    span = lat[-1] if lat else None
    await delete_namespace(admin, ns)
    return {
        "pods": pods,
        "released": b["released"],
        "seconds_flip_to_last_ungate": rounded(span),
        "pods_per_second": rounded(pods / span, 2) if span else None,
        "burst_condition_to_ungated_p50_s": rounded(percentile(lat, 50)),
        "burst_condition_to_ungated_p99_s": rounded(percentile(lat, 99)),
    }


# --- (c) paced release ---------------------------------------------------------------------


async def paced(
    admin: Rest, rate: float, pods: int, concurrency: int, within: float
) -> dict[str, Any]:
    ns = "bench-paced"
    await create_namespace(admin, ns, NS_LABELS)
    await gate_policy(admin, ns, "bench", "go", {"releasesPerSecond": rate})
    b = await burst(admin, ns, pods, concurrency, within)
    lat: list[float] = b["latencies"]
    await delete_namespace(admin, ns)
    skip = max(1, int(rate))  # the bucket starts full: floor(R) releases at once
    # Tokens accrue from the moment the burst emptied the bucket (the last burst release) to
    # the last release; counting from there is exact even when a round releases its tokens
    # in a clump, where first-to-last of the clumps would overstate the rate.
    steady = None
    if len(lat) > skip + 1 and lat[-1] > lat[skip - 1]:
        steady = (len(lat) - skip) / (lat[-1] - lat[skip - 1])
    overall = len(lat) / lat[-1] if lat and lat[-1] > 0 else None
    return {
        "configured_per_second": rate,
        "pods": pods,
        "released": b["released"],
        "burst_skipped": skip,
        "steady_per_second": rounded(steady, 2),
        "overall_per_second": rounded(overall, 2),
    }


# --- the run -------------------------------------------------------------------------------


def auto_rate(release_per_second: float | None) -> float:
    """A pacing rate the controller can keep up with on this machine: half its unpaced rate,
    at most 50/s, at least 1/s. Above its own throughput, (c) would measure throughput."""
    if not release_per_second:
        return 10.0
    return float(max(1, min(50, math.floor(release_per_second / 2))))


async def measure(layout: Layout, args: argparse.Namespace) -> dict[str, Any]:
    admin_api = await api_client(str(layout.admin_kubeconfig))
    op_api = await api_client(str(layout.kubeconfig("operator")))
    admin, op = Rest(admin_api), Rest(op_api)
    try:
        log("warm-up: waiting for the gate controller to release one pod")
        await warm_up(admin, args.timeout)
        raw = await raw_rate(admin, op, args.pods, args.concurrency)
        log(f"(a) raw: {raw['pods_per_second']} pods/s")
        rel = await release(admin, args.pods, args.concurrency, args.timeout)
        log(f"(b) release: {rel['pods_per_second']} pods/s")
        probes = await single_flips(admin, args.latency_probes, args.timeout)
        log(f"(b) single flips: p99 {percentile(probes, 99)} s")
        rate = args.rate if args.rate > 0 else auto_rate(rel["pods_per_second"])
        pace = await paced(
            admin, rate, args.paced_pods or int(rate * 20), args.concurrency, args.timeout
        )
        log(f"(c) paced: {pace['steady_per_second']} pods/s for {rate} configured")
    finally:
        await admin_api.close()
        await op_api.close()
    rel["single_flip_condition_to_ungated_p50_s"] = rounded(percentile(probes, 50))
    rel["single_flip_condition_to_ungated_p99_s"] = rounded(percentile(probes, 99))
    ratio = (
        rel["pods_per_second"] / raw["pods_per_second"]
        if rel["pods_per_second"] and raw["pods_per_second"]
        else None
    )
    paced_error = abs(pace["steady_per_second"] / rate - 1) if pace["steady_per_second"] else None
    burst_p99 = rel["burst_condition_to_ungated_p99_s"]
    single_p99 = rel["single_flip_condition_to_ungated_p99_s"]
    return {
        "benchmark": "gate_release",
        "inputs": {
            "nodes": args.nodes,
            "pods": args.pods,
            "concurrency": args.concurrency,
            "latency_probes": args.latency_probes,
            "paced_rate": rate,
            "paced_rate_auto": args.rate <= 0,
            "paced_pods": pace["pods"],
        },
        "raw": {"raw_conditional_patch": raw, "release": rel, "paced": pace},
        "ratios": {
            "release_over_raw": rounded(ratio, 3),
            "paced_over_configured": rounded(
                pace["steady_per_second"] / rate if pace["steady_per_second"] else None, 3
            ),
        },
        "targets": TARGETS,
        "met": {
            "release_ratio": ratio is not None and ratio >= TARGETS["release_ratio_min"],
            "condition_to_ungated_p99_burst": burst_p99 is not None
            and burst_p99 <= TARGETS["condition_to_ungated_p99_s_max"],
            "condition_to_ungated_p99_single_flip": single_p99 is not None
            and single_p99 <= TARGETS["condition_to_ungated_p99_s_max"],
            "paced_rate": paced_error is not None and paced_error <= TARGETS["paced_rel_error_max"],
        },
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--pods", type=int, default=2000, help="gated pods in (a) and (b)")
    p.add_argument("--nodes", type=int, default=50)
    p.add_argument("--port-offset", type=int, default=5000)
    p.add_argument(
        "--concurrency", type=int, default=32, help="in-flight requests of the raw client"
    )
    p.add_argument("--latency-probes", type=int, default=30, help="single flips timed in (b)")
    p.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="pacing releasesPerSecond in (c); default: half the unpaced release rate of (b), "
        "at most 50, so (c) measures pacing and not the controller's throughput",
    )
    p.add_argument("--paced-pods", type=int, default=0, help="pods in (c) (default 20 x rate)")
    p.add_argument("--timeout", type=float, default=600.0, help="per wait, seconds")
    p.add_argument("--state", help="state directory (default: a new temporary one)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    state = (
        Path(args.state) if args.state else Path(tempfile.mkdtemp(prefix="pilotfish-bench-gates-"))
    )
    log(f"starting a local control plane with {args.nodes} nodes in {state}")
    load_start = load()
    try:
        with running_cluster(
            state, ClusterSpec(nodes=args.nodes, port_offset=args.port_offset)
        ) as layout:
            result = asyncio.run(measure(layout, args))
    except (TimeoutError, ApiError, RuntimeError, OSError) as e:
        # Still one JSON object and exit 0: a benchmark reports, it does not gate.
        result = {
            "benchmark": "gate_release",
            "inputs": vars(args),
            "raw": {"error": f"{type(e).__name__}: {e}"},
            "ratios": {},
            "targets": TARGETS,
            "met": {},
        }
    result["load_average"] = {"start": load_start, "end": load()}
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
