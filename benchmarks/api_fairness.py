"""api_fairness: one team's flood of pod creates against another team's steady writes.

The design's promise: "a runaway controller or a 100,000-task submission must not slow other
teams' writes". One local control plane (ports +14000 by default, state in a temp dir),
Pilotfish installed as `pilotfish dev up` installs it, with its FlowSchemas and its
admission webhooks (each team's pace of pod creates, `pilotfish.webhooks.createpace`, at the
defaults: 20 a second, burst 200). Two tenant teams, namespaces team-a and team-b (labelled
with their team, each granted every band by a TeamQuota), each bound to the built-in `edit`:
team A is `--flood-users` people (one flow each without Pilotfish's schemas, one per team
with them), team B one person.

Three phases, in this order, in the same run:
- `with_pilotfish`: as installed, FlowSchemas and pace;
- `flowschemas_only`: team A's namespace taken out of the webhooks
  (`pilotfish.io/webhooks: disabled`), so only the FlowSchemas govern its flood;
- `without_pilotfish`: Pilotfish's FlowSchemas and levels deleted too (the built-ins remain).
Each phase:
1. idle: team B writes ConfigMaps (create, then update, alternately) one every `--interval`
   seconds, `--idle-writes` of them;
2. flood: team A creates `--pods` raw pods as fast as it can from `--flood-clients`
   concurrent clients in `--flood-procs` processes (so this process's event loop, which
   times team B, stays idle) at niceness `--flood-nice` (19: on a cluster the flooding
   team's clients do not run on the API server's cores; here four busy Python clients
   would take most of two cores from the server, which no FlowSchema governs). A client
   answered 429 with a Retry-After waits it out, as client-go does. Team B keeps writing at
   the same pace until the last pod is in.
   The pods carry a scheduling gate of their own, so no scheduler or kubelet work blurs the
   API server's;
3. every pod and ConfigMap is deleted and the phase waits until they are gone.
Figure per phase: team B's write p99 during the flood / its idle p99 (target <= 1.5 with
Pilotfish). Each phase also names the FlowSchema the API server put team B's writes in
(X-Kubernetes-PF-FlowSchema-UID), and the load average at start and end is reported.

Prints one JSON object and exits 0 whether or not the target is met. `--pods 1000` for a
quick run on a small machine.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

if __package__ in (None, ""):  # run as `python benchmarks/api_fairness.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from benchmarks import apf_metrics
from benchmarks.common import (
    emit,
    latency_summary,
    load,
    log,
    open_team,
    quiet_machine,
    team_namespace,
    wait_for,
)
from benchmarks.pod_flood import FLOOD_LABEL, flood_plan, flood_worker
from benchmarks.probes.flowcontrol import (
    classification,
    remove_flow_control,
    tune_level,
    webhooks_off,
)
from benchmarks.probes.steady_writes import WRITES_LABEL, Writer
from pilotfish.devcluster.cluster import ClusterSpec, running_cluster
from pilotfish.kube.client import api_client
from pilotfish.kube.rest import PODS, ApiError, Rest
from pilotfish.webhooks import createpace

PORT_OFFSET = 14000
TARGET = 1.5
TEAMS = ("team-a", "team-b")
WATCHED_LEVELS = (
    "pilotfish-tenant-pods",
    "pilotfish-tenants",
    "global-default",
    "workload-low",
    "pilotfish-production",
)


# --- pure parts ----------------------------------------------------------------------------


def team_users(team: str, count: int) -> list[str]:
    return [f"{team}-user-{i}" for i in range(count)]


def ratio(flood_p99: float | None, idle_p99: float | None) -> float | None:
    """The figure; None when a phase measured nothing (it is reported, never guessed)."""
    if not flood_p99 or not idle_p99:
        return None
    return round(flood_p99 / idle_p99, 3)


def figures(raw: dict[str, Any]) -> dict[str, Any]:
    """Each phase's ratio, the target and the verdict (the one with Pilotfish)."""
    with_ = raw["with_pilotfish"]["ratio"]
    return {
        "ratios": {
            f"team_b_write_p99_flood_over_idle_{name}": part["ratio"] for name, part in raw.items()
        },
        "targets": {"team_b_write_p99_flood_over_idle_with_pilotfish": f"<= {TARGET}"},
        "met": with_ is not None and with_ <= TARGET,
    }


# --- the run ---------------------------------------------------------------------------------


