"""One informer per (resource, namespace, selectors) per process, shared by every controller.

Two controllers that both read pods must not each keep a copy of every pod: at 30,000 pods
the copies are most of an operator's memory. Controllers ask the factory for the view they
need; asking twice for the same view returns the same informer, and `run` starts each once.
"""

from __future__ import annotations

import asyncio

from pilotfish.kube.informer import Informer
from pilotfish.kube.rest import Resource, Rest

Key = tuple[Resource, str | None, str | None, str | None]


class InformerFactory:
    def __init__(self, rest: Rest, resync_seconds: float | None = 300.0) -> None:
        """`resync_seconds`: how often every informer replays its store as SYNC events, so
        a controller re-derives everything even if it missed or mishandled an event."""
        self.rest = rest
        self.resync_seconds = resync_seconds
        self._informers: dict[Key, Informer] = {}

    def get(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Informer:
        key = (resource, namespace, label_selector, field_selector)
        if key not in self._informers:
            self._informers[key] = Informer(
                self.rest,
                resource,
                namespace=namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                resync_seconds=self.resync_seconds,
            )
        return self._informers[key]

    async def wait_synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self._informers.values()))

    async def run(self) -> None:
        """Run every informer requested so far (request all before calling this)."""
        await asyncio.gather(*(i.run() for i in self._informers.values()))
