"""The operator process: health and metrics first, then leadership, then the controllers.

Health answers from the start so a standby replica is live and ready while it waits for the
lease; controllers run only while this process leads. Losing the lease exits the process
(exit code 3): a fresh start rebuilds every view from the API, which is simpler and safer
than stopping controllers half-way and resuming them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import kopf
from aiohttp import web

from pilotfish import httpserver, metrics, names
from pilotfish.kube.client import api_client
from pilotfish.kube.leader import LeaderElector
from pilotfish.kube.rest import Rest
from pilotfish.operators.endpoints import EndpointsController
from pilotfish.operators.gates import GateController
from pilotfish.operators.nodelifecycle import NodeLifecycleController
from pilotfish.operators.quota import QuotaController
from pilotfish.operators.serviceworkload import ServiceWorkloadController

log = logging.getLogger("pilotfish.operator")

LEASE_NAME = "pilotfish-operator"
EXIT_LOST_LEADERSHIP = 3


def _login(**kwargs: Any) -> Any:
    """kopf's own kubeconfig login, read at call time (the client library reads $KUBECONFIG
    once at import, before `--kubeconfig` is known), else the in-cluster ServiceAccount."""
    if os.environ.get("KUBECONFIG"):
        return kopf.login_with_kubeconfig(**kwargs)
    return kopf.login_with_service_account(**kwargs)


class Controller(Protocol):
    async def run(self) -> None: ...


@dataclass(frozen=True)
class Options:
    """Process-wide settings some controllers need: who this process is (Events, audit) and
    where their files go. A controller that wants them has `configure(options)`."""

    identity: str = "pilotfish-operator"
    audit_log: Path | None = None


@runtime_checkable
class Configurable(Protocol):
    def configure(self, options: Options) -> None: ...


# Hot-path controllers on the shared informer, by name (`pilotfish operator --controllers`).
CONTROLLERS: dict[str, Callable[[Rest], Controller]] = {
    "nodelifecycle": NodeLifecycleController,
    "endpoints": EndpointsController,
    "quota": QuotaController,
    "gates": GateController,
    "serviceworkload": ServiceWorkloadController,
}


def build(name: str, rest: Rest, options: Options) -> Controller:
    controller = CONTROLLERS[name](rest)
    if isinstance(controller, Configurable):
        controller.configure(options)
    return controller


async def run(
    kubeconfig: str | None,
    metrics_host: str,
    metrics_port: int,
    namespace: str | None = None,
    controllers: Iterable[str] = tuple(CONTROLLERS),
    audit_log: str | None = None,
) -> int:
    unknown = set(controllers) - set(CONTROLLERS)
    if unknown:
        raise ValueError(f"unknown controllers {sorted(unknown)}; known: {sorted(CONTROLLERS)}")
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig
    registry = kopf.get_default_registry()
    kopf.on.login(registry=registry)(_login)
    app = web.Application()
    httpserver.add_common_routes(app)
    health = asyncio.create_task(
        httpserver.run_until_cancelled(app, metrics_host, metrics_port, name="operator")
    )
    api = await api_client(kubeconfig)
    rest = Rest(api)
    identity = f"{socket.gethostname()}-{os.getpid()}"
    options = Options(identity=identity, audit_log=Path(audit_log) if audit_log else None)
    elector = LeaderElector(api, namespace or names.SYSTEM_NAMESPACE, LEASE_NAME, identity)
    try:
        await elector.acquire()
        metrics.OPERATOR_LEADER.set(1)
        stop = asyncio.Event()
        tasks = {
            asyncio.create_task(
                kopf.operator(clusterwide=True, standalone=True, stop_flag=stop, registry=registry)
            ),
            *(asyncio.create_task(build(name, rest, options).run()) for name in controllers),
        }
        holder = asyncio.create_task(elector.hold())
        done, _ = await asyncio.wait({*tasks, holder}, return_when=asyncio.FIRST_COMPLETED)
        metrics.OPERATOR_LEADER.set(0)
        stop.set()
        holder.cancel()
        for t in tasks:
            t.cancel()
        if holder in done:
            return EXIT_LOST_LEADERSHIP
        for t in done:
            t.result()  # a controller that stopped on its own: surface why
        return 1
    finally:
        await api.close()
        health.cancel()
