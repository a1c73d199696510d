"""Driving the real BatchWorkload controller on the shared in-memory API (`tests.fakeapi`).

The cluster's side is played by hand: `bind` (the scheduler), `finish` (the kubelet ending a
task: Succeeded, Failed, or Failed with a DisruptionTarget condition), `evict` (someone
deleting a pod, which the tracking finalizer holds). `World.converge` lets the watches catch
up and syncs until one changes nothing.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from pilotfish import names
from pilotfish.kube.rest import BATCHWORKLOADS, PODS
from pilotfish.kube.runtime import Runtime
from pilotfish.kube.workqueue import Result
from pilotfish.operators.batchworkload import BatchWorkloadController
from pilotfish.timeutil import FakeClock
from pilotfish.workloads import FINALIZER_TASK, LABEL_TASK_INDEX
from tests.rollout_harness import KUBELET, ControllerWorld, Lagging

Obj = dict[str, Any]
NS = "ns"
NAME = "job"
KEY = f"{NS}/{NAME}"
BW = BATCHWORKLOADS.path(NS, NAME)


def batch(completions: int = 5, parallelism: int = 2, **spec: Any) -> Obj:
    return {
        "apiVersion": "pilotfish.io/v1alpha1",
        "kind": "BatchWorkload",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {
            "team": "ml",
            "completions": completions,
            "parallelism": parallelism,
            "template": {
                "metadata": {"labels": {"app": "train"}},
                "spec": {"containers": [{"name": "main", "image": "train:1"}]},
            },
            **spec,
        },
    }


def production_pod(name: str = "web-1", **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {names.LABEL_BAND: "production"}},
        "spec": {"containers": [{"name": "web", "image": "web:1"}], **spec},
        "status": {"phase": "Pending"},
    }


def index_of(pod: Obj) -> int:
    return int(pod["metadata"]["labels"][LABEL_TASK_INDEX])


def is_live(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


class Cluster(Lagging):
    """The fake API plus the scheduler's and kubelet's parts."""

    def pods_of(self) -> list[Obj]:
        return sorted(self.store("v1", "pods").values(), key=lambda p: p["metadata"]["name"])

    def live(self) -> list[Obj]:
        return [p for p in self.pods_of() if is_live(p)]

    def unbound(self) -> list[Obj]:
        return [p for p in self.live() if not p["spec"].get("nodeName")]

    def live_per_index(self) -> dict[int, int]:
        out: dict[int, int] = defaultdict(int)
        for p in self.live():
            out[index_of(p)] += 1
        return out

    def bw(self) -> Obj:
        found = self.obj(BW)
        assert found is not None
        return found

    def status(self) -> Obj:
        found: Obj = self.bw().get("status") or {}
        return found

    def condition(self, type_: str) -> tuple[str, str] | None:
        for c in self.status().get("conditions") or []:
            if c["type"] == type_:
                return c["status"], c["reason"]
        return None

    def edit_pod(self, name: str, change: Any) -> None:
        pod = self.obj(PODS.path(NS, name))
        assert pod is not None
        change(pod)
        self.put(PODS.path(NS, name), pod)

    def bind(self, name: str) -> None:
        """Placed and running: from now on a delete waits for the kubelet (`terminate`)."""

        def run(pod: Obj) -> None:
            pod["spec"].pop("schedulingGates", None)
            pod["spec"]["nodeName"] = "kwok-1"
            pod["status"] = {"phase": "Running"}
            pod["metadata"]["finalizers"] = [*pod["metadata"].get("finalizers", []), KUBELET]

        self.edit_pod(name, run)

    def kubelet_ends(self) -> int:
        """The kubelet ends every pod being deleted: killed, so Failed unless it had ended;
        one no finalizer holds any more is then gone, as the API server removes it.
        Returns how many it killed."""
        killed = 0
        for p in self.pods_of():
            if p["metadata"].get("deletionTimestamp") and KUBELET in p["metadata"]["finalizers"]:
                name = p["metadata"]["name"]
                killed += is_live(p)
                self.finish(name, "Failed" if is_live(p) else p["status"]["phase"])
                ended = self.obj(PODS.path(NS, name))
                if ended is not None and not ended["metadata"].get("finalizers"):
                    self.remove(PODS.path(NS, name))
        return killed

    def finish(self, name: str, phase: str = "Succeeded", *, disrupted: bool = False) -> None:
        def end(pod: Obj) -> None:
            meta = pod["metadata"]
            meta["finalizers"] = [f for f in meta.get("finalizers") or [] if f != KUBELET]
            status: Obj = {"phase": phase}
            if disrupted:
                status["conditions"] = [
                    {"type": "DisruptionTarget", "status": "True", "reason": "Preemption"}
                ]
            pod["status"] = status

        self.edit_pod(name, end)

    def run_all(self, phase: str = "Succeeded") -> list[str]:
        """Every live pod is placed and ends with `phase`."""
        names = [p["metadata"]["name"] for p in self.live()]
        for n in names:
            self.bind(n)
            self.finish(n, phase)
        return names

    def edit_spec(self, **spec: Any) -> None:
        bw = self.bw()
        bw["spec"].update(spec)
        self.put(BW, bw)

    def tracked(self) -> list[str]:
        return [
            p["metadata"]["name"]
            for p in self.pods_of()
            if FINALIZER_TASK in (p["metadata"].get("finalizers") or [])
        ]

    def creates(self) -> list[str]:
        return [
            c.body["metadata"]["name"]
            for c in self.calls
            if c.method == "POST" and c.path.endswith("/pods")
        ]


class World(ControllerWorld[Cluster, BatchWorkloadController]):
    async def converge(self, rounds: int = 30) -> Result:
        return await super().converge(rounds)


async def start(
    api: Cluster,
    clock: FakeClock,
    *,
    backoff_base: float = 10.0,
    sync_interval: float = 0.0,
    create: Obj | None = None,
) -> World:
    if create is not None:
        api.put(BW, create)
    rt = Runtime.build(api, clock=clock, resync_seconds=None)
    ctrl = BatchWorkloadController(rt, backoff_base=backoff_base, sync_interval=sync_interval)
    informers = asyncio.create_task(rt.factory.run())
    await rt.factory.wait_synced()
    return World(api, clock, rt, ctrl, informers, KEY)