async def setup(rest: Rest, flood_users: list[str], writer: str) -> None:
    for team in TEAMS:
        await open_team(rest, team)
        await team_namespace(rest, team, team)
        users = flood_users if team == "team-a" else [writer]
        await rest.create(
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{team}/rolebindings",
            {
                "metadata": {"name": "edit"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "edit",
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u}
                    for u in users
                ],
            },
        )

    async def may_write() -> bool:
        try:
            await rest.impersonating(writer).create(
                "/api/v1/namespaces/team-b/configmaps",
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe"}},
            )
        except ApiError as e:
            if e.status in (403, 404):
                return False
            raise
        return True

    await wait_for("team B's edit binding", may_write, within=60)


async def delete_collection(rest: Rest, path: str, label: str) -> None:
    """DELETE every object of `path` labelled `label`; the answer lists all 10,000 pods and
    once came back cut short: the deletion went on regardless, and `drain` asks again."""
    try:
        await rest.request(
            "DELETE", path, params={"labelSelector": f"{label}=true"}, request_timeout=600
        )
    except (aiohttp.ClientError, TimeoutError, ApiError) as exc:
        log(f"delete {path} ({label}): {type(exc).__name__}: {exc}; waiting, asking again")


async def drain(rest: Rest) -> None:
    """Delete every pod and ConfigMap of the phase; wait until they are gone."""
    collections = (
        ("/api/v1/namespaces/team-a/pods", FLOOD_LABEL),
        ("/api/v1/namespaces/team-b/configmaps", WRITES_LABEL),
    )
    for path, label in collections:
        await delete_collection(rest, path, label)
    asked = time.monotonic()

    async def gone() -> bool:
        nonlocal asked
        items, _ = await rest.list_pages(PODS.path("team-a"), {"limit": 1})
        if items and time.monotonic() - asked > 60:  # a DELETE cut short: once more
            await delete_collection(rest, *collections[0])
            asked = time.monotonic()
        return not items

    await wait_for("team A's pods to be deleted", gone, within=600, interval=1.0)


async def phase(rest: Rest, kubeconfig: str, args: argparse.Namespace, tag: str) -> dict[str, Any]:
    users = team_users("team-a", args.flood_users)
    writer_user = team_users("team-b", 1)[0]
    waited = await quiet_machine()
    load_start = load()
    seen = await classification(rest, writer_user, "team-b")
    log(f"{tag}: team B's writes are in {seen}")
    idle = Writer(rest.impersonating(writer_user), "team-b", f"idle-{tag}")
    await idle.steadily(args.interval, lambda: idle.written >= args.idle_writes)

    ctx = mp.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    plan = flood_plan(args.pods, args.flood_procs, args.flood_clients, users)
    for part in plan:
        part["nice"] = args.flood_nice
    procs = [
        ctx.Process(target=flood_worker, args=(kubeconfig, "team-a", part, ready, go, results))
        for part in plan
    ]
    for p in procs:
        p.start()
    loop = asyncio.get_running_loop()
    for _ in procs:
        await loop.run_in_executor(None, ready.get, True, 120)
    log(f"{tag}: flood of {args.pods} pods from {args.flood_clients} clients; team B writes")
    flooding = Writer(rest.impersonating(writer_user), "team-b", f"flood-{tag}")
    apf_before = await apf_metrics.scrape(rest, WATCHED_LEVELS)
    started = time.monotonic()
    go.set()
    done = asyncio.Event()
    writes = asyncio.create_task(flooding.steadily(args.interval, done.is_set))
    within = max(600.0, args.pods / 5)  # a worker that died would otherwise hang the run
    parts = [await loop.run_in_executor(None, results.get, True, within) for _ in procs]
    flood_seconds = time.monotonic() - started
    done.set()
    await writes
    apf = apf_metrics.delta(apf_before, await apf_metrics.scrape(rest, WATCHED_LEVELS))
    for p in procs:
        p.join(timeout=30)
    load_end = load()
    log(f"{tag}: flood done in {flood_seconds:.1f}s; deleting")
    await drain(rest)
    created = sum(p["created"] for p in parts)
    idle_p99 = latency_summary(idle.latencies)["p99_s"]
    flood_p99 = latency_summary(flooding.latencies)["p99_s"]
    return {
        "team_b_classified_as": seen,
        "quiet_wait_seconds": round(waited, 1),
        "load_average": {"start": load_start, "end": load_end},
        "team_b_idle_writes": latency_summary(idle.latencies)
        | {"slowest": idle.slowest()}
        | {"retries_429_5xx": idle.retries, "errors": idle.errors},
        "team_b_writes_during_flood": latency_summary(flooding.latencies)
        | {"slowest": flooding.slowest()}
        | {"retries_429_5xx": flooding.retries, "errors": flooding.errors},
        "apf_during_flood_by_level": apf,
        "team_a_flood": {
            "pods_requested": args.pods,
            "pods_created": created,
            "seconds": round(flood_seconds, 2),
            "creates_per_second": round(created / flood_seconds, 1) if flood_seconds else None,
            "retries_429_5xx": sum(p["retries"] for p in parts),
            "waited_retry_after": sum(p["throttled"] for p in parts),
            "errors": sum(p["errors"] for p in parts),
            "first_error": next((p["first_error"] for p in parts if p["first_error"]), None),
        },
        "ratio": ratio(
            float(flood_p99) if flood_p99 is not None else None,
            float(idle_p99) if idle_p99 is not None else None,
        ),
    }


