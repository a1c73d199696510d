"""What every benchmark shares: its own local control plane, percentiles, bounded fan-out.

A benchmark owns its cluster (a temporary state directory, ports shifted away from a
developer's `make demo` cluster and the e2e suites) so that its numbers are not disturbed by
leftovers, and prints exactly one JSON object on stdout: the harness (`make bench`) and the
issue notes read that object, everything else goes to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pilotfish import names
from pilotfish.devcluster import supervisor
from pilotfish.devcluster.cluster import ClusterSpec, running_cluster
from pilotfish.devcluster.components import Layout
from pilotfish.kube.rest import NAMESPACES, PODS, TEAMQUOTAS, ApiError, Rest

T = TypeVar("T")


def log(message: str) -> None:
    """Progress for the person watching; stdout is kept for the one JSON object."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), nearest-rank: a value that was actually observed."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def latency_summary(values: Sequence[float]) -> dict[str, float | int | None]:
    """Count, p50/p90/p99 (nearest-rank) and max of a window of latencies, in seconds."""
    return {
        "count": len(values),
        "p50_s": rounded(percentile(values, 50)),
        "p90_s": rounded(percentile(values, 90)),
        "p99_s": rounded(percentile(values, 99)),
        "max_s": rounded(max(values) if values else None),
    }


async def bounded(
    items: Iterable[T], concurrency: int, fn: Callable[[T], Awaitable[Any]]
) -> list[Any]:
    """Run `fn` over `items` with at most `concurrency` calls in flight; results in order."""
    sem = asyncio.Semaphore(concurrency)

    async def one(item: T) -> Any:
        async with sem:
            return await fn(item)

    return list(await asyncio.gather(*(one(i) for i in items)))


async def wait_for(
    what: str, check: Callable[[], Awaitable[bool]], within: float, interval: float = 0.5
) -> None:
    """Poll an async check until it holds; a benchmark that cannot set up says what failed."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(interval)
    raise TimeoutError(f"timed out after {within:.0f}s waiting for {what}")


async def sample_every(
    interval: float,
    take: Callable[[], Awaitable[T]],
    samples: list[T],
    errors: list[str],
) -> None:
    """`take` every `interval` seconds into `samples` until cancelled; a sample that fails
    (timeout, API error, connection) is a gap noted in `errors`, not the end of the record."""
    while True:
        started = time.monotonic()
        try:
            samples.append(await take())
        except (TimeoutError, ApiError, OSError) as e:
            errors.append(f"{type(e).__name__}: {e}")
        await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))


async def create_namespace(rest: Rest, name: str, labels: dict[str, str]) -> None:
    await rest.create(
        NAMESPACES.path(),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}},
    )


async def open_team(rest: Rest, team: str) -> None:
    """A TeamQuota granting `team` every band without limits (a team no TeamQuota grants
    runs nothing)."""
    body = {
        "apiVersion": names.API_VERSION,
        "kind": "TeamQuota",
        "metadata": {"name": team},
        "spec": {"team": team, "bands": {band: {} for band in names.BANDS}},
    }
    try:
        await rest.create(TEAMQUOTAS.path(), body)
    except ApiError as e:
        if e.status != 409:
            raise


async def until_pods_admitted(
    rest: Rest,
    namespace: str,
    what: str,
    refusals: tuple[int, ...],
    spec: dict[str, Any] | None = None,
) -> None:
    """Until a dry-run create of a probe pod (`spec` added to its spec) in `namespace` is
    admitted; an answer in `refusals` means not yet, any other error is raised."""
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe"},
        "spec": {"containers": [{"name": "c", "image": "example/probe:1"}], **(spec or {})},
    }

    async def admitted() -> bool:
        try:
            await rest.request("POST", PODS.path(namespace), body=probe, params={"dryRun": "All"})
        except ApiError as e:
            if e.status in refusals:
                return False
            raise
        return True

    await wait_for(what, admitted, within=60)


async def team_namespace(
    rest: Rest, namespace: str, team: str, labels: dict[str, str] | None = None
) -> None:
    """Namespace `namespace` of `team` (and `labels`), once admission admits pods there."""
    await create_namespace(rest, namespace, {names.LABEL_TEAM: team} | (labels or {}))
    # 403/500/503: the TeamQuota not seen yet; 404: no default ServiceAccount yet
    await until_pods_admitted(
        rest, namespace, f"admission of pods in {namespace}", (403, 404, 500, 503)
    )


async def wait_default_service_account(rest: Rest, namespace: str, within: float = 60) -> None:
    """Until `namespace` has its default ServiceAccount: the API server refuses pods before."""

    async def exists() -> bool:
        try:
            await rest.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
        except ApiError:
            return False
        return True

    await wait_for(f"the default ServiceAccount of {namespace}", exists, within)


async def delete_namespace(rest: Rest, name: str, within: float = 300) -> None:
    """Delete a namespace and wait until it is gone, so the next phase runs on a quiet cluster."""
    try:
        await rest.delete(NAMESPACES.path(name=name))
    except ApiError as e:
        if not e.not_found:
            raise

    async def gone() -> bool:
        try:
            await rest.get(NAMESPACES.path(name=name))
        except ApiError as e:
            if e.not_found:
                return True
            raise
        return False

    await wait_for(f"namespace {name} to be deleted", gone, within)


def emit(result: dict[str, Any]) -> None:
    """The one JSON object on stdout."""
    print(json.dumps(result, indent=2, sort_keys=False))


def load() -> list[float]:
    """The machine's load average (1, 5, 15 min), beside every figure."""
    return [round(v, 2) for v in os.getloadavg()]


