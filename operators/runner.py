"""The operator process: health and metrics first, then leadership, then the controllers.

Health answers from the start so a standby replica is live and ready while it waits for the
lease; controllers run only while this process leads. Losing the lease exits the process
(exit code 3): a fresh start rebuilds every view from the API, which is simpler and safer
than stopping controllers half-way and resuming them. Whatever restarts it (the kubelet, or
`pilotfish dev supervise` locally) brings it back as a candidate under the same identity
(the pod's name), so after an API outage it leads again as soon as the API answers.

Short outages do not get that far: the lease survives blips shorter than the renew deadline,
and the informers re-list and re-watch with backoff.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from aiohttp import web

from pilotfish import httpserver, metrics, names, tasks
from pilotfish.kube.client import api_client
from pilotfish.kube.leader import LeaderElector, RestLeaseStore
from pilotfish.kube.rest import Rest
from pilotfish.kube.runtime import Runtime
from pilotfish.nodesilence import SilenceSettings
from pilotfish.operators.batchworkload import BatchWorkloadController
from pilotfish.operators.endpoints import EndpointsController
from pilotfish.operators.gatepolicy import GatePolicyStatusController
from pilotfish.operators.gates import GateController
from pilotfish.operators.maintenance import MaintenanceController
from pilotfish.operators.nodelifecycle import NodeLifecycleController
from pilotfish.operators.quota import QuotaController
from pilotfish.operators.reclaim import ReclaimController
from pilotfish.operators.schedulinglatency import SchedulingLatencyObserver
from pilotfish.operators.serviceworkload import ServiceWorkloadController

log = logging.getLogger("pilotfish.operator")

LEASE_NAME = "pilotfish-operator"
EXIT_LOST_LEADERSHIP = 3


def default_identity() -> str:
    """The pod's name in a cluster (stable across container restarts, so a restarted operator
    recognises its own lease), else host and pid."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def batch_user(namespace: str | None, account: str | None) -> str | None:
    """Who the batch controller writes as: `account` of the operator's own namespace, which
    the chart lets the operator impersonate (and nothing else), so API Priority and Fairness
    queues batch writes in their own level. None or '' (`--no-batch-account`): the operator's
    own identity, for a cluster installed with batchAccount.enabled=false."""
    if not account:
        return None
    return names.service_account_user(namespace or names.SYSTEM_NAMESPACE, account)


class Controller(Protocol):
    async def run(self) -> None: ...


# Hot-path controllers on the shared runtime, by name (`pilotfish operator --controllers`).
CONTROLLERS: dict[str, Callable[[Runtime], Controller]] = {
    "nodelifecycle": NodeLifecycleController,
    "endpoints": EndpointsController,
    "quota": QuotaController,
    "gates": GateController,
    "serviceworkload": ServiceWorkloadController,
    "gatepolicy": GatePolicyStatusController,
    "batchworkload": BatchWorkloadController,
    "reclaim": ReclaimController,
    "schedulinglatency": SchedulingLatencyObserver,
    # On kopf, for the NodeMaintenance objects alone; started only while this process leads.
    "maintenance": MaintenanceController,
}


class LeadershipLost(Exception):
    pass


async def _lead(elector: LeaderElector) -> None:
    """Hold the lease; raise, with the elector's reason, once it is lost."""
    raise LeadershipLost(await elector.hold())


async def run(
    kubeconfig: str | None,
    metrics_host: str,
    metrics_port: int,
    namespace: str | None = None,
    controllers: Iterable[str] = tuple(CONTROLLERS),
    audit_log: str | None = None,
    identity: str | None = None,
    batch_account: str | None = names.SA_BATCH,
) -> int:
    unknown = set(controllers) - set(CONTROLLERS)
    if unknown:
        raise ValueError(f"unknown controllers {sorted(unknown)}; known: {sorted(CONTROLLERS)}")
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig
    app = web.Application()
    httpserver.add_common_routes(app)
    api = await api_client(kubeconfig)
    # Renewals get a connection pool of their own, as kube-controller-manager gives its
    # leader election a client of its own: at 1,000 nodes and 30,000 pods a renewal queued
    # behind the controllers' writes for the pool's 32 connections went unanswered for 8 s
    # and the leader lost its lease (benchmarks/scale).
    lease_api = await api_client(kubeconfig)
    audit = Path(audit_log) if audit_log else None
    rt = Runtime.build(
        Rest(api),
        identity=identity or default_identity(),
        audit_log=audit,
        batch_user=batch_user(namespace, batch_account),
        silence=SilenceSettings.from_env(),
    )
    try:
        await tasks.run_guarded(
            {
                "health": httpserver.run_until_cancelled(
                    app, metrics_host, metrics_port, name="operator"
                ),
                "operator": _lead_and_run(rt, Rest(lease_api), namespace, controllers),
            }
        )
    except tasks.TaskDied as died:
        metrics.OPERATOR_LEADER.set(0)
        cause = tasks.root_cause(died)
        if isinstance(cause, LeadershipLost):
            log.error(
                "exiting: leadership lost; a fresh process rebuilds its view from the API",
                extra={"reason": str(cause), "exit_code": EXIT_LOST_LEADERSHIP},
            )
            return EXIT_LOST_LEADERSHIP
        raise
    finally:
        await api.close()
        await lease_api.close()
    return 1  # run_guarded never returns


async def _lead_and_run(
    rt: Runtime, lease_rest: Rest, namespace: str | None, controllers: Iterable[str]
) -> None:
    """Health answers meanwhile: a standby is live and ready while it waits for the lease.
    The controllers are built only once this process leads, so their informers list then."""
    store = RestLeaseStore(lease_rest, namespace or names.SYSTEM_NAMESPACE, LEASE_NAME)
    elector = LeaderElector(store, rt.identity, clock=rt.clock)
    log.info("waiting for the lease", extra={"lease": LEASE_NAME, "identity": rt.identity})
    await elector.acquire()
    metrics.OPERATOR_LEADER.set(1)
    built = {name: CONTROLLERS[name](rt) for name in controllers}
    await tasks.run_guarded(
        {
            "leadership": _lead(elector),
            "informers": rt.factory.run(),
            "events": rt.events.run(),
            **{f"controller {name}": c.run() for name, c in built.items()},
        }
    )
