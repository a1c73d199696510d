"""Team B of benchmarks/api_fairness.py: one tenant's steady ConfigMap writes, timed in the
measuring process, and the slowest of a window of them with the time they were sent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks.pod_flood import RETRIED
from pilotfish.kube.rest import ApiError, Rest

WRITES_LABEL = "bench.pilotfish.io/writes"


def slowest_of(latencies: list[float], sent_at: list[float], count: int = 10) -> list[list[float]]:
    """The `count` slowest writes as [UTC seconds sent, seconds taken], slowest first: when
    the tail came, to line up with the components' logs (a compaction, a relist)."""
    worst = sorted(zip(latencies, sent_at, strict=True), reverse=True)[:count]
    return [[round(at, 3), round(took, 4)] for took, at in worst]


@dataclass
class Writer:
    rest: Rest
    namespace: str
    prefix: str
    latencies: list[float] = field(default_factory=list)
    sent_at: list[float] = field(default_factory=list)  # wall clock, to line up with logs
    retries: int = 0
    errors: int = 0
    written: int = 0

    async def write(self) -> None:
        """One write: create a ConfigMap, or update the last one created (alternately)."""
        i = self.written
        path = f"/api/v1/namespaces/{self.namespace}/configmaps"
        name = f"{self.prefix}-{i // 2}"
        sent_at, started = time.time(), time.monotonic()
        for attempt in range(20):
            try:
                if i % 2 == 0:
                    meta = {"name": name, "labels": {WRITES_LABEL: "true"}}
                    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}
                    await self.rest.create(path, body | {"data": {"v": "0"}})
                else:
                    await self.rest.patch(f"{path}/{name}", {"data": {"v": str(i)}})
                break
            except ApiError as e:
                if e.status in RETRIED and attempt < 19:
                    self.retries += 1
                    await asyncio.sleep(0.05 * (attempt + 1))
                    continue
                self.errors += 1
                break
        self.latencies.append(time.monotonic() - started)
        self.sent_at.append(sent_at)
        self.written += 1

    async def steadily(self, interval: float, until: Callable[[], bool]) -> None:
        """One write every `interval` seconds (on a fixed schedule, not after each answer)."""
        next_slot = time.monotonic()
        while not until():
            await self.write()
            next_slot += interval
            delay = next_slot - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

    def slowest(self) -> list[list[float]]:
        return slowest_of(self.latencies, self.sent_at)