async def quiet_machine(within: float = 300.0) -> float:
    """Wait until the 1-minute load average is at most 0.75 per core (at least 1.0): a phase
    that starts while the previous one's clean-up still loads the machine is measured on a
    different machine. Returns the seconds waited; after `within` it goes on regardless (the
    load at the phase's start is in its figures)."""
    limit = max(1.0, 0.75 * (os.cpu_count() or 1))
    started = time.monotonic()

    async def quiet() -> bool:
        return os.getloadavg()[0] <= limit

    with contextlib.suppress(TimeoutError):
        await wait_for("a quiet machine", quiet, within, 2.0)
    return round(time.monotonic() - started, 1)


def on_own_cluster(
    benchmark: str,
    spec: ClusterSpec,
    measure: Callable[[Layout], dict[str, Any]],
    *,
    inputs: dict[str, Any],
    state: str | None,
    operator: str = "pilotfish-operator",
) -> dict[str, Any]:
    """`measure` on a cluster of `spec` in `state` (default: a fresh temp dir, removed after),
    as one JSON object with the load average at both ends, whatever happens: a failure is that
    object with `error`, a traceback and the operator's last log lines."""
    where = Path(state) if state else Path(tempfile.mkdtemp(prefix=f"pf-bench-{benchmark}-"))
    load_start = load()
    out: dict[str, Any]
    try:
        log(f"starting a {spec.nodes}-node cluster in {where}")
        with running_cluster(where, spec) as layout:
            out = measure(layout)
    except Exception as exc:  # one JSON object whatever happens
        out = {"benchmark": benchmark, "inputs": inputs, "met": False}
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc(limit=6)
        out["operator_log_tail"] = supervisor.log_tail(Layout(where), operator, 20)
    finally:
        if not state:
            shutil.rmtree(where, ignore_errors=True)
    out["load_average"] = {"start": load_start, "end": load()}
    return out


def run_on_own_cluster(
    benchmark: str,
    spec: ClusterSpec,
    measure: Callable[[Layout], dict[str, Any]],
    *,
    inputs: dict[str, Any],
    state: str | None,
    out_path: str | None,
    operator: str = "pilotfish-operator",
) -> int:
    """`on_own_cluster`, printed (and written to `out_path`). Exits 0 either way."""
    out = on_own_cluster(benchmark, spec, measure, inputs=inputs, state=state, operator=operator)
    text = json.dumps(out, indent=2)
    if out_path:
        Path(out_path).write_text(text + "\n")
    print(text)
    return 0
