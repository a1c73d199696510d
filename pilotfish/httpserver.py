"""The few HTTP pieces the scheduler extender and the admission webhooks share.

Both are small aiohttp servers called by Kubernetes control-plane components that treat any
non-200 answer as an error, so both need the same things: a JSON body reader that turns bad
input into one precise 400, /healthz and /metrics, and a way to run until cancelled that
closes the listening socket on the way out. Keeping them here means the two servers fail and
report the same way.
"""

import asyncio
import json
import logging
import ssl
from collections.abc import Awaitable
from typing import Any, Final

from aiohttp import web
from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder

log = logging.getLogger(__name__)

JSON_CONTENT_TYPE: Final = "application/json"

# Compact separators: the extender answers thousands of calls a second and every byte of a
# 10,000-name list is encoded, sent and decoded again by the scheduler.
_SEPARATORS: Final = (",", ":")


class BadRequest(Exception):
    """Input a caller sent that can never succeed, reported as HTTP 400 with this message.

    Raised by the pure wire parsers (which know nothing of HTTP) so that the message names
    exactly which field was missing or of the wrong type.
    """


def decode_json(body: bytes) -> Any:
    """Parse a request body, turning every JSON failure into a `BadRequest`."""
    if not body:
        raise BadRequest("request body is empty, expected a JSON object")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        # json.JSONDecodeError is a ValueError; invalid UTF-8 raises UnicodeDecodeError.
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc


def dumps(payload: Any) -> bytes:
    return json.dumps(payload, separators=_SEPARATORS).encode()


def json_response(body: bytes, status: int = 200) -> web.Response:
    """Send JSON that is already encoded, so hot paths can encode it their own fast way."""
    return web.Response(status=status, body=body, content_type=JSON_CONTENT_TYPE)


def bad_request(message: str) -> web.Response:
    """A 400 in plain text, so that `curl` and the API server's error log show it as is."""
    return web.Response(status=400, text=message)


async def healthz(_request: web.Request) -> web.Response:
    """Liveness only: the process is serving. Readiness that depends on caches is per part."""
    return web.Response(text="ok")


async def metrics(request: web.Request) -> web.Response:
    """The default registry, content-negotiated the same way prometheus-client's own server
    does it, so Prometheus 2 and 3 and OpenMetrics scrapers all get a format they parse."""
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    response = web.Response(body=encoder(REGISTRY))
    # Set the header directly: aiohttp's content_type argument rejects parameters.
    response.headers["Content-Type"] = content_type
    return response


def add_common_routes(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)


async def run_until_cancelled(
    app: web.Application,
    host: str,
    port: int,
    *,
    name: str,
    ssl_context: ssl.SSLContext | None = None,
    shutdown_timeout: float = 5.0,
) -> None:
    """Serve `app` until the calling task is cancelled, then stop accepting and clean up.

    No signal handlers: the process entry point owns signals and cancels this task. No
    access log: at thousands of scheduler calls a second a log line per call would cost more
    than the call itself, and the request counters and histograms carry the same facts.
    `shutdown_timeout` bounds how long in-flight calls may finish; callers retry anyway.
    """
    runner = web.AppRunner(
        app, handle_signals=False, access_log=None, shutdown_timeout=shutdown_timeout
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_address=True)
        await site.start()
        log.info(
            "listening",
            extra={
                "component": name,
                "host": host,
                "port": port,
                # The bound address, which differs from `port` when it was 0.
                "addresses": [
                    f"{a[0]}:{a[1]}" if isinstance(a, tuple) else str(a) for a in runner.addresses
                ],
                "tls": ssl_context is not None,
            },
        )
        await asyncio.Future()  # only cancellation ends this
    finally:
        log.info("stopping", extra={"component": name, "host": host, "port": port})
        await runner.cleanup()


async def run_together(what: str, *coroutines: Awaitable[None]) -> None:
    """Run a server and the informers feeding it until cancelled; if any part ends (a
    crashed informer would leave the view frozen), stop the rest and raise, so the process
    exits and is restarted fresh instead of answering from a view that no longer moves."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
        raise RuntimeError(f"{what}: a task ended without an error")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
