"""Wiring: GatePolicy status from the shared informers, on the runtime's queue.

GatePolicies are written by people (hundreds, at human pace); the pods they count move at
the cluster's pace. Both are read from the process's shared informers, the same views the
gate controller decides from: one watch per kind in the process, and no finalizer or
annotation on a tenant's policy (a handler framework's timer would hold a finalizer on every
policy, so deleting a namespace would wait for the operator). A policy's change enqueues it
at once; a change of its pod count enqueues it `INTERVAL` seconds later, coalesced, so a
burst of pods costs one status write per interval, and none while nothing changed.
Every reconcile is observe -> decide -> apply.
"""

from __future__ import annotations

from typing import Final

from pilotfish.kube import projections
from pilotfish.kube.informer import Obj, object_key
from pilotfish.kube.rest import GATEPOLICIES, PODS
from pilotfish.kube.runtime import Runtime
from pilotfish.kube.workqueue import DONE, Result, WorkQueue
from pilotfish.operators.gatepolicy.apply import apply
from pilotfish.operators.gatepolicy.decide import decide
from pilotfish.operators.gatepolicy.model import GatedPods, PolicyKey, policy_view

CONTROLLER: Final = "gatepolicy"
# The most often a policy's pod count is written; how stale `gatedPods` may be.
INTERVAL: Final = 10.0
WORKERS: Final = 2


class GatePolicyStatusController:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.queue: WorkQueue[str] = WorkQueue(CONTROLLER, clock=rt.clock)
        self.gated = GatedPods(on_change=self._count_changed)
        self.pods = rt.factory.informer(PODS, projection=projections.pod)
        self.pods.add_handler(self.gated.observe)
        self.policies = rt.factory.informer(GATEPOLICIES)
        self.policies.add_handler(self._policy_changed)

    def _policy_changed(self, kind: str, obj: Obj, old: Obj | None) -> None:
        if kind != "DELETED":
            self.queue.add(object_key(obj))

    def _count_changed(self, key: PolicyKey) -> None:
        namespace, name = key
        self.queue.add_after(f"{namespace}/{name}", INTERVAL)

    async def reconcile(self, key: str) -> Result:
        body = self.policies.get(key)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return DONE
        policy = policy_view(body)
        others = [
            policy_view(o)
            for k, o in self.policies.store.items()
            if k != key and (o.get("metadata") or {}).get("namespace") == policy.namespace
        ]
        plan = decide(policy, others, self.gated.count(*policy.key), self.rt.clock.now())
        return await apply(self.rt.rest, plan)

    async def run(self) -> None:
        await self.rt.factory.wait_synced()  # counts from a half-listed cache would be wrong
        await self.queue.run(WORKERS, self.reconcile)
