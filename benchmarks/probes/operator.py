"""An operator process under measurement: restarted under its supervisor with chosen
arguments, waited until synced (judged from the API server's side), then measured: resident
memory from /proc and its /metrics, watches from the audit log and the API server's metrics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from benchmarks.common import wait_for
from benchmarks.probes.watches import (
    AuditTail,
    Ledger,
    apiserver_watches,
    most_watches_per_key,
    proc_memory,
    samples,
    several_watches,
    watch_delta,
    watch_table,
)
from pilotfish.devcluster import cluster, components, supervisor
from pilotfish.devcluster.cluster import ClusterSpec
from pilotfish.devcluster.components import Component, Layout
from pilotfish.kube.rest import Rest

OPERATOR: Final = "pilotfish-operator"
QUIET_SECONDS: Final = 5.0
MB: Final = 1024 * 1024


@dataclass
class Bench:
    """One cluster's operator and the API server's view of it, for a whole run."""

    layout: Layout
    spec: ClusterSpec
    rest: Rest
    audit: AuditTail
    current: Started | None = None  # the operator process last started
    extra: tuple[str, ...] = ()  # the arguments it was started with beyond the installed ones

    def component(self, name: str) -> Component:
        parts = cluster.host_processes(self.layout, self.spec.ports)
        if name == "kube-apiserver":
            parts = components.control_plane(self.layout, self.spec.ports, Path("/"))
        return next(c for c in parts if c.name == name)

    async def fetch(self, name: str, path: str) -> str:
        return await asyncio.to_thread(supervisor.fetch, self.component(name).health, path)

    async def restart_operator(self, extra: tuple[str, ...]) -> Started:
        """Stop the operator, wait for its watches to close, start it with `extra` arguments."""
        supervisor.stop(self.layout, OPERATOR)
        # The one we started, else whichever ran before us (its watches: from the log's start).
        closing = self.current.ledger if self.current else Ledger(datetime.min.replace(tzinfo=UTC))

        async def closed() -> bool:
            for event in self.audit.events():
                closing.feed(event)
            return not closing.open

        await wait_for("the stopped operator's watches to close", closed, 60)
        before = apiserver_watches(await self.fetch("kube-apiserver", "/metrics"))
        since = datetime.now(UTC)
        c = self.component(OPERATOR)
        await asyncio.to_thread(
            supervisor.start, self.layout, dataclasses.replace(c, argv=c.argv + extra)
        )

        async def child() -> bool:  # the old child is gone: whichever runs is the new one
            return supervisor.child(self.layout, OPERATOR) is not None

        await wait_for("the operator's process", child, 60)
        pid = supervisor.child(self.layout, OPERATOR)
        assert pid is not None
        self.extra = extra
        self.current = Started(Ledger(since=since), pid.pid, before, time.monotonic())
        return self.current


@dataclass
class Started:
    """An operator process under measurement: its ledger, pid, and the API server's watch
    counts from just before it started."""

    ledger: Ledger
    pid: int
    before: dict[str, int]
    at: float


def proc_status(pid: int) -> dict[str, float]:
    try:
        return proc_memory(Path(f"/proc/{pid}/status").read_text())
    except FileNotFoundError:
        raise RuntimeError(
            f"the operator process {pid} exited while being measured (its supervisor restarts "
            "it, which would measure another process): see logs/pilotfish-operator.log"
        ) from None


async def rss_steady(pid: int) -> dict[str, float]:
    """Resident memory once three readings 2 s apart agree within 1 % (2 MB at least)."""
    readings: list[float] = []
    while True:
        mem = proc_status(pid)
        readings = [*readings[-2:], mem["VmRSS"]]
        if len(readings) == 3 and max(readings) - min(readings) <= max(2.0, 0.01 * readings[-1]):
            return mem
        await asyncio.sleep(2)


async def phase(
    b: Bench, extra: tuple[str, ...], pods: int, within: float, lists: bool = True
) -> dict[str, Any]:
    """Restart the operator with `extra` arguments, wait until it is synced, measure it."""
    return await measure_synced(b, await b.restart_operator(extra), pods, within, lists)


async def measure_synced(
    b: Bench, op: Started, pods: int, within: float, lists: bool = True
) -> dict[str, Any]:
    """Once `op` is synced (its views hold `pods` pods, if it says): memory and watches.
    `lists`: the process must have listed something (every operator with a controller does;
    kopf with no handlers may list nothing, and then it is synced once quiet for longer)."""
    ledger = op.ledger
    objects: dict[str, float] = {}

    async def synced() -> bool:
        for event in b.audit.events():
            ledger.feed(event)
        if (lists and not ledger.listed) or ledger.unwatched():
            return False
        quiet = QUIET_SECONDS if ledger.listed else QUIET_SECONDS * 4
        if ledger.quiet_for(datetime.now(UTC)) < quiet:
            return False
        page = await b.fetch(OPERATOR, "/metrics")
        objects.clear()
        for labels, value in samples(page, "pilotfish_informer_objects"):
            objects[f"{labels['resource']} [{labels.get('selector', '')}]"] = value
        views = [v for k, v in objects.items() if k.startswith("pods [")]
        return not views or max(views) >= pods

    await wait_for("the operator's informers to sync", synced, within, interval=2.0)
    mem = await rss_steady(op.pid)
    page = await b.fetch(OPERATOR, "/metrics")
    apiserver = await b.fetch("kube-apiserver", "/metrics")
    after = apiserver_watches(apiserver)
    for event in b.audit.events():
        ledger.feed(event)
    counts = ledger.watches()
    return {
        "seconds_since_start": round(time.monotonic() - op.at, 1),
        "vmrss_mb": mem["VmRSS"],
        "vmhwm_mb": mem["VmHWM"],
        "process_resident_memory_mb": round(
            max((v for _, v in samples(page, "process_resident_memory_bytes")), default=0) / MB, 1
        ),
        "informer_objects": objects,
        "watches": watch_table(counts),
        "views_with_several_watches": several_watches(counts),
        "most_watches_per_resource_and_selector": most_watches_per_key(counts),
        "apiserver_watch_delta": watch_delta(op.before, after),
        # Watchers the API server closed because they fell behind, since it started.
        "apiserver_terminated_watchers": {
            labels.get("resource", ""): int(v)
            for labels, v in samples(apiserver, "apiserver_terminated_watchers")
        },
    }
