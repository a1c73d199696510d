"""A tenant's flood of raw pod creates, from worker processes (benchmarks/api_fairness.py).

In processes of their own so that the process timing the other team's writes has an idle event
loop: what it measures is the API server's answer, not its own backlog. Each worker holds a
connection per concurrent client and spreads its clients over the team's users.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from pilotfish.kube import credentials
from pilotfish.kube.rest import PODS, ApiError, Rest
from pilotfish.kube.transport import HttpTransport

HOLD_GATE = "bench.pilotfish.io/hold"  # not a Pilotfish gate: nothing ever releases it
FLOOD_LABEL = "bench.pilotfish.io/flood"
RETRIED = (429, 500, 503, 504)
MAX_THROTTLED = 100  # Retry-After waits for one pod before it counts as an error


def flood_plan(pods: int, procs: int, clients: int, users: list[str]) -> list[dict[str, Any]]:
    """Split the flood between worker processes: every pod index exactly once, `clients`
    concurrent requests in all, every user in some worker."""
    procs = max(1, min(procs, clients, pods))
    plan = []
    for w in range(procs):
        plan.append(
            {
                "indexes": list(range(w, pods, procs)),
                "concurrency": clients // procs + (1 if w < clients % procs else 0),
                "users": users[w::procs] or [users[w % len(users)]],
            }
        )
    return plan


def flood_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {FLOOD_LABEL: "true"}},
        "spec": {
            "schedulingGates": [{"name": HOLD_GATE}],
            "containers": [{"name": "task", "image": "example/task:1"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


@dataclass
class Tally:
    created: int = 0
    retries: int = 0
    throttled: int = 0  # 429s that said when to retry (Pilotfish's pace), waited out
    errors: int = 0
    first_error: str = ""


def retry_after(e: ApiError) -> float | None:
    """The seconds a 429 asks the client to wait (Retry-After: API Priority and Fairness
    and Pilotfish's pace both send it), which client-go waits out; None when it names
    none."""
    return e.retry_after if e.status == 429 else None


def flood_worker(
    kubeconfig: str,
    namespace: str,
    part: dict[str, Any],
    ready: Any,
    go: Any,
    results: Any,
) -> None:
    """One process of the flood: connect, say ready, wait for the start, create its pods
    (at `part["nice"]`, when set: see api_fairness's --flood-nice)."""
    if part.get("nice"):
        os.nice(int(part["nice"]))
    results.put(asyncio.run(_flood(kubeconfig, namespace, part, ready, go)))


async def _flood(
    kubeconfig: str, namespace: str, part: dict[str, Any], ready: Any, go: Any
) -> dict[str, Any]:
    api = HttpTransport(credentials.load(kubeconfig), pool=part["concurrency"] + 4)
    clients = [Rest(api).impersonating(u) for u in part["users"]]
    indexes: list[int] = list(part["indexes"])
    out = Tally()
    path = PODS.path(namespace)
    ready.put(os.getpid())
    await asyncio.get_running_loop().run_in_executor(None, go.wait)

    async def client(k: int) -> None:
        rest = clients[k % len(clients)]
        while indexes:
            body = flood_pod(f"a-{indexes.pop()}")
            failed = waited = 0
            while True:
                try:
                    await rest.create(path, body)
                    out.created += 1
                    break
                except ApiError as e:
                    wait = retry_after(e)
                    if wait is not None and waited < MAX_THROTTLED:  # as client-go does
                        waited += 1
                        out.throttled += 1
                        await asyncio.sleep(wait)
                        continue
                    failed += 1
                    if e.status in RETRIED and failed < 20:
                        out.retries += 1
                        await asyncio.sleep(0.05 * failed)
                        continue
                    out.errors += 1
                    out.first_error = out.first_error or str(e)
                    break

    try:
        await asyncio.gather(*(client(k) for k in range(part["concurrency"])))
    finally:
        await api.close()
    return dataclasses.asdict(out)
