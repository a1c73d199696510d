"""Where a pod's time goes between its create and its binding, from the components' own view.

kube-scheduler, the extender and the API server each export histograms and counters on
/metrics; read once before a phase and once after, the difference is that phase's alone.
Histogram figures are bucket upper bounds (`p99_le_s`: the p99 is at most this), so they
locate time rather than measure it exactly. CPU per process comes from /proc, so a phase
also shows who held the machine's cores while production waited.

Pure functions over text and numbers, plus `Probe`, which knows where the local cluster's
components listen and which process ids they run as.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import rounded
from pilotfish.devcluster import cluster, supervisor
from pilotfish.devcluster.cluster import ClusterSpec
from pilotfish.devcluster.components import Health, Layout

# One sample: its name (with _bucket/_sum/_count) and its labels, sorted.
Key = tuple[str, tuple[tuple[str, str], ...]]
Reading = dict[Key, float]

SCHEDULER: Final = "kube-scheduler"
APISERVER: Final = "kube-apiserver"
EXTENDER: Final = "pilotfish-extender"
# Whose CPU a phase reports: the control plane and Pilotfish's host processes.
PROCESSES: Final = (
    "kube-apiserver",
    "etcd",
    "kube-scheduler",
    "kube-controller-manager",
    "kwok",
    *cluster.HOST_PROCESSES,
)
_TICK: Final = os.sysconf("SC_CLK_TCK")
APF_LEVELS: Final = (
    "pilotfish-tenant-pods",
    "pilotfish-tenants",
    "pilotfish-batch",
    "pilotfish-production",
    "workload-high",
)


def reading(text: str) -> Reading:
    out: Reading = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def delta(before: Reading, after: Reading) -> Reading:
    """What happened between two readings (a restarted process would read negative; the
    phases are short enough that none is restarted)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def _matches(labels: tuple[tuple[str, str], ...], want: Mapping[str, str]) -> bool:
    have = dict(labels)
    return all(have.get(k) == v for k, v in want.items())


def total(d: Reading, name: str, **labels: str) -> float:
    """A counter (or gauge) summed over every series whose labels include `labels`."""
    return sum(v for (n, ls), v in d.items() if n == name and _matches(ls, labels))


def histogram(d: Reading, family: str, **labels: str) -> dict[str, float | int | str | None]:
    """count, mean and bucketed p50/p99 of a histogram, over the series matching `labels`;
    a quantile beyond the last finite bucket reads ">LAST"."""
    count = total(d, f"{family}_count", **labels)
    buckets: dict[float, float] = {}
    for (n, ls), v in d.items():
        if n == f"{family}_bucket" and _matches(ls, labels):
            le = float(dict(ls)["le"])
            buckets[le] = buckets.get(le, 0.0) + v
    ordered = sorted(buckets.items())

    finite = [le for le, _ in ordered if le != float("inf")]

    def upper(q: float) -> float | str | None:
        for le, n in ordered:
            if count and n >= q * count:
                return le if le != float("inf") else f">{finite[-1] if finite else 0}"
        return None

    return {
        "count": int(count),
        "mean_s": rounded(total(d, f"{family}_sum", **labels) / count) if count else None,
        "p50_le_s": upper(0.5),
        "p99_le_s": upper(0.99),
    }


def scheduler_figures(sched: Reading, extender: Reading, api: Reading) -> dict[str, Any]:
    """The scheduler's, extender's and API server's account of one phase (deltas)."""
    return {
        "pods_scheduled": int(
            total(sched, "scheduler_schedule_attempts_total", result="scheduled")
        ),
        "attempts_unschedulable": int(
            total(sched, "scheduler_schedule_attempts_total", result="unschedulable")
        ),
        # From the pod's entry into the scheduling queue to its binding: queue wait included.
        "queue_to_bound": histogram(sched, "scheduler_pod_scheduling_sli_duration_seconds"),
        # The scheduling cycle plus the binding cycle of one attempt.
        "attempt": histogram(sched, "scheduler_scheduling_attempt_duration_seconds"),
        # Filter and score, the extender's filter and prioritize calls included.
        "algorithm": histogram(sched, "scheduler_scheduling_algorithm_duration_seconds"),
        # The binding API call.
        "bind": histogram(
            sched, "scheduler_framework_extension_point_duration_seconds", extension_point="Bind"
        ),
        # Client-side throttling (clientConnection qps/burst) of its writes.
        "client_rate_limiter_wait": histogram(
            sched, "rest_client_rate_limiter_duration_seconds", verb="POST"
        ),
        "api_post_request": histogram(sched, "rest_client_request_duration_seconds", verb="POST"),
        "extender_filter_handler": histogram(
            extender, "pilotfish_extender_request_duration_seconds", verb="filter"
        ),
        "extender_prioritize_handler": histogram(
            extender, "pilotfish_extender_request_duration_seconds", verb="prioritize"
        ),
        # Time requests waited in API Priority and Fairness queues, by priority level:
        # the tenants' pod writes (production owners' and raw submitters' pods), their other
        # writes, the batch operator's, the scheduler's (bindings).
        "apf_wait": {
            level: histogram(
                api, "apiserver_flowcontrol_request_wait_duration_seconds", priority_level=level
            )
            for level in APF_LEVELS
        },
        # Watchers of pods the API server's watch cache closed because they fell behind.
        "apiserver_pod_watchers_terminated": int(
            total(api, "apiserver_terminated_watchers_total", resource="pods")
        ),
    }


