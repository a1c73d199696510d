"""Production's side of prod_under_burst: its pods, created at a steady pace by their
owner, and what each one waited for, by the benchmark's clock and by the API server's.

Bind times come from the scheduler's `Scheduled` events (the server's clock, taken right
after the binding), so they do not depend on how late this busy process hears of a binding.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from benchmarks.common import latency_summary, wait_for
from benchmarks.extender_overhead import bench_pod
from benchmarks.probes.scheduling import ServerTimes
from pilotfish.kube.rest import PODS, ApiError, Rest


@dataclass
class Paced:
    """Wall-clock times (time.time()) per pod: request sent, create acknowledged."""

    sent: dict[str, float] = field(default_factory=dict)
    acked: dict[str, float] = field(default_factory=dict)


async def create_paced(
    rest: Rest, namespace: str, bodies: list[dict[str, Any]], interval: float
) -> Paced:
    """Create one pod every `interval` seconds, noting when each request went out and when
    the API server acknowledged it."""
    out = Paced()
    path = PODS.path(namespace)
    next_slot = time.monotonic()
    for body in bodies:
        delay = next_slot - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        next_slot += interval
        name = body["metadata"]["name"]
        out.sent[name] = time.time()
        for attempt in range(10):
            try:
                await rest.create(path, body)
                break
            except ApiError as e:
                if e.status in (429, 500, 503, 504) and attempt < 9:
                    await asyncio.sleep(0.1 * (attempt + 1))
                    continue
                raise
        out.acked[name] = time.time()
    return out


async def scheduled_times(rest: Rest, namespace: str) -> dict[str, float]:
    """When kube-scheduler bound each pod, from its `Scheduled` events (eventTime has
    microseconds and is taken right after the binding succeeded): the server's own clock,
    unaffected by how late this process's watch hears about it."""
    items, _ = await rest.list_pages(
        f"/apis/events.k8s.io/v1/namespaces/{namespace}/events",
        {"fieldSelector": "reason=Scheduled"},
    )
    out: dict[str, float] = {}
    for event in items:
        name = (event.get("regarding") or {}).get("name")
        when = event.get("eventTime")
        if name and when:
            out[name] = datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()
    return out


async def pending(rest: Rest, namespace: str) -> int:
    """Pods of the namespace not bound yet (a list from the API server's cache)."""
    items, _ = await rest.list_pages(PODS.path(namespace), {"fieldSelector": "spec.nodeName="})
    return len(items)


def latencies(start: dict[str, float], end: dict[str, float]) -> list[float]:
    return [end[name] - at for name, at in start.items() if name in end]


def production_pods(prefix: str, count: int, scheduler: str | None) -> list[dict[str, Any]]:
    return [
        bench_pod(
            f"{prefix}-{i}",
            band="production",
            scheduler=scheduler,
            workload=prefix,
            cpu="500m",
            memory="512Mi",
        )
        for i in range(count)
    ]


def production_figures(
    paced: Paced, scheduled: dict[str, float], seen: dict[str, float], server: ServerTimes
) -> dict[str, Any]:
    """created -> bound (the figure), its two halves, and the API server's view of the
    second half: create answered -> binding requested (watch, queue, scheduling cycle) and
    the binding request itself."""
    created = {n: server.created[n] for n in paced.sent if n in server.created}
    requested = {n: server.bind_received[n] for n in paced.sent if n in server.bind_received}
    return {
        "created_to_bound": latency_summary(latencies(paced.sent, scheduled)),
        # In creation order: whether the slow ones are the first (arriving into a backlog)
        # or spread over the phase.
        "created_to_bound_in_order_s": [round(v, 3) for v in latencies(paced.sent, scheduled)],
        "create_request_seconds": latency_summary(latencies(paced.sent, paced.acked)),
        "acked_to_bound": latency_summary(latencies(paced.acked, scheduled)),
        "bound_to_seen_by_watch": latency_summary(
            latencies({n: scheduled[n] for n in paced.sent if n in scheduled}, seen)
        ),
        "missing_scheduled_events": len(set(paced.sent) - set(scheduled)),
        "server_create_answered_to_bind_requested": latency_summary(latencies(created, requested)),
        "server_bind_request_seconds": latency_summary(latencies(requested, server.bind_done)),
    }


async def tenant(rest: Rest, namespace: str, user: str, may: list[tuple[str, str]]) -> Rest:
    """`user` with only `edit` in `namespace`, once the API server lets it create `may`
    ((group, resource) pairs); the admin's client impersonating it."""
    await rest.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "metadata": {"name": f"edit-{user}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )
    client = rest.impersonating(user)
    for group, resource in may:
        attrs = {"namespace": namespace, "verb": "create", "group": group, "resource": resource}

        async def allowed(attrs: dict[str, str] = attrs) -> bool:
            review = await client.create(
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                {"spec": {"resourceAttributes": attrs}},
            )
            return bool((review.get("status") or {}).get("allowed"))

        await wait_for(f"{user} to be allowed to create {resource} in {namespace}", allowed, 60)
    return client
