"""Machines that go silent, for the at-most-one tests: the real ServiceWorkload controller on
the shared fake API, with node leases in `kube-node-lease` that the test renews (or not) and
a kubelet per node that finishes graceful deletions only while its node is alive.

Pods have no finalizers here: a delete with grace 0 removes the pod at once (as the API
server does for a pod without finalizers), a graceful one leaves it Terminating until its
node's kubelet confirms, which a silent node never does. `live()` is the ground truth the
invariant is checked against: the copies that started and have not stopped (a pod deleted
from the API still runs until its node's kubelet sees that), and the pods that may yet start,
unless their node has really been silent for the whole release period.
"""

from __future__ import annotations

import asyncio
import copy
import random
from collections.abc import Callable
from typing import Any

from pilotfish import names
from pilotfish.kube.rest import LEASES, PODS
from pilotfish.kube.runtime import Runtime
from pilotfish.nodesilence import NODE_LEASE_NAMESPACE, SilenceSettings
from pilotfish.operators.serviceworkload import ServiceWorkloadController
from pilotfish.operators.serviceworkload.atmostone import lease_name
from pilotfish.timeutil import FakeClock, format_micro_time, format_time
from tests.fakeapi import Ref, _conflict
from tests.rollout_harness import KUBELET, SW, ControllerWorld, Lagging, workload

Obj = dict[str, Any]
NS = "ns"
SETTINGS = SilenceSettings()  # 40 s unreachable, 15 s margin: released at 55 s
RELEASE = SETTINGS.at_most_one_release_after
LEASE = LEASES.path(NS, lease_name("web"))

TERMINAL = ("Failed", "Succeeded")

World = ControllerWorld["Machines", ServiceWorkloadController]


class Crash(Exception):
    """The operator process dies here (kill -9): nothing after this point happens."""


