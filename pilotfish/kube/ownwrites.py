"""The one cache of a controller's own writes: never decide from a view older than them.

A controller that wrote an object and then reads its informer before the watch delivered
the write decides from the past: it creates a pod twice, or removes a gate it removed
already. The EndpointSlice controller's rule, kept here for every controller: record the
resourceVersion each write returned, and treat the owner's view as stale until the informer
shows exactly that version (or, for a delete, the delete). resourceVersions are opaque:
compared for equality only, never ordered, never incremented.

Two ways out besides the event itself, so a lost event cannot block a controller forever:
a relist that began after the write (a list is at least as new as anything written before
it started) clears it, and a record older than `ttl` expires with a warning.

How long each write took to show (returned → seen in the informer, on this process's
monotonic clock) is the API server's watch delay as this process feels it: a histogram, and
`on_visible` for a controller that paces itself on it (`batchworkload.apidelay`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from pilotfish import metrics
from pilotfish.kube.informer import Informer, Obj, object_key
from pilotfish.timeutil import SYSTEM_CLOCK, Clock

log = logging.getLogger("pilotfish.ownwrites")


@dataclass
class _Write:
    rv: str | None  # None: a delete is expected
    owner: str
    at: float  # monotonic time the write returned


class OwnWrites:
    def __init__(
        self,
        name: str,
        clock: Clock = SYSTEM_CLOCK,
        *,
        ttl: float = 60.0,
        on_settled: Callable[[str], None] | None = None,
        on_visible: Callable[[float, float], None] | None = None,
    ) -> None:
        """`on_settled(owner)` runs when an owner's last pending write is seen: the
        controller re-enqueues the owner there. `on_visible(now, lag)` runs for each write
        seen in a watch event, with the seconds since it returned (0: seen before it
        returned)."""
        self.name = name
        self.clock = clock
        self.ttl = ttl
        self.on_settled = on_settled
        self.on_visible = on_visible
        self._visible_seconds = metrics.OWN_WRITES_VISIBLE.labels(name)
        self._writes: dict[str, _Write] = {}
        self._owners: dict[str, set[str]] = {}
        self._informers: list[Informer] = []

    def watch(self, informer: Informer) -> None:
        """Clear records from this informer's events and relists."""
        self._informers.append(informer)
        informer.add_handler(lambda kind, obj, _old: self.observe(kind, obj))
        informer.add_relist_handler(self.relisted)

    def wrote(self, key: str, returned: Obj | None, owner: str | None = None) -> None:
        """A create, update or patch of `key` returned `returned` (the server's object)."""
        rv = str(((returned or {}).get("metadata") or {}).get("resourceVersion") or "")
        if rv:
            self._record(key, rv, owner)

    def deleted(self, key: str, owner: str | None = None) -> None:
        self._record(key, None, owner)

    def _record(self, key: str, rv: str | None, owner: str | None) -> None:
        self._drop(key, notify=False)
        if self._visible(key, rv):
            self._saw(self.clock.monotonic(), 0.0)  # its event came before the answer did
            return
        w = _Write(rv, owner if owner is not None else key, self.clock.monotonic())
        self._writes[key] = w
        self._owners.setdefault(w.owner, set()).add(key)

    def _visible(self, key: str, rv: str | None) -> bool:
        # The informers' latest events, for writes whose answer comes back after their own
        # watch event and after a later one (a pod bound the moment it was created): the
        # store then shows neither "this version" nor "not yet".
        if rv is not None and any(i.saw(key, rv) for i in self._informers):
            return True
        if not self._informers:
            return False
        seen = [i.get(key) for i in self._informers]
        if rv is None:
            return all(o is None for o in seen)
        return any(str((o or {}).get("metadata", {}).get("resourceVersion")) == rv for o in seen)

    def observe(self, kind: str, obj: Obj) -> None:
        key = object_key(obj)
        w = self._writes.get(key)
        if w is None:
            return
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if kind == "DELETED" or (w.rv is not None and rv == w.rv):
            now = self.clock.monotonic()
            self._saw(now, now - w.at)
            self._drop(key)

    def _saw(self, now: float, lag: float) -> None:
        self._visible_seconds.observe(lag)
        if self.on_visible is not None:
            self.on_visible(now, lag)

    def relisted(self, started: float) -> None:
        """A relist that began at monotonic `started` completed: writes before it are in."""
        for key in [k for k, w in self._writes.items() if w.at < started]:
            self._drop(key)

    def _drop(self, key: str, *, notify: bool = True) -> None:
        w = self._writes.pop(key, None)
        if w is None:
            return
        keys = self._owners.get(w.owner)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._owners[w.owner]
                if notify and self.on_settled is not None:
                    self.on_settled(w.owner)

    def _expire(self, owner: str) -> None:
        now = self.clock.monotonic()
        for key in list(self._owners.get(owner, ())):
            w = self._writes[key]
            if now - w.at >= self.ttl:
                metrics.OWN_WRITES_EXPIRED.labels(self.name).inc()
                log.warning(
                    "own write never observed; trusting the cache again",
                    extra={"controller": self.name, "key": key, "rv": w.rv},
                )
                self._drop(key, notify=False)

    def settled(self, owner: str) -> bool:
        """True when every write made for `owner` is visible in the informers."""
        self._expire(owner)
        return owner not in self._owners

    def fresh(self, key: str) -> bool:
        """True when no write of `key` is waiting to be seen."""
        w = self._writes.get(key)
        if w is None:
            return True
        self._expire(w.owner)
        return key not in self._writes

    def pending(self) -> int:
        return len(self._writes)
