"""The cluster side of a node-failure recording (`nodefailure` reads it): a sampler of
nodes, node leases, pods and EndpointSlices every half second, and the label and cordon
writes a benchmark silences and places with. kwok plays a fake node's kubelet only while it
carries `pilotfish.io/fake-node=true`, so "silent" stops its lease renewals and pod updates
and "true" lets it return."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from benchmarks.common import log, sample_every, wait_for
from benchmarks.probes import nodefailure as nf
from pilotfish import names
from pilotfish.kube.rest import LEASES, NODES, PODS, Resource, Rest
from pilotfish.nodesilence import NODE_LEASE_NAMESPACE

ENDPOINTSLICES: Final = Resource("discovery.k8s.io", "v1", "endpointslices")
SAMPLE_EVERY: Final = 0.5
SILENT: Final = "silent"
MANAGED: Final = "true"


@dataclass
class Recorder:
    """Samples every node and node lease, and the pods and EndpointSlices of `namespaces`,
    every SAMPLE_EVERY seconds while `run` runs (a task of the benchmark's)."""

    rest: Rest
    namespaces: list[str]
    samples: list[nf.Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # failed samples: gaps in the record

    async def take(self) -> nf.Sample:
        at = time.time()
        nodes, _ = await self.rest.list_pages(NODES.path())
        leases, _ = await self.rest.list_pages(LEASES.path(NODE_LEASE_NAMESPACE))
        pods: list[dict[str, Any]] = []
        slices: list[dict[str, Any]] = []
        for ns in self.namespaces:
            pods += (await self.rest.list_pages(PODS.path(ns)))[0]
            slices += (await self.rest.list_pages(ENDPOINTSLICES.path(ns)))[0]
        return nf.sample(at, time.time(), nodes, leases, pods, slices)

    async def run(self) -> None:
        await sample_every(SAMPLE_EVERY, self.take, self.samples, self.errors)

    def latest(self) -> nf.Sample | None:
        return self.samples[-1] if self.samples else None

    async def until(self, what: str, holds: Callable[[nf.Sample], bool], within: float) -> bool:
        """Wait until the latest sample satisfies `holds`; False at the deadline."""
        try:
            await wait_for(what, lambda: _holds(self, holds), within)
        except TimeoutError as e:
            log(str(e))
            return False
        return True

    async def renewed(self, nodes: list[str], within: float = 60) -> None:
        """Each node's lease renewed since the recording began, so an operator up since
        before has seen a renewal: one it never saw renew is judged from when it first saw
        the lease (a restarted operator errs late), which would skew the figures."""
        start = self.samples[0].at if self.samples else time.time()

        def fresh(s: nf.Sample) -> bool:
            return all((s.nodes[n].renewed or 0) > start for n in nodes if n in s.nodes)

        if not await self.until("a lease renewal of each node to silence", fresh, within):
            raise TimeoutError(f"no lease renewal of {nodes} seen within {within:.0f}s")


async def _holds(rec: Recorder, holds: Callable[[nf.Sample], bool]) -> bool:
    s = rec.latest()
    return s is not None and holds(s)


async def _set_managed(rest: Rest, node: str, value: str) -> None:
    await rest.patch(
        NODES.path(name=node), {"metadata": {"labels": {names.LABEL_FAKE_NODE: value}}}
    )


async def silence(rest: Rest, node: str) -> None:
    """The node's agent stops: no more lease renewals, no more pod updates."""
    await _set_managed(rest, node, SILENT)


async def restore(rest: Rest, node: str) -> None:
    await _set_managed(rest, node, MANAGED)


async def cordon(rest: Rest, nodes: list[str], on: bool) -> None:
    """Mark nodes unschedulable (or not again), to place pods on the others."""
    for node in nodes:
        await rest.patch(NODES.path(name=node), {"spec": {"unschedulable": on or None}})
