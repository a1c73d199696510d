"""The webhooks' live view of GatePolicies: the shared informer feeding a `GateView`.

Reviews never call the API server: at thousands of pod creations a second a round trip per
pod would make admission as slow as the API server is busy. Instead one informer watches
GatePolicies in every namespace, and each review reads an immutable snapshot. Until the
first list has completed there is no snapshot at all (`snapshot()` is None), and the server
refuses pods rather than admit them ungated: a pod created without its gates can never get
them back.

The snapshot trails the API by the watch latency (normally well under a second): a pod
created in the same instant as the GatePolicy that should gate it may be admitted without
the gates. Create policies before the workloads they gate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Protocol

from pilotfish.kube.factory import InformerFactory
from pilotfish.kube.informer import Informer, Obj, object_key
from pilotfish.kube.rest import GATEPOLICIES
from pilotfish.webhooks.gateview import BrokenPolicy, GateView, PolicyEntry, parse_policy

log = logging.getLogger(__name__)

GATE_POLICIES: Final = GATEPOLICIES

Clock = Callable[[], datetime]


class ViewSource(Protocol):
    """Where reviews get their snapshot; None means "not synced yet, refuse"."""

    def snapshot(self) -> GateView | None: ...


@dataclass(frozen=True)
class StaticViews:
    """A fixed snapshot: for tests and tools that run the reviews without a cluster."""

    view: GateView

    def snapshot(self) -> GateView | None:
        return self.view


class GatePolicyCache:
    """GatePolicies of all namespaces, parsed once per change, served as snapshots."""

    def __init__(self, informer: Informer) -> None:
        self.informer = informer
        self._entries: dict[str, PolicyEntry | BrokenPolicy] = {}
        self._view: GateView | None = None
        informer.add_handler(self._on_event)

    @classmethod
    def watching(cls, factory: InformerFactory) -> GatePolicyCache:
        return cls(factory.informer(GATE_POLICIES))

    def synced(self) -> bool:
        return self.informer.synced.is_set()

    def snapshot(self) -> GateView | None:
        if not self.synced():
            return None
        if self._view is None:
            # Rebuilt lazily: a burst of policy changes costs one rebuild, at the next pod.
            self._view = GateView.build(self._entries.values())
        return self._view

    def _on_event(self, kind: str, obj: Obj, old: Obj | None) -> None:
        del old
        key = object_key(obj)
        if kind == "DELETED":
            self._entries.pop(key, None)
        else:
            entry = parse_policy(obj)
            if isinstance(entry, BrokenPolicy):
                log.warning(
                    "GatePolicy cannot be read; its namespace refuses pods until it is fixed",
                    extra={"policy": key, "error": entry.error},
                )
            self._entries[key] = entry
        self._view = None
