"""One informer per (resource, namespace, selectors) per process, shared by every controller.

Two controllers that both read pods must not each keep a copy of every pod, nor each hold a
watch on the API server: at 30,000 pods the copies are most of an operator's memory and
every watch costs the API server a cacher. Controllers ask the factory for the view they
need while they are built; asking twice for the same view returns the same informer, and
`run` starts each once. One view has one projection (`pilotfish.kube.projections`): asking
for the same view with another is a bug, refused at start-up rather than found at 3 a.m.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pilotfish import metrics, tasks
from pilotfish.kube import projections
from pilotfish.kube.informer import Informer, Obj
from pilotfish.kube.rest import Resource, Rest
from pilotfish.timeutil import SYSTEM_CLOCK, Clock

Key = tuple[Resource, str | None, str | None, str | None]
Projection = Callable[[Obj], Obj]


class InformerFactory:
    def __init__(
        self, rest: Rest, clock: Clock = SYSTEM_CLOCK, resync_seconds: float | None = 300.0
    ) -> None:
        """`resync_seconds`: how often every informer replays its store as SYNC events, so
        a controller re-derives everything even if it missed or mishandled an event."""
        self.rest = rest
        self.clock = clock
        self.resync_seconds = resync_seconds
        self._informers: dict[Key, Informer] = {}
        self._started = False
        self._stopped = asyncio.Event()

    def informer(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        projection: Projection = projections.slim,
    ) -> Informer:
        key = (resource, namespace, label_selector, field_selector)
        inf = self._informers.get(key)
        if inf is not None:
            if inf.transform is not projection:
                raise ValueError(
                    f"{describe(key)}: requested with projection {projection.__qualname__}, "
                    f"already shared with {inf.transform.__qualname__}; one view, one projection"
                )
            return inf
        if self._started:
            raise RuntimeError(f"{describe(key)}: requested after the factory started")
        inf = Informer(
            self.rest,
            resource,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            transform=projection,
            resync_seconds=self.resync_seconds,
            clock=self.clock,
        )
        self._informers[key] = inf
        return inf

    @property
    def informers(self) -> dict[str, Informer]:
        return {describe(k): i for k, i in self._informers.items()}

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self._informers.values())

    async def wait_synced(self) -> None:
        """Until every informer has listed once. Raises if the factory stopped first (an
        informer task died): waiting on a view that will never sync is a silent hang."""
        waits = {asyncio.ensure_future(i.synced.wait()) for i in self._informers.values()}
        stopped = asyncio.ensure_future(self._stopped.wait())
        try:
            while waits and not stopped.done():
                _, waits = await asyncio.wait(
                    waits | {stopped}, return_when=asyncio.FIRST_COMPLETED
                )
                waits -= {stopped}
            if stopped.done():
                raise RuntimeError("informers stopped before they synced")
        finally:
            for w in (*waits, stopped):
                w.cancel()
            await asyncio.gather(*waits, stopped, return_exceptions=True)

    def _count(self) -> None:
        for key, inf in self._informers.items():
            metrics.INFORMER_OBJECTS.labels(key[0].plural, _selector(key)).set(len(inf.store))

    async def run(self) -> None:
        """Run every informer requested so far (all are requested before this), guarded:
        one that ends stops all, and the process."""
        self._started = True
        try:
            await tasks.run_guarded(
                {describe(k): i.run() for k, i in self._informers.items()}
                | {"informer-metrics": self._report()}
            )
        finally:
            self._stopped.set()

    async def _report(self) -> None:
        while True:
            self._count()
            await asyncio.sleep(15)


def _selector(key: Key) -> str:
    return ",".join(p for p in (key[2], key[3]) if p)


def describe(key: Key) -> str:
    resource, namespace = key[0], key[1]
    where = f" in {namespace}" if namespace else ""
    sel = _selector(key)
    return f"{resource.plural}{where}" + (f" [{sel}]" if sel else "")