class Machines(Lagging):
    def __init__(self, clock: FakeClock, nodes: int = 3) -> None:
        super().__init__()
        self.clock = clock
        self.silent: set[str] = set()
        # Copies actually running, by pod uid: (pod name, node). A copy outlives its pod in
        # the API until its node's kubelet sees it gone, or its node is silent for RELEASE.
        self.copies: dict[str, tuple[str, str]] = {}
        self.last_renewal: dict[str, float] = {}
        self.nodes = [f"n{i}" for i in range(1, nodes + 1)]
        for n in self.nodes:
            self.renew(n)

    # the machines ------------------------------------------------------------------------

    def renew(self, node: str) -> None:
        path = LEASES.path(NODE_LEASE_NAMESPACE, node)
        stamp = format_micro_time(self.clock.now())
        self.put(path, {"metadata": {"name": node}, "spec": {"renewTime": stamp}})
        self.last_renewal[node] = self.clock.monotonic()

    def tick(self, seconds: float) -> None:
        """Time passes; every node that is not silent renews its lease."""
        self.clock.advance(seconds)
        self._reap()
        for n in self.nodes:
            if n not in self.silent:
                self.renew(n)

    def silence(self, node: str) -> None:
        self.silent.add(node)

    def restore(self, node: str) -> None:
        self._reap()
        self.silent.discard(node)
        self.renew(node)

    def kubelets(self) -> None:
        """Each live node's kubelet: finishes graceful deletions, stops what the API no longer
        lists for it (or lists as terminal), runs what is bound to it."""
        listed = {p["metadata"]["uid"]: p for p in self.pods(live=False)}
        for uid, (_name, node) in list(self.copies.items()):
            pod = listed.get(uid)
            phase = ((pod or {}).get("status") or {}).get("phase")
            if node not in self.silent and (pod is None or phase in TERMINAL):
                del self.copies[uid]
        for uid, p in listed.items():
            node = p["spec"].get("nodeName")
            if node is None or node in self.silent:
                continue
            path = PODS.path(NS, p["metadata"]["name"])
            if p["metadata"].get("deletionTimestamp"):
                self.copies.pop(uid, None)
                self.remove(path)
            elif (p.get("status") or {}).get("phase") not in ("Running", *TERMINAL):
                self.edit(path, self._running)
                self.copies[uid] = (p["metadata"]["name"], node)

    def schedule(self, rng: random.Random | None = None) -> None:
        """kube-scheduler: every unbound pod onto a node that is not silent."""
        up = [n for n in self.nodes if n not in self.silent]
        for p in self.pods():
            if not p["spec"].get("nodeName") and up:
                node = rng.choice(up) if rng else up[0]
                self.edit(PODS.path(NS, p["metadata"]["name"]), _bind(node))
        self.kubelets()

    def _running(self, pod: Obj) -> None:
        pod["status"] = {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "lastTransitionTime": format_time(self.clock.now()),
                }
            ],
        }

    def fail(self, name: str) -> None:
        """The pod's containers exit: the kubelet reports it Failed."""
        self.edit(PODS.path(NS, name), lambda p: p.update(status={"phase": "Failed"}))
        for uid, (copy_name, _node) in list(self.copies.items()):
            if copy_name == name:
                del self.copies[uid]

    # the truth ---------------------------------------------------------------------------

    def _known_dead(self, node: str | None) -> bool:
        """The node has been silent for the whole release period: whatever ran there has
        stopped itself (the agent stops 30 s after the last renewal it sent)."""
        if node is None or node not in self.silent:
            return False
        return self.clock.monotonic() - self.last_renewal[node] >= RELEASE

    def _reap(self) -> None:
        for uid, (_name, node) in list(self.copies.items()):
            if self._known_dead(node):
                del self.copies[uid]

    def live(self) -> list[str]:
        """What may be running: the copies started and not stopped (whether or not the API
        still lists them), and the pods the API lists that may yet start."""
        self._reap()
        listed = {p["metadata"]["uid"]: p for p in self.pods(live=False)}
        out = [
            name
            for uid, (name, _node) in self.copies.items()
            if ((listed.get(uid) or {}).get("status") or {}).get("phase") not in TERMINAL
        ]
        for p in listed.values():
            if p["metadata"]["uid"] in self.copies:
                continue
            if (p.get("status") or {}).get("phase") in TERMINAL:
                continue
            if self._known_dead(p["spec"].get("nodeName")):
                continue
            out.append(p["metadata"]["name"])
        return out

    def epoch(self, pod: Obj) -> int:
        return int(pod["metadata"]["annotations"][names.ANNOTATION_EPOCH])

    def lease(self) -> Obj:
        found = self.obj(LEASE)
        assert found is not None
        return found

    # a kubelet's graceful termination ----------------------------------------------------

    def _delete(self, ref: Ref, coll: tuple[str, str], key: str, current: Obj, body: Obj) -> Obj:
        if ref.plural != "pods":
            return super()._delete(ref, coll, key, current, body)
        pre = body.get("preconditions") or {}
        if pre.get("uid") not in (None, current["metadata"]["uid"]):
            raise _conflict(f'pods "{ref.name}" (precondition)')
        if body.get("gracePeriodSeconds") == 0 or not current["spec"].get("nodeName"):
            current["metadata"].pop("finalizers", None)  # no kubelet to wait for: gone at once
            return super()._delete(ref, coll, key, current, body)
        if current["metadata"].get("deletionTimestamp"):
            return copy.deepcopy(current)
        new = copy.deepcopy(current)
        new["metadata"]["deletionTimestamp"] = format_time(self.clock.now())
        new["metadata"]["finalizers"] = [KUBELET]  # the fake keeps only what a finalizer holds
        return self._update(ref, coll, key, current, new)

    def crash_before(self, method: str, path_part: str) -> None:
        def die() -> None:
            raise Crash(f"{method} {path_part}")

        self.before(method, path_part, die)


def _bind(node: str) -> Callable[[Obj], None]:
    def bind(pod: Obj) -> None:
        pod["spec"]["nodeName"] = node

    return bind


def amo_workload(replicas: int = 1, **spec: Any) -> Obj:
    return workload(replicas, atMostOne=True, **spec)


async def start(api: Machines, seed: int = 7) -> World:
    """An operator process: its own runtime and silence tracker, informers listed first."""
    rt = Runtime.build(api, clock=api.clock, resync_seconds=None, silence=SETTINGS)
    ctrl = ServiceWorkloadController(rt, rng=random.Random(seed))
    informers = asyncio.create_task(rt.factory.run())
    await rt.factory.wait_synced()
    return World(api, api.clock, rt, ctrl, informers, "ns/web")


async def create(api: Machines, spec: Obj | None = None) -> World:
    api.put(SW, spec or amo_workload())
    return await start(api)
