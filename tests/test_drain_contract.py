"""The surge-first contract, with both real controllers in one operator process on the shared
in-memory API: the maintenance controller cordons and annotates the node and evicts only
once a replacement is Ready; the ServiceWorkload controller starts that replacement on
another node and never takes the old pod down itself. The disruption controller (a PDB's
status) and the scheduler and kubelet are played by the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

from pilotfish import names
from pilotfish.kube.rest import NODEMAINTENANCES, NODES, PODS, SERVICEWORKLOADS
from pilotfish.kube.runtime import Runtime
from pilotfish.operators.maintenance import MaintenanceController
from pilotfish.operators.serviceworkload import ServiceWorkloadController
from pilotfish.operators.serviceworkload.pdb import PDBS
from pilotfish.timeutil import FakeClock
from pilotfish.workloads import ANNOTATION_DRAIN
from tests.rollout_harness import KEY, T0, Lagging, workload
from tests.test_serviceworkload_drain import node_of, schedule

Obj = dict[str, Any]
NM = "upgrade"


def ready(pod: Obj) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def disruption_controller(api: Lagging) -> None:
    """kube-controller-manager's: each budget's allowance from its pods' health."""
    for key, pdb in list(api.store("policy/v1", "poddisruptionbudgets").items()):
        ns, name = key.split("/", 1)
        healthy = sum(1 for p in api.pods() if ready(p))
        sw = api.obj(SERVICEWORKLOADS.path(ns, name)) or {}
        expected = int((sw.get("spec") or {}).get("replicas", 1))
        allowed = max(0, healthy - (expected - int(pdb["spec"]["maxUnavailable"])))
        status = {
            "observedGeneration": pdb["metadata"].get("generation", 1),
            "currentHealthy": healthy,
            "desiredHealthy": expected - int(pdb["spec"]["maxUnavailable"]),
            "expectedPods": expected,
            "disruptionsAllowed": allowed,
        }
        if pdb.get("status") != status:
            api.put(PDBS.path(ns, name), {**pdb, "status": status})


async def test_a_single_replica_service_is_surged_then_evicted_never_below_one_ready() -> None:
    api, clock = Lagging(), FakeClock(T0)
    for n in ("n1", "n2"):
        api.put(NODES.path(name=n), {"metadata": {"name": n}, "spec": {}})
    rt = Runtime.build(api, clock=clock, resync_seconds=None)
    sw = ServiceWorkloadController(rt, rng=random.Random(1))
    mc = MaintenanceController(rt)
    informers = asyncio.ensure_future(rt.factory.run())
    try:
        await rt.factory.wait_synced()
        api.put(SERVICEWORKLOADS.path("ns"), workload(1))
        for _ in range(3):
            await api.settle()
            await sw.reconcile(KEY)
        schedule(api, clock, onto=["n1"])
        await api.settle()
        await sw.reconcile(KEY)
        [old] = api.pods()
        nm = {
            "apiVersion": names.API_VERSION,
            "kind": "NodeMaintenance",
            "metadata": {"name": NM, "finalizers": [names.FINALIZER_MAINTENANCE]},
            "spec": {"nodes": ["n1"]},
        }
        api.put(NODEMAINTENANCES.path(name=NM), nm)
        evicted_at_ready = None
        for _ in range(40):
            disruption_controller(api)
            await api.settle()
            mc.saw(NM, api.obj(NODEMAINTENANCES.path(name=NM)))
            await mc.reconcile(NM)
            await api.settle()
            await sw.reconcile(KEY)
            live = api.pods()
            assert sum(1 for p in live if ready(p)) >= 1, "the service never has 0 Ready"
            assert len(api.pods(live=False)) <= 2, "one surge, no more"
            assert not any(ANNOTATION_DRAIN in p["metadata"].get("annotations", {}) for p in live)
            gone = api.obj(PODS.path("ns", old["metadata"]["name"]))
            if evicted_at_ready is None and (
                gone is None or gone["metadata"].get("deletionTimestamp")
            ):
                evicted_at_ready = [node_of(p) for p in live if ready(p)]
            clock.advance(1)
            schedule(api, clock)
            api.terminate()
            status = (api.obj(NODEMAINTENANCES.path(name=NM)) or {}).get("status") or {}
            if status.get("phase") == "Done":
                break
        assert status.get("phase") == "Done", status
        assert evicted_at_ready == ["n2"], "evicted only once its replacement was Ready on n2"
        [pod] = api.pods(live=False)
        assert node_of(pod) == "n2" and ready(pod)
        node = api.obj(NODES.path(name="n1")) or {}
        assert node["spec"].get("unschedulable") is True
        assert node["metadata"]["annotations"][names.ANNOTATION_DRAINING] == NM
    finally:
        informers.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await informers
