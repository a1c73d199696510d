"""The operator process: health and metrics first, then leadership, then the controllers.

Health answers from the start so a standby replica is live and ready while it waits for the
lease; controllers run only while this process leads. Losing the lease exits the process
(exit code 3): a fresh start rebuilds every view from the API, which is simpler and safer
than stopping controllers half-way and resuming them. Whatever restarts it (the kubelet, or
`pilotfish dev supervise` locally) brings it back as a candidate under the same identity
(the pod's name), so after an API outage it leads again as soon as the API answers.

Short outages do not get that far: the lease survives blips shorter than the renew deadline,
the informers re-list and re-watch with backoff, and kopf's API calls retry without end.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import kopf
from aiohttp import web

from pilotfish import httpserver, metrics, names
from pilotfish.kube.client import api_client
from pilotfish.kube.leader import LeaderElector, RestLeaseStore
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


def default_identity() -> str:
    """The pod's name in a cluster (stable across container restarts, so a restarted operator
    recognises its own lease), else host and pid."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


class _RetryForever:
    """kopf's API retry delays, never exhausted: by default kopf escalates after ~54 s of
    failures and its watch then stops the whole operator; this way its watches ride out an
    outage as the informers do. Re-iterable: kopf iterates it afresh for every request."""

    def __iter__(self) -> Iterator[float]:
        yield from (1.0, 1.0, 2.0, 3.0)
        yield from itertools.repeat(4.0)


def _configure_kopf(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.networking.error_backoffs = _RetryForever()


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
    identity: str | None = None,
) -> int:
    unknown = set(controllers) - set(CONTROLLERS)
    if unknown:
        raise ValueError(f"unknown controllers {sorted(unknown)}; known: {sorted(CONTROLLERS)}")
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig
    registry = kopf.get_default_registry()
    kopf.on.login(registry=registry)(_login)
    kopf.on.startup(registry=registry)(_configure_kopf)
    app = web.Application()
    httpserver.add_common_routes(app)
    health = asyncio.create_task(
        httpserver.run_until_cancelled(app, metrics_host, metrics_port, name="operator")
    )
    api = await api_client(kubeconfig)
    rest = Rest(api)
    identity = identity or default_identity()
    options = Options(identity=identity, audit_log=Path(audit_log) if audit_log else None)
    store = RestLeaseStore(rest, namespace or names.SYSTEM_NAMESPACE, LEASE_NAME)
    elector = LeaderElector(store, identity)
    log.info("waiting for the lease", extra={"lease": LEASE_NAME, "identity": identity})
    try:
        await elector.acquire()
        metrics.OPERATOR_LEADER.set(1)
        stop = asyncio.Event()
        tasks: set[asyncio.Task[Any]] = {
            asyncio.create_task(
                kopf.operator(clusterwide=True, standalone=True, stop_flag=stop, registry=registry)
            ),
            *(asyncio.create_task(build(name, rest, options).run()) for name in controllers),
        }
        holder = asyncio.create_task(elector.hold())
        done, _ = await asyncio.wait(tasks | {holder}, return_when=asyncio.FIRST_COMPLETED)
        metrics.OPERATOR_LEADER.set(0)
        stop.set()
        holder.cancel()
        for t in tasks:
            t.cancel()
        if holder in done:
            log.error(
                "exiting: leadership lost; a fresh process rebuilds its view from the API",
                extra={"reason": holder.result(), "exit_code": EXIT_LOST_LEADERSHIP},
            )
            return EXIT_LOST_LEADERSHIP
        for t in done:
            t.result()  # a controller that stopped on its own: surface why
        return 1
    finally:
        await api.close()
        health.cancel()
