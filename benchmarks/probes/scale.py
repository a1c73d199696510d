"""The scale benchmark's readings and arithmetic: what one sample holds, what each process
cost, and how a figure grows from one cluster size to the next.

Pure (fed metrics text, /proc text and finished runs) except `processes`, which reads /proc
for the local cluster's recorded pids. Kept out of `benchmarks/*.py`, each of which
`make bench` runs as a benchmark.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from benchmarks.probes.scheduling import PROCESSES, Reading, cpu_seconds, total
from benchmarks.probes.watches import proc_memory
from pilotfish import names
from pilotfish.devcluster import supervisor
from pilotfish.devcluster.components import Layout

# The operator's resident memory at 30,000 pods (the design's figure for one process).
RSS_TARGET_MB: Final = 300.0
# A figure at the larger size over the figure at the smaller, divided by the size ratio:
# above 1 + this, the figure grew faster than the cluster did.
GROWTH_TOLERANCE: Final = 0.15
# Below these a figure is noise (a few ms of CPU, a queue of 0-1), not a growth to judge.
GROWTH_FLOOR: Final = 0.01


@dataclass
class Sample:
    """One reading during the run: seconds since the workloads were submitted, pods the
    operator created and the scheduler bound so far, the operator's resident memory and
    the keys waiting in each of its work queues."""

    t: float
    created: int
    bound: int
    operator_rss_mb: float | None
    queue_depth: dict[str, int] = field(default_factory=dict)


def pods_created(operator: Reading) -> int:
    """Pods the operator's controllers created: BatchWorkload tasks and ServiceWorkload
    replicas (their counters, so a sample costs one small /metrics page)."""
    return int(
        total(operator, "pilotfish_batch_pods_created_total", outcome="ok")
        + total(operator, "pilotfish_rollout_pod_actions_total", action="create", outcome="ok")
    )


def queue_depths(operator: Reading) -> dict[str, int]:
    """Keys waiting per controller queue (`pilotfish_operator_queue_depth`)."""
    out: dict[str, int] = {}
    for (name, labels), value in operator.items():
        if name == "pilotfish_operator_queue_depth":
            out[dict(labels).get("controller", "")] = int(value)
    return dict(sorted(out.items()))


def scheduled(scheduler: Reading) -> int:
    return int(total(scheduler, "scheduler_schedule_attempts_total", result="scheduled"))


def process_figures(stat_cpu: float | None, status_text: str | None) -> dict[str, float | None]:
    mem = proc_memory(status_text) if status_text else {}
    return {
        "cpu_seconds": None if stat_cpu is None else round(stat_cpu, 2),
        "rss_mb": mem.get("VmRSS"),
        "peak_rss_mb": mem.get("VmHWM"),
    }


def processes(layout: Layout) -> dict[str, dict[str, float | None]]:
    """CPU seconds so far and resident memory (now and peak) of every control-plane and
    Pilotfish process, from /proc of the pids their supervisor recorded (for Pilotfish's,
    the supervised child: the process doing the work)."""
    out: dict[str, dict[str, float | None]] = {}
    for name in PROCESSES:
        proc = supervisor.child(layout, name) or supervisor.running(layout, name)
        if proc is None:
            continue
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except OSError:
            status = None
        out[name] = process_figures(cpu_seconds(proc.pid), status)
    return out


def rss_mb(layout: Layout, name: str) -> float | None:
    """Resident memory of one process now (None: not running)."""
    proc = supervisor.child(layout, name) or supervisor.running(layout, name)
    try:
        text = Path(f"/proc/{proc.pid}/status").read_text() if proc else ""
    except OSError:
        return None
    return proc_memory(text).get("VmRSS")


def used(
    before: Mapping[str, Mapping[str, float | None]],
    after: Mapping[str, Mapping[str, float | None]],
) -> dict[str, dict[str, float | None]]:
    """Per process, CPU seconds spent between two readings and its peak resident memory."""
    out: dict[str, dict[str, float | None]] = {}
    for name, now in after.items():
        start, end = (before.get(name) or {}).get("cpu_seconds"), now.get("cpu_seconds")
        spent = None if start is None or end is None else round(end - start, 2)
        out[name] = {"cpu_seconds": spent, "peak_rss_mb": now.get("peak_rss_mb")}
    return out


def flat_figures(run: Mapping[str, Any]) -> dict[str, float]:
    """The numeric figures of one finished run that a sweep compares across sizes."""
    figures = run.get("figures") or {}
    out: dict[str, float] = {}
    for key, value in figures.items():
        if key.endswith("_per_second"):  # a rate growing is no cost growing
            continue
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = float(value)
    for name, proc in (run.get("processes") or {}).items():
        for key in ("cpu_seconds", "peak_rss_mb"):
            value = proc.get(key)
            if isinstance(value, int | float):
                out[f"{name}.{key}"] = float(value)
    return out


def growth(runs: Sequence[tuple[int, Mapping[str, float]]]) -> list[dict[str, Any]]:
    """For each pair of consecutive sizes (sorted) and each figure both have: the figure's
    ratio, the size ratio, and whether it grew faster than the size did."""
    ordered = sorted(runs, key=lambda r: r[0])
    out: list[dict[str, Any]] = []
    for (n1, a), (n2, b) in itertools.pairwise(ordered):
        size_ratio = n2 / n1
        for key in sorted(set(a) & set(b)):
            if a[key] < GROWTH_FLOOR or b[key] < GROWTH_FLOOR:
                continue
            ratio = b[key] / a[key]
            out.append(
                {
                    "figure": key,
                    "from_nodes": n1,
                    "to_nodes": n2,
                    "ratio": round(ratio, 3),
                    "size_ratio": round(size_ratio, 3),
                    "super_linear": ratio > size_ratio * (1 + GROWTH_TOLERANCE),
                }
            )
    return out


def series(samples: Sequence[Sample]) -> dict[str, Any]:
    """The samples as columns (what the plots read)."""
    controllers = sorted({c for s in samples for c in s.queue_depth})
    return {
        "t_s": [s.t for s in samples],
        "created": [s.created for s in samples],
        "bound": [s.bound for s in samples],
        "operator_rss_mb": [s.operator_rss_mb for s in samples],
        "queue_depth": {c: [s.queue_depth.get(c, 0) for s in samples] for c in controllers},
    }


def service(name: str, team: str, replicas: int) -> dict[str, Any]:
    """A production ServiceWorkload of `replicas` small pods (100m, 128Mi) for `team`."""
    container = {
        "name": "app",
        "image": "example/app:1",
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
    }
    return {
        "apiVersion": names.API_VERSION,
        "kind": "ServiceWorkload",
        "metadata": {"name": name},
        "spec": {
            "team": team,
            "replicas": replicas,
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [container], "terminationGracePeriodSeconds": 0},
            },
        },
    }


def split(total: int, per: int) -> list[int]:
    """`total` in parts of at most `per` (the last one smaller)."""
    return [min(per, total - i) for i in range(0, total, per)]