async def measure(kubeconfig: str, args: argparse.Namespace, out: dict[str, Any]) -> None:
    """Each phase's figures into `out` as it ends, so a later phase's failure keeps them."""
    api = await api_client(kubeconfig)
    rest = Rest(api)  # the admin: exempt, for setup and clean-up only
    writer = team_users("team-b", 1)[0]
    try:
        await setup(rest, team_users("team-a", args.flood_users), writer)
        tuned = {
            "tenants_level": await tune_level(
                rest, "pilotfish-tenants", args.tenants_shares, args.tenants_borrowing
            ),
            "tenant_pods_level": await tune_level(rest, "pilotfish-tenant-pods", args.pod_shares),
        }
        out["with_pilotfish"] = await phase(rest, kubeconfig, args, "with") | tuned
        await webhooks_off(rest, "team-a")
        out["flowschemas_only"] = await phase(rest, kubeconfig, args, "flowschemas")
        await remove_flow_control(rest)

        async def tenants_schema_gone() -> bool:
            return (await classification(rest, writer, "team-b"))[
                "flowschema"
            ] != "pilotfish-tenants"

        await wait_for("the API server to drop Pilotfish's FlowSchemas", tenants_schema_gone, 60)
        out["without_pilotfish"] = await phase(rest, kubeconfig, args, "without")
    finally:
        await api.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--pods", type=int, default=10_000, help="team A's raw pod creates")
    p.add_argument("--flood-clients", type=int, default=64, help="team A's concurrent requests")
    p.add_argument("--flood-procs", type=int, default=4, help="processes team A's clients use")
    p.add_argument("--flood-users", type=int, default=16, help="team A's distinct users")
    p.add_argument(
        "--flood-nice",
        type=int,
        default=19,
        help="niceness of the flood's processes: on a cluster a team's clients run on machines "
        "of their own, not on the API server's cores; sharing them here, at 19 they take only "
        "the CPU the control plane leaves (0: they compete with it)",
    )
    p.add_argument("--interval", type=float, default=0.05, help="seconds between team B writes")
    p.add_argument(
        "--idle-writes",
        type=int,
        default=2000,
        help="team B's writes while idle (2000: 100 s, near the paced flood's length, so both "
        "p99s see the same background: the API server's compactions, leases, resyncs)",
    )
    p.add_argument(
        "--pace",
        type=float,
        help=f"each team's pod creates per second in the webhooks (sets {createpace.RATE_ENV} "
        f"for the cluster's processes; default the webhooks' own, "
        f"{createpace.DEFAULT_PER_SECOND:g})",
    )
    p.add_argument("--tenants-shares", type=int, help="override the tenants level's shares")
    p.add_argument("--tenants-borrowing", type=int, help="override its borrowingLimitPercent")
    p.add_argument("--pod-shares", type=int, help="override the tenant pods level's shares")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--port-offset", type=int, default=PORT_OFFSET)
    p.add_argument("--state", help="state directory (default: a fresh temp dir, removed after)")
    args = p.parse_args(argv)
    if args.pace is not None:  # the local webhooks inherit this process's environment
        os.environ[createpace.RATE_ENV] = str(args.pace)
    pace = createpace.PaceSettings.from_env()
    state = Path(args.state) if args.state else Path(tempfile.mkdtemp(prefix="pilotfish-apf-"))
    spec = ClusterSpec(nodes=args.nodes, port_offset=args.port_offset)
    inputs = {k: v for k, v in vars(args).items() if k != "state"} | {
        "machine_cpus": os.cpu_count(),
        "team_pod_creates": {"per_second": pace.per_second, "burst": pace.burst},
    }
    load_start = load()
    result: dict[str, Any] = {"benchmark": "api_fairness", "inputs": inputs}
    try:
        log(f"starting a {args.nodes}-node cluster in {state}")
        raw: dict[str, Any] = {}
        result["raw"] = raw
        with running_cluster(state, spec) as layout:
            asyncio.run(measure(str(layout.admin_kubeconfig), args, raw))
        result |= figures(raw)
    except Exception as exc:  # one JSON object whatever happens
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if not args.state:
            shutil.rmtree(state, ignore_errors=True)
    result["load_average"] = {"start": load_start, "end": load()}
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
