"""How long each node's lease has been silent, on this process's own monotonic clock.

A node's agent (the kubelet, or kwok playing it) renews a Lease in `kube-node-lease` every
few seconds. Whether a machine is gone is decided from when *this process* last saw a renewal
(the lease's `renewTime` or `resourceVersion` changed), never from `renewTime` against the
local wall clock: the node's clock and ours need not agree, and a paused or skewed clock
must not turn a live machine into a dead one. A node this process has never seen renew
counts from when it first saw the node's lease, so a restarted operator waits a full silence
period before it calls anything dead (it errs late, never early).

One tracker per process, built with the Runtime and shared by the node lifecycle controller
(unreachable, eviction, the zone brake) and the ServiceWorkload controller (the at-most-one
release waits for `silent_for(node) >= unreachable_after + margin`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from pilotfish.envseconds import seconds_from_env
from pilotfish.kube.factory import InformerFactory
from pilotfish.kube.informer import Obj
from pilotfish.kube.rest import LEASES
from pilotfish.timeutil import Clock

NODE_LEASE_NAMESPACE: Final = "kube-node-lease"

# Modes: Pilotfish detects silence and marks, taints and evicts itself (upstream's node
# lifecycle controller off, as on the local control plane); or upstream's controller runs
# (managed clusters) and Pilotfish owns only the at-most-one release and the brake's report.
MODE_PILOTFISH: Final = "pilotfish"
MODE_UPSTREAM: Final = "upstream"
MODES: Final = (MODE_PILOTFISH, MODE_UPSTREAM)


@dataclass(frozen=True)
class SilenceSettings:
    """The failure-detection timings (the design's numbers by default)."""

    # Silence after which a node is unreachable: Ready=Unknown, tainted, pods not ready.
    unreachable_after: float = 40.0
    # Further wait before a lost node's ordinary pods are evicted.
    eviction_wait: float = 60.0
    # Clock-drift margin an at-most-one release adds on top of `unreachable_after`.
    at_most_one_margin: float = 15.0
    mode: str = MODE_PILOTFISH

    @property
    def at_most_one_release_after(self) -> float:
        return self.unreachable_after + self.at_most_one_margin

    @classmethod
    def from_env(cls) -> SilenceSettings:
        """From PILOTFISH_NODE_UNREACHABLE_SECONDS, PILOTFISH_EVICTION_WAIT_SECONDS,
        PILOTFISH_AT_MOST_ONE_MARGIN_SECONDS and PILOTFISH_NODE_LIFECYCLE (pilotfish or
        upstream); unset ones keep the defaults. A bad value stops the process at start-up,
        naming the variable."""
        d = cls()
        mode = os.environ.get("PILOTFISH_NODE_LIFECYCLE") or d.mode
        if mode not in MODES:
            raise ValueError(f"PILOTFISH_NODE_LIFECYCLE={mode!r}: must be one of {MODES}")
        return cls(
            unreachable_after=seconds_from_env(
                "PILOTFISH_NODE_UNREACHABLE_SECONDS", d.unreachable_after
            ),
            eviction_wait=seconds_from_env("PILOTFISH_EVICTION_WAIT_SECONDS", d.eviction_wait),
            at_most_one_margin=seconds_from_env(
                "PILOTFISH_AT_MOST_ONE_MARGIN_SECONDS", d.at_most_one_margin
            ),
            mode=mode,
        )


def _renewal(lease: Obj) -> tuple[str, str]:
    spec = lease.get("spec") or {}
    return (str(spec.get("renewTime") or ""), str(lease["metadata"].get("resourceVersion", "")))


class NodeSilence:
    """Last renewal seen per node lease, in monotonic seconds of this process."""

    def __init__(self, clock: Clock, settings: SilenceSettings | None = None) -> None:
        self.clock = clock
        self.settings = settings or SilenceSettings()
        self._seen: dict[str, tuple[tuple[str, str], float]] = {}
        self._listeners: list[Callable[[str], None]] = []
        self._watching = False

    def watch(self, factory: InformerFactory) -> None:
        """Feed this tracker from the process's one kube-node-lease informer. Idempotent:
        every controller that needs silence calls it in its constructor."""
        if self._watching:
            return
        self._watching = True
        factory.informer(LEASES, namespace=NODE_LEASE_NAMESPACE).add_handler(self._on_lease)

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """Called with the node's name whenever its lease is seen renewed (or first seen)."""
        self._listeners.append(listener)

    def _on_lease(self, kind: str, lease: Obj, _old: Obj | None) -> None:
        name = str(lease["metadata"]["name"])
        if kind == "DELETED":
            self._seen.pop(name, None)
            return
        self.observe(name, _renewal(lease))

    def observe(self, node: str, renewal: tuple[str, str]) -> None:
        """Record `renewal` (renewTime, resourceVersion) of `node`'s lease as seen now, if it
        differs from the last one seen."""
        last = self._seen.get(node)
        if last is not None and last[0] == renewal:
            return
        self._seen[node] = (renewal, self.clock.monotonic())
        for listener in self._listeners:
            listener(node)

    def last_seen(self, node: str) -> float | None:
        """Monotonic time of the last renewal seen; None when this process never saw its lease."""
        entry = self._seen.get(node)
        return entry[1] if entry else None

    def silent_for(self, node: str) -> float | None:
        """Seconds since the last renewal seen; None when this process never saw its lease
        (a node without a lease is not judged: its agent never started)."""
        at = self.last_seen(node)
        return None if at is None else self.clock.monotonic() - at

    def nodes(self) -> list[str]:
        return list(self._seen)
