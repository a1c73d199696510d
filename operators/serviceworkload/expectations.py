"""Expectations: the controller's own writes, remembered until its informer shows them.

A watch lags. Deciding from a view that does not yet show what this controller just did
would double the action: create the surge twice, or drain a second available pod because
the first one's drain annotation has not arrived. client-go's controllers keep
"expectations" for exactly this; this is the same idea, keyed by object and resourceVersion
instead of counts, so it also covers patches:

- every successful write stores the object the API returned, together with the versions the
  informer may still show instead (`stale`: the version the write was decided from, plus
  any earlier ones of a chain of writes; ABSENT for a create);
- `view` returns our object while the informer still shows a stale version, and forgets it
  as soon as the informer shows any other version (ours or a later one) or the object's
  deletion; resourceVersions are compared for equality only, never ordered;
- a create is expected *before* it is sent, under the name the controller chose, so a
  create whose answer is lost (timeout, reset) still counts until the watch shows the pod
  or the entry expires (`ttl`, 5 minutes like client-go's ExpectationsTimeout). Counting a
  pod that may not exist only delays a create; not counting one that does could break the
  surge bound. A create still unseen after a while (`unseen_creates`) is checked with a GET:
  a relist after 410 Gone never reports an object created and deleted in between.

After a restart the cache is empty and the informers have listed everything before the first
decision, so the new process starts from what the API has (ARCHITECTURE section 3); the
leader lease (15 s) outlasts any request the old process still had in flight.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

Obj = dict[str, Any]
ABSENT: Final = ""  # the "version" of an object the informer does not have
DEFAULT_TTL: Final = 300.0


def resource_version(obj: Obj | None) -> str:
    if obj is None:
        return ABSENT
    return str((obj.get("metadata") or {}).get("resourceVersion") or ABSENT)


@dataclass
class _Entry:
    owner: str
    obj: Obj | None  # None: deleted by us and gone at once
    stale: frozenset[str]
    written: float
    expires: float


class WriteCache:
    def __init__(self, clock: Callable[[], float] = time.monotonic, ttl: float = DEFAULT_TTL):
        self.clock = clock
        self.ttl = ttl
        self._entries: dict[str, _Entry] = {}
        self._by_owner: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def _put(self, key: str, owner: str, obj: Obj | None, stale: set[str]) -> None:
        old = self._entries.get(key)
        if old is not None:
            stale |= old.stale
        now = self.clock()
        self._entries[key] = _Entry(owner, obj, frozenset(stale), now, now + self.ttl)
        self._by_owner.setdefault(owner, set()).add(key)

    def expect_create(self, key: str, owner: str, obj: Obj) -> None:
        """A create about to be sent: counted from now on, under its chosen name."""
        self._put(key, owner, obj, {ABSENT})

    def created(self, key: str, obj: Obj) -> None:
        """The create answered: keep the API's copy, unless the informer already reported
        the object deleted meanwhile (the entry is gone then, and stays gone)."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.obj = obj

    def wrote(self, key: str, owner: str, before: Obj | None, after: Obj | None) -> None:
        """A write decided from `before` succeeded and left the object as `after`."""
        self._put(key, owner, after, {resource_version(before)})

    def forget(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            keys = self._by_owner.get(entry.owner)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_owner[entry.owner]

    def forget_owner(self, owner: str) -> None:
        for key in list(self._by_owner.get(owner, ())):
            self.forget(key)

    def view(self, key: str, informed: Obj | None) -> Obj | None:
        """The freshest object we know of: ours while the informer is behind it."""
        entry = self._entries.get(key)
        if entry is None:
            return informed
        if entry.expires <= self.clock() or resource_version(informed) not in entry.stale:
            self.forget(key)
            return informed
        return entry.obj

    def keys(self, owner: str) -> Iterator[str]:
        yield from list(self._by_owner.get(owner, ()))

    def unseen_creates(self, owner: str, older_than: float) -> list[str]:
        """Creates expected for longer than `older_than` seconds and never seen: the watch
        may have missed them entirely (created and deleted across a relist), or the create
        never happened. The caller asks the API which, rather than wait for the TTL."""
        now = self.clock()
        return [
            k
            for k in self.keys(owner)
            if ABSENT in self._entries[k].stale and now - self._entries[k].written > older_than
        ]