def active_queue(text: str) -> int:
    for line in text.splitlines():
        if line.startswith("scheduler_pending_pods{") and 'queue="active"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def cpu_seconds(pid: int) -> float | None:
    """user + system CPU of one process so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


@dataclass
class Probe:
    """The local cluster's components: their /metrics (as the admin, who may read the
    scheduler's; the extender with the probe's certificate) and their process ids."""

    layout: Layout
    spec: ClusterSpec

    def _health(self, name: str) -> Health:
        p = self.spec.ports
        if name == EXTENDER:
            parts = cluster.host_processes(self.layout, p)
            return next(c for c in parts if c.name == name).health
        port = p.scheduler if name == SCHEDULER else p.apiserver
        pk = self.layout.pki
        return Health(
            f"https://127.0.0.1:{port}/healthz",
            client_cert=pk.cert("admin"),
            client_key=pk.key("admin"),
        )

    async def metrics(self) -> dict[str, Reading]:
        async def one(name: str) -> Reading:
            text = await asyncio.to_thread(supervisor.fetch, self._health(name), "/metrics")
            return reading(text)

        names = (SCHEDULER, EXTENDER, APISERVER)
        return dict(zip(names, await asyncio.gather(*(one(n) for n in names)), strict=True))

    async def active_queue(self) -> int:
        """Pods in the scheduler's active queue now (sampled often, so the page is scanned
        for the one line rather than parsed)."""
        text = await asyncio.to_thread(supervisor.fetch, self._health(SCHEDULER), "/metrics")
        return active_queue(text)

    def cpu(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name in PROCESSES:
            proc = supervisor.child(self.layout, name) or supervisor.running(self.layout, name)
            seconds = cpu_seconds(proc.pid) if proc is not None else None
            if seconds is not None:
                out[name] = seconds
        out["benchmark"] = cpu_seconds(os.getpid()) or 0.0
        return out


def figures(before: Mapping[str, Reading], after: Mapping[str, Reading]) -> dict[str, Any]:
    return scheduler_figures(
        delta(before[SCHEDULER], after[SCHEDULER]),
        delta(before[EXTENDER], after[EXTENDER]),
        delta(before[APISERVER], after[APISERVER]),
    )


def cpu_share(
    before: Mapping[str, float], after: Mapping[str, float], seconds: float
) -> dict[str, float]:
    """Per process, the share of one core it used over the phase (1.0 = a whole core)."""
    if seconds <= 0:
        return {}
    shares = {n: round((after[n] - before.get(n, 0.0)) / seconds, 3) for n in after}
    return dict(sorted(shares.items(), key=lambda kv: -kv[1]))


@dataclass
class ServerTimes:
    """Per pod, from the API server's audit log (its own clock, microseconds): when its
    create was answered, when the scheduler's binding request arrived and was answered."""

    created: dict[str, float] = field(default_factory=dict)
    bind_received: dict[str, float] = field(default_factory=dict)
    bind_done: dict[str, float] = field(default_factory=dict)


def _when(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def server_times(audit_log: Path, namespace: str) -> ServerTimes:
    """Pod creates and bindings of one namespace (the audit policy records both at Metadata).

    Between a create's answer and its binding request lie the watch that tells the
    scheduler about the pod, its queue and its scheduling cycle; the scheduler's own
    queue-to-bound histogram tells the last two apart from the first."""
    out = ServerTimes()
    for path in sorted(audit_log.parent.glob(f"{audit_log.stem}*{audit_log.suffix}")):
        with path.open() as f:
            for line in f:
                if f'"namespace":"{namespace}"' not in line or '"verb":"create"' not in line:
                    continue
                event = json.loads(line)
                ref = event.get("objectRef") or {}
                if ref.get("resource") != "pods" or event.get("stage") != "ResponseComplete":
                    continue
                name = str(ref.get("name"))
                if ref.get("subresource") == "binding":
                    out.bind_received[name] = _when(event["requestReceivedTimestamp"])
                    out.bind_done[name] = _when(event["stageTimestamp"])
                elif not ref.get("subresource"):
                    out.created[name] = _when(event["stageTimestamp"])
    return out


def load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


@dataclass
class Window:
    """One phase as the components saw it: metrics and CPU at its start, the deepest active
    queue sampled during it (once a second), the load average at both ends."""

    probe: Probe
    started: float = field(default_factory=time.monotonic)
    load_start: list[float] = field(default_factory=load)
    metrics: dict[str, Any] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    queue_max: int = 0
    sampler: asyncio.Task[None] | None = None

    async def open(self) -> Window:
        self.metrics, self.cpu = await self.probe.metrics(), self.probe.cpu()
        self.sampler = asyncio.create_task(self._sample())
        return self

    async def _sample(self) -> None:
        while True:
            with suppress(OSError):  # a missed sample; the next one counts
                self.queue_max = max(self.queue_max, await self.probe.active_queue())
            await asyncio.sleep(1)

    async def close(self) -> dict[str, Any]:
        if self.sampler is not None:
            self.sampler.cancel()
        seconds = time.monotonic() - self.started
        return {
            "seconds": round(seconds, 2),
            "load_average_start": self.load_start,
            "load_average_end": load(),
            "scheduler_active_queue_max": self.queue_max,
            "components": figures(self.metrics, await self.probe.metrics()),
            "cpu_cores_used": cpu_share(self.cpu, self.probe.cpu(), seconds),
        }
