"""The shared informer: a local, raw-dict view of one resource kept fresh by list + watch.

Paginated list, then watch with bookmarks from the list's resourceVersion; when the watch
ends it resumes from the last seen version, and on 410 Gone it relists and diffs the new
list against the store so handlers still see every add, change and delete exactly as
level changes. Server-side label and field selectors keep the view to what a controller
reads. `managedFields` are dropped on arrival: at 30,000 pods they are most of the memory.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

import aiohttp

from pilotfish import tasks
from pilotfish.kube.rest import ApiError, Resource, Rest
from pilotfish.timeutil import SYSTEM_CLOCK, Clock

log = logging.getLogger("pilotfish.informer")

Obj = dict[str, Any]
# (event type ADDED | MODIFIED | DELETED | SYNC, the object, the previous version or None)
Handler = Callable[[str, Obj, Obj | None], None]
# Called with the monotonic time a completed relist started.
RelistHandler = Callable[[float], None]

# How many of the latest events' (key, resourceVersion) an informer remembers for its
# controllers' own-write trackers (`ownwrites`): more than a write's round trip can see go
# by, even in a burst. Kept once per informer, not once per tracker: eleven controllers'
# copies of the pod view's were 9 MB of the operator.
RECENT_EVENTS: Final = 8192


def object_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


def slim(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    if meta:
        meta.pop("managedFields", None)
    return obj


class Informer:
    def __init__(
        self,
        rest: Rest,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Callable[[Obj], Obj] = slim,
        resync_seconds: float | None = None,
        watch_timeout_seconds: int = 300,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.rest = rest
        self.resource = resource
        self.namespace = namespace
        self.params: dict[str, str] = {}
        if label_selector:
            self.params["labelSelector"] = label_selector
        if field_selector:
            self.params["fieldSelector"] = field_selector
        self.transform = transform
        self.resync_seconds = resync_seconds
        self.watch_timeout_seconds = watch_timeout_seconds
        self.store: dict[str, Obj] = {}
        self.handlers: list[Handler] = []
        self.relist_handlers: list[RelistHandler] = []
        self.clock = clock
        self.synced = asyncio.Event()
        self.resource_version = ""
        self._recent: OrderedDict[tuple[str, str], None] = OrderedDict()

    def add_handler(self, handler: Handler) -> None:
        self.handlers.append(handler)

    def add_relist_handler(self, handler: RelistHandler) -> None:
        self.relist_handlers.append(handler)

    def get(self, key: str) -> Obj | None:
        return self.store.get(key)

    def saw(self, key: str, rv: str) -> bool:
        """Whether one of the latest events showed `key` at exactly `rv`."""
        return (key, rv) in self._recent

    def _remember(self, key: str, obj: Obj) -> None:
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self._recent[(key, str(rv))] = None
            if len(self._recent) > RECENT_EVENTS:
                self._recent.popitem(last=False)

    def _emit(self, kind: str, obj: Obj, old: Obj | None) -> None:
        for h in self.handlers:
            try:
                h(kind, obj, old)
            except Exception:
                log.exception("informer handler failed", extra={"resource": self.resource.plural})

    async def relist(self) -> None:
        """List everything and reconcile the store with it, emitting the differences."""
        started = self.clock.monotonic()
        path = self.resource.path(self.namespace)
        items, rv = await self.rest.list_pages(path, self.params, each=self.transform)
        fresh = {object_key(o): o for o in items}
        del items
        for key, obj in fresh.items():
            old = self.store.get(key)
            if old is None:
                self.store[key] = obj
                self._remember(key, obj)
                self._emit("ADDED", obj, None)
            elif old["metadata"].get("resourceVersion") != obj["metadata"].get("resourceVersion"):
                self.store[key] = obj
                self._remember(key, obj)
                self._emit("MODIFIED", obj, old)
        for key in [k for k in self.store if k not in fresh]:
            self._emit("DELETED", self.store.pop(key), None)
        self.resource_version = rv
        self.synced.set()
        for h in self.relist_handlers:
            h(started)

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        obj = event["object"]
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.resource_version = rv
        if kind == "BOOKMARK":
            return
        obj = self.transform(obj)
        key = object_key(obj)
        self._remember(key, obj)
        if kind == "DELETED":
            old = self.store.pop(key, None)
            self._emit("DELETED", obj, old)
            return
        old = self.store.get(key)
        self.store[key] = obj
        self._emit("ADDED" if old is None else "MODIFIED", obj, old)

    async def _resync_loop(self) -> None:
        assert self.resync_seconds
        while True:
            await asyncio.sleep(self.resync_seconds)
            for obj in list(self.store.values()):
                self._emit("SYNC", obj, obj)

    async def run(self) -> None:
        """Keep the view current, and replay it every `resync_seconds` if set."""
        if not self.resync_seconds:
            await self._list_and_watch()
            return
        await tasks.run_guarded(
            {
                f"{self.resource.plural} watch": self._list_and_watch(),
                f"{self.resource.plural} resync": self._resync_loop(),
            }
        )

    async def _list_and_watch(self) -> None:
        """List, then watch forever; relist on 410 Gone, back off on every other failure.

        Never ends but by cancellation: an API outage, a restart of the API server, an error
        answer or a bug in a transform only costs a backoff (and, after an unexpected error,
        a relist, as the store may be half-updated), so the view catches up within
        `BACKOFF_MAX` of the API's return.
        """
        failures = 0
        need_list = True
        while True:
            try:
                if need_list:
                    await self.relist()
                    need_list = False
                    failures = 0
                path = self.resource.path(self.namespace)
                started, events = self.clock.monotonic(), 0
                async for event in self.rest.watch(
                    path, self.resource_version, self.params, self.watch_timeout_seconds
                ):
                    self._apply(event)
                    events += 1
                    failures = 0
                if events or self.clock.monotonic() - started >= MIN_QUIET_WATCH:
                    continue  # the server's watch timeout: resume at once
                self._warn("watch ended at once", "no events")
            except ApiError as e:
                if e.gone:
                    need_list = True
                    continue
                self._warn("watch failed", str(e))
            except (OSError, TimeoutError, ValueError, aiohttp.ClientError) as e:
                self._warn("watch broke", f"{type(e).__name__}: {e}")
            except Exception:
                log.exception(
                    "informer failed; relisting", extra={"resource": self.resource.plural}
                )
                need_list = True
            await asyncio.sleep(backoff_delay(failures, random.random()))
            failures += 1

    def _warn(self, what: str, error: str) -> None:
        log.warning(what, extra={"resource": self.resource.plural, "error": error})


# Retry delays after a failure: exponential from BACKOFF_INITIAL, capped at BACKOFF_MAX, and
# jittered down to half so that informers that failed together do not retry together. The
# cap bounds how stale a view stays once the API is back (client-go's reflector caps at 30 s
# with up to double jitter, so its views may lag a minute behind a returning API).
BACKOFF_INITIAL = 0.2
BACKOFF_MAX = 4.0
# A watch that ends cleanly sooner than this without a single event is treated as a failure,
# so a server that closes watches at once is not asked again in a tight loop.
MIN_QUIET_WATCH = 1.0


def backoff_delay(failures: int, jitter: float) -> float:
    """Seconds to wait after `failures` earlier consecutive failures; `jitter` in [0, 1)."""
    base = min(BACKOFF_MAX, BACKOFF_INITIAL * 2 ** min(failures, 32))
    return float(base * (0.5 + jitter / 2))
