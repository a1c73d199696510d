"""kopf, for the one thing it is here for: the NodeMaintenance objects and their finalizer.

kopf watches only `nodemaintenances` (hundreds of objects at most) and feeds the controller's
work queue; pods, nodes, budgets and workloads come from the runtime's shared informers, so
the process keeps one watch per view whatever kopf does. What kopf is told, and why:

- a registry of its own (`kopf.OperatorRegistry()`), never the module-level default: nothing
  registers by being imported, and a second controller on kopf gets a registry of its own;
- standalone (no peering objects): this process's own Lease already decides who leads, and
  the runner starts kopf only while it does;
- no Events: `settings.posting` is off, every Event comes from the runtime's one poster;
- its finalizer is `pilotfish.io/maintenance`, its progress and diff-base annotations live
  under `maintenance.pilotfish.io/`, and it neither scans CRDs nor watches namespaces (the
  chart grants neither);
- it is imported without the official Kubernetes clients (`pilotfish.importing`), which it
  would load only to recognise their objects;
- it logs in with the credentials of the process's own transport (`pilotfish.kube.client`:
  the kubeconfig, or the in-cluster ServiceAccount token, re-read on every login so a
  rotated token is picked up when kopf sees a 401).

The deletion handler does not write: it asks the controller, whose reconcile uncordons on
its queue like every other write, and returns once the nodes are released (kopf then
removes the finalizer) or raises a TemporaryError for kopf to ask again.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Mapping
from typing import Any, Final, Protocol

from pilotfish import names
from pilotfish.importing import without

with without("kubernetes", "kubernetes_asyncio"):
    import kopf
from pilotfish.kube.rest import NODEMAINTENANCES, Rest
from pilotfish.kube.transport import HttpTransport

log = logging.getLogger("pilotfish.maintenance.kopf")

ANNOTATION_PREFIX: Final = "maintenance.pilotfish.io"
HANDLER_RELEASE: Final = "release"
# How long the deletion handler waits for the controller to release the nodes before it
# lets kopf call it again (kopf's own retry, recorded under ANNOTATION_PREFIX).
RELEASE_WAIT_SECONDS: Final = 10.0
RELEASE_RETRY_SECONDS: Final = 2.0


class Target(Protocol):
    """What kopf drives: the controller."""

    def saw(self, name: str, body: Mapping[str, Any] | None) -> None:
        """Any event of the NodeMaintenance `name` (None: it is gone)."""

    async def released(self, name: str, within: float) -> bool:
        """Whether `name`'s nodes are released, waiting up to `within` seconds."""


def settings() -> kopf.OperatorSettings:
    s = kopf.OperatorSettings()
    s.peering.standalone = True
    s.peering.clusterwide = True
    s.posting.enabled = False
    s.scanning.disabled = True
    s.persistence.finalizer = names.FINALIZER_MAINTENANCE
    s.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    s.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    # The process exits through the runner when kopf stops; kopf must not SIGKILL it.
    s.process.ultimate_exiting_timeout = None
    return s


async def connection(rest: Rest) -> kopf.ConnectionInfo:
    """kopf's credentials: the process's own (`pilotfish.kube.credentials`)."""
    api = rest.api
    if not isinstance(api, HttpTransport):
        raise TypeError(f"kopf logs in with a component's HttpTransport, not {type(api).__name__}")
    c = api.credentials
    token = c.bearer(fresh=True)
    return kopf.ConnectionInfo(
        server=c.server,
        ca_path=c.ca_file,
        ca_data=c.ca_data,
        insecure=c.insecure,
        scheme="Bearer" if token else None,
        token=token,
        certificate_path=c.cert_file,
        certificate_data=c.cert_data,
        private_key_path=c.key_file,
        private_key_data=c.key_data,
        # As the process's client would go: the kubeconfig's proxy, else the environment's
        # (kopf's few requests can afford aiohttp's per-request lookup).
        proxy_url=c.proxy,
        trust_env=True,
    )


def registry(rest: Rest, target: Target) -> kopf.OperatorRegistry:
    reg = kopf.OperatorRegistry()
    group, version, plural = (
        NODEMAINTENANCES.group,
        NODEMAINTENANCES.version,
        NODEMAINTENANCES.plural,
    )

    @kopf.on.login(registry=reg)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        return await connection(rest)

    @kopf.on.event(group=group, version=version, plural=plural, registry=reg)
    async def on_event(event: kopf.RawEvent, **_: Any) -> None:
        obj = event.get("object") or {}
        name = str((obj.get("metadata") or {}).get("name") or "")
        if name:
            target.saw(name, None if event.get("type") == "DELETED" else obj)

    @kopf.on.delete(
        group=group,
        version=version,
        plural=plural,
        registry=reg,
        id=HANDLER_RELEASE,
        optional=False,
    )
    async def release(name: str, **_: Any) -> None:
        if not await target.released(name, RELEASE_WAIT_SECONDS):
            raise kopf.TemporaryError(
                f"NodeMaintenance {name}: its nodes are not released yet",
                delay=RELEASE_RETRY_SECONDS,
            )

    return reg


class _Quiet(logging.Filter):
    """kopf attaches its whole settings object to every per-object record; the process's
    JSON log would print it on each line."""

    def filter(self, record: logging.LogRecord) -> bool:
        for attr in ("settings", "k8s_skip", "k8s_ref"):
            record.__dict__.pop(attr, None)
        return True


def quiet_logs() -> None:
    """kopf logs every handler call at info; its warnings and errors are what matter here
    (the controller logs its own writes)."""
    logging.getLogger("kopf").setLevel(logging.WARNING)
    for name in ("kopf.objects", "kopf.activities.authentication"):
        found = logging.getLogger(name)
        if not any(isinstance(f, _Quiet) for f in found.filters):
            found.addFilter(_Quiet())


async def run(rest: Rest, target: Target) -> None:
    """kopf's tasks until one ends (raised, so the guard stops the process) or until
    cancelled (they are cancelled with it)."""
    quiet_logs()
    stop = asyncio.Event()
    root = await kopf.spawn_tasks(
        registry=registry(rest, target),
        settings=settings(),
        standalone=True,
        clusterwide=True,
        stop_flag=stop,
    )
    _restore_signals()
    try:
        done, _ = await asyncio.wait(root, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
        raise RuntimeError(f"kopf stopped: {sorted(t.get_name() for t in done)}")
    finally:
        stop.set()
        for task in root:
            task.cancel()
        await asyncio.gather(*root, return_exceptions=True)


def _restore_signals() -> None:
    """kopf takes SIGINT and SIGTERM for its own graceful stop; the operator's are the
    defaults (its supervisor restarts it, and a fresh process rebuilds from the API)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)
