"""A server stopped for a rolling update keeps answering until its callers have moved away.

The kubelet stops a pod with SIGTERM. Python's default action ends the process at once,
while the API server is still sending admission reviews to it over kept-alive connections
(it reuses them whatever the Service's endpoints say): a review in flight, or sent in the
moment the process dies, fails, and the webhooks fail closed, so a tenant's write fails
during a `helm upgrade` (seen: 1 of 3,100 dry-run creates refused with "connection reset by
peer" from the old webhooks pod). So on SIGTERM a server drains: /readyz answers 503 (the
pod leaves the Service), every answer carries `Connection: close` (each caller's next
request opens a new connection, which goes to a pod still serving), and only after
`drain_seconds` is the main task cancelled, which stops accepting and lets the calls in
flight finish (`httpserver.run_until_cancelled`). A second SIGTERM changes nothing; SIGINT
keeps its default (a developer's Ctrl-C stops at once).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Coroutine
from typing import Any, Final

from aiohttp import web
from aiohttp.typedefs import Handler

from pilotfish.envseconds import seconds_from_env

log = logging.getLogger("pilotfish.draining")

DRAIN_SECONDS: Final = 5.0
DRAIN_ENV: Final = "PILOTFISH_DRAIN_SECONDS"


class _State:
    """The process's one drain: every server of it drains together."""

    draining = False


_STATE: Final = _State()


def draining() -> bool:
    return _STATE.draining


def start_draining() -> None:
    _STATE.draining = True


def stop_draining() -> None:
    """For tests: the process serves normally again."""
    _STATE.draining = False


def drain_seconds_from_env() -> float:
    """PILOTFISH_DRAIN_SECONDS (default 5, at most 300): a bad value raises ValueError
    naming it."""
    return seconds_from_env(DRAIN_ENV, DRAIN_SECONDS, at_most=300)


@web.middleware
async def close_when_draining(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    if _STATE.draining:
        response.force_close()
    return response


async def serve_until_terminated(
    main: Coroutine[Any, Any, None], *, name: str, drain_seconds: float
) -> None:
    """Run `main` (a server) until it ends, or until `drain_seconds` after SIGTERM, when the
    task running this is cancelled (which cancels `main` where it waits)."""
    loop = asyncio.get_running_loop()
    current = asyncio.current_task()
    assert current is not None  # called from a coroutine

    def terminated() -> None:
        if _STATE.draining:
            return
        start_draining()
        log.info("SIGTERM: draining", extra={"component": name, "seconds": drain_seconds})
        loop.call_later(drain_seconds, current.cancel)

    loop.add_signal_handler(signal.SIGTERM, terminated)
    try:
        await main
    except asyncio.CancelledError:
        if not _STATE.draining:
            raise
        log.info("drained: stopped", extra={"component": name})
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
