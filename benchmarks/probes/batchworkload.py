"""A BatchWorkload as a burst's source: submitted, watched until it creates pods, stopped.

The batch operator paces a job's pod creation to what the scheduler binds, so a burst
delivered this way is the one production really meets. If no operator serves
BatchWorkloads (the CRD without its controller, or a controller that never creates), the
benchmark must say so rather than measure an idle cluster as a "burst": `wait_started`
fails naming the job, what it saw and the deadline.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

from pilotfish import names
from pilotfish.devcluster.stages import ANNOTATION_RUN_SECONDS
from pilotfish.kube.rest import BATCHWORKLOADS, PODS, ApiError, Rest
from pilotfish.workloads import LABEL_BATCH

KIND: Final = "BatchWorkload"
API_VERSION: Final = "pilotfish.io/v1alpha1"
TEAM: Final = "bench"


class NotStarted(RuntimeError):
    """The BatchWorkload did not create the pods the measurement needs in time."""


def body(
    name: str,
    tasks: int,
    team: str,
    run_seconds: int,
    scheduler: str | None = None,
    creation_rate: float | None = None,
) -> dict[str, Any]:
    """`tasks` batch tasks of 1 CPU, all allowed at once: pacing alone decides how many
    reach the scheduler (and `creation_rate`, creates/s, when given). Each runs
    `run_seconds` on its kwok node, then succeeds. `scheduler`: the tasks' schedulerName
    (the cluster's default scheduler when None)."""
    spec: dict[str, Any] = {
        # What the mutating webhook sets from the band; the benchmark's namespaces skip it.
        "priorityClassName": names.PRIORITY_CLASS["batch"],
        "containers": [
            {
                "name": "task",
                "image": "example/bench:1",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    bw: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {
            "completions": tasks,
            "parallelism": tasks,
            "team": team,
            "band": "batch",
            "template": {
                "metadata": {
                    "labels": {"bench": "extender"},
                    "annotations": {ANNOTATION_RUN_SECONDS: str(run_seconds)},
                },
                "spec": spec,
            },
        },
    }
    if creation_rate is not None:
        bw["spec"]["creationRate"] = creation_rate
    return bw


async def submit(rest: Rest, namespace: str, bw: dict[str, Any]) -> None:
    try:
        await rest.create(BATCHWORKLOADS.path(namespace), bw)
    except ApiError as e:
        if e.not_found:
            raise NotStarted(
                f"{KIND} {API_VERSION} is not served (is the CRD installed?): {e}"
            ) from e
        raise


async def created(rest: Rest, namespace: str, name: str) -> int:
    """Task pods of the job that exist now (a list from the API server's cache)."""
    items, _ = await rest.list_pages(
        PODS.path(namespace), {"labelSelector": f"{LABEL_BATCH}={name}"}
    )
    return len(items)


async def status(rest: Rest, namespace: str, name: str) -> dict[str, Any]:
    bw = await rest.get(BATCHWORKLOADS.path(namespace, name))
    st = bw.get("status") or {}
    keep = ("active", "succeeded", "failed", "waiting", "pacing")
    return {k: st[k] for k in keep if k in st}


async def wait_started(
    rest: Rest, namespace: str, name: str, pods: int, first_within: float, all_within: float
) -> float:
    """Wait until the job has created `pods` pods; seconds it took. The first pod must come
    within `first_within` (an operator that serves the job starts at once), the rest within
    `all_within` (pacing creates at the bind rate)."""
    started = time.monotonic()
    deadline = started + first_within
    while (seen := await created(rest, namespace, name)) < pods:
        if seen > 0:
            deadline = max(deadline, started + all_within)
        if time.monotonic() > deadline:
            if seen == 0:
                raise NotStarted(
                    f"{KIND} {namespace}/{name} created no pods within {first_within:.0f}s: "
                    f"no batch operator serves it (operators/runner.py CONTROLLERS needs the "
                    f"batchworkload controller, and the operator must be running); "
                    f"status {await status(rest, namespace, name)}"
                )
            raise NotStarted(
                f"{KIND} {namespace}/{name} created {seen} of the {pods} pods needed within "
                f"{all_within:.0f}s; status {await status(rest, namespace, name)}"
            )
        await asyncio.sleep(0.5)
    return time.monotonic() - started


async def delete(rest: Rest, namespace: str, name: str) -> None:
    try:
        await rest.delete(BATCHWORKLOADS.path(namespace, name), {"propagationPolicy": "Background"})
    except ApiError as e:
        if not e.not_found:
            raise
