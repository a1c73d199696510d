"""The few HTTP pieces the scheduler extender and the admission webhooks share.

Both are small aiohttp servers called by Kubernetes control-plane components that treat any
non-200 answer as an error, so both need the same things: a JSON body reader that turns bad
input into one precise 4xx, mutual TLS, deadlines on slow clients, /healthz and /metrics,
and a way to run until cancelled that closes the listening socket on the way out. Keeping
them here means the two servers fail and report the same way.

Bounds on what a caller can make a server hold
----------------------------------------------
- TLS: the handshake must finish within `TLS_HANDSHAKE_TIMEOUT`; with a client CA, a client
  without a certificate signed by it is refused during the handshake, before any HTTP.
- The request head (request line and headers) must arrive within `HEADER_TIMEOUT` of the
  connection, or of its first byte on a kept-alive connection; then the connection is closed.
  aiohttp has no such timeout of its own: its keep-alive timer only runs while idle.
- The body must be read within `BODY_TIMEOUT` (`read_body`), else 408 and the connection
  closes; its size is bounded by each app's `client_max_size` (413).
- JSON nests at most `MAX_JSON_DEPTH` levels, checked before `json.loads` runs, so neither
  the parser nor any code walking the result recursively can be driven into deep recursion.
- An idle kept-alive connection is closed after `KEEPALIVE_TIMEOUT`.
"""

import asyncio
import json
import logging
import math
import re
import ssl
from collections.abc import Callable
from itertools import accumulate
from typing import Any, Final, cast

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder

from pilotfish import draining

log = logging.getLogger(__name__)

JSON_CONTENT_TYPE: Final = "application/json"

# Compact separators: the extender answers thousands of calls a second and every byte of a
# 10,000-name list is encoded, sent and decoded again by the scheduler.
_SEPARATORS: Final = (",", ":")

# Kubernetes objects nest about a dozen levels (managedFields a few more); Go's encoding/json
# stops at 10,000, Python's parser at the interpreter's recursion limit, far past anything
# real and close enough to the limit to crash whatever walks the result afterwards.
MAX_JSON_DEPTH: Final = 64
HEADER_TIMEOUT: Final = 10.0
BODY_TIMEOUT: Final = 10.0
TLS_HANDSHAKE_TIMEOUT: Final = 10.0
# Longer than the callers' request interval under load, shorter than their own idle timeout
# (Go's http.Transport: 90 s), so a connection is reused and rarely closed under a request.
KEEPALIVE_TIMEOUT: Final = 60.0
# How long leftover body bytes are drained after an early answer (413, 408) so the client
# can read it; beyond this the connection is closed.
LINGERING_TIME: Final = 1.0


class BadRequest(Exception):
    """Input a caller sent that can never succeed, reported as HTTP 400 with this message.

    Raised by the pure wire parsers (which know nothing of HTTP) so that the message names
    exactly which field was missing or of the wrong type.
    """


# A JSON string, escapes included; one left unterminated runs to the end of the body (and a
# lone backslash may end it). Possessive and always matching once started, so one pass is
# linear: a pattern that can fail at the end retries from every quote inside, which made a
# body of 65 "[" and 20,000 escaped quotes take 6 s.
_JSON_STRING: Final = re.compile(rb'"(?:[^"\\]++|\\.?)*+(?:"|\Z)', re.DOTALL)
# Every byte but the four brackets, for bytes.translate (C speed: ~50 us for 200 KB).
_NOT_BRACKETS: Final = bytes(sorted(set(range(256)) - set(b"[]{}")))


def _depth(brackets: bytes) -> int:
    return max(accumulate(1 if c in b"[{" else -1 for c in brackets), default=0)


def json_depth(body: bytes) -> int:
    """The deepest nesting of arrays and objects in UTF-8 `body`, strings ignored.

    For text the json module accepts this is exact: its string grammar is a subset of
    `_JSON_STRING`'s, so no bracket it parses as structure is hidden (and in UTF-8 no byte
    of a multi-byte character is a bracket or a quote); in text it refuses, a bracket
    hidden in an unterminated string is one it would never reach. Brackets inside strings can only
    add depth, so the bound is first checked with them counted, which skips the slower
    pass over every string when that already passes (the common case).
    """
    upper = _depth(body.translate(None, _NOT_BRACKETS))
    if upper <= MAX_JSON_DEPTH:
        return upper
    return _depth(_JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS))


def _constant(name: str) -> Any:
    raise BadRequest(f"request body is not valid JSON: {name} is not a JSON number")


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise BadRequest(f"request body is not valid JSON: number {literal[:40]} overflows")
    return value


def decode_json(body: bytes) -> Any:
    """Parse a request body, turning every JSON failure into a `BadRequest`.

    Stricter than `json.loads` in what the API server and kube-scheduler never send: only
    UTF-8, no NaN or Infinity, no number that overflows a float, no nesting past the bound.
    """
    if not body:
        raise BadRequest("request body is empty, expected a JSON object")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"request body is not UTF-8: {exc}") from exc
    depth = json_depth(body)
    if depth > MAX_JSON_DEPTH:
        raise BadRequest(
            f"request body nests arrays and objects {depth} levels deep; "
            f"at most {MAX_JSON_DEPTH} are accepted"
        )
    try:
        return json.loads(text, parse_constant=_constant, parse_float=_finite)
    except ValueError as exc:
        # json.JSONDecodeError is a ValueError, and so is an integer of over 4,300 digits.
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:  # the depth bound makes this unreachable; kept as a net
        raise BadRequest("request body nests too deeply") from exc


async def read_body(request: web.Request, seconds: float | None = None) -> bytes:
    """The whole body within `seconds` (default `BODY_TIMEOUT`): a client dribbling it gets
    408 and is disconnected. The size bound is the app's `client_max_size` (aiohttp raises
    413 past it)."""
    seconds = BODY_TIMEOUT if seconds is None else seconds
    try:
        async with asyncio.timeout(seconds):
            return await request.read()
    except TimeoutError:
        # Connection: close, so the rest of the body is drained for LINGERING_TIME at most.
        raise web.HTTPRequestTimeout(
            text=f"request body not received within {seconds:g} s",
            headers={"Connection": "close"},
        ) from None


def dumps(payload: Any) -> bytes:
    return json.dumps(payload, separators=_SEPARATORS).encode()


def json_response(body: bytes, status: int = 200) -> web.Response:
    """Send JSON that is already encoded, so hot paths can encode it their own fast way."""
    return web.Response(status=status, body=body, content_type=JSON_CONTENT_TYPE)


def bad_request(message: str) -> web.Response:
    """A 400 in plain text, so that `curl` and the API server's error log show it as is."""
    return web.Response(status=400, text=message)


def server_tls(certfile: str, keyfile: str, client_ca: str | None = None) -> ssl.SSLContext:
    """TLS 1.2+ serving context; with `client_ca`, mutual TLS against that CA alone.

    Built from a bare context rather than `create_default_context`, which would also trust
    the system's public CAs for client certificates: any certificate bought anywhere would
    then pass. OpenSSL checks the client certificate's extended key usage (clientAuth) too.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    if client_ca:
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


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


def readyz(ready: Callable[[], bool], waiting_for: str) -> Handler:
    async def handle(_request: web.Request) -> web.StreamResponse:
        if draining.draining():  # stopping: out of the Service before the port closes
            return web.Response(status=503, text="stopping: draining")
        if ready():
            return web.Response(text="ok")
        return web.Response(status=503, text=f"starting: {waiting_for}")

    return handle


def health_app(ready: Callable[[], bool], waiting_for: str) -> web.Application:
    """/healthz, /readyz and /metrics alone, for a plain-HTTP port beside a mutual-TLS one.

    kubelet probes and Prometheus cannot present the client certificate the serving port
    demands; this port answers them and nothing else (no body is ever read here).
    """
    app = web.Application(client_max_size=1024)
    add_common_routes(app)
    app.router.add_get("/readyz", readyz(ready, waiting_for))
    return app


class _DeadlineProtocol(web.RequestHandler):
    """aiohttp's HTTP protocol with a deadline on each request head.

    The timer runs from the connection (or the first byte of a next request) until the
    request's handler starts (`head_deadline` middleware); when it fires, the connection
    is closed. While idle between requests aiohttp's own keep-alive timer applies.
    """

    def __init__(self, manager: web.Server, *, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._header_timeout = header_timeout
        self._head_timer: asyncio.TimerHandle | None = None
        self._handling = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self._handling and self._head_timer is None:
            self._arm()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def head_received(self) -> None:
        self._handling = True
        self._disarm()

    def request_done(self) -> None:
        self._handling = False

    def _arm(self) -> None:
        self._head_timer = asyncio.get_running_loop().call_later(
            self._header_timeout, self._head_timed_out
        )

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        log.info(
            "closing a connection whose request head did not arrive in time",
            extra={"peer": str(self.peername), "seconds": self._header_timeout},
        )
        self.force_close()


@web.middleware
async def head_deadline(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tell the connection its request head is complete, so its head deadline stops."""
    protocol = request.protocol
    if isinstance(protocol, _DeadlineProtocol):
        protocol.head_received()
    try:
        return await handler(request)
    finally:
        if isinstance(protocol, _DeadlineProtocol):
            protocol.request_done()


async def run_until_cancelled(
    app: web.Application,
    host: str,
    port: int,
    *,
    name: str,
    ssl_context: ssl.SSLContext | None = None,
    shutdown_timeout: float = 5.0,
    header_timeout: float | None = None,
) -> None:
    """Serve `app` until the calling task is cancelled, then stop accepting and clean up.

    No signal handlers: the process entry point owns signals and cancels this task. No
    access log: at thousands of scheduler calls a second a log line per call would cost more
    than the call itself, and the request counters and histograms carry the same facts.
    `shutdown_timeout` bounds how long in-flight calls may finish; callers retry anyway.
    `header_timeout` defaults to `HEADER_TIMEOUT`; the `head_deadline` middleware that
    stops it once a head is complete is added to `app` here.
    """
    if head_deadline not in app.middlewares:
        app.middlewares.append(head_deadline)
    if draining.close_when_draining not in app.middlewares:
        app.middlewares.append(draining.close_when_draining)
    runner = web.AppRunner(
        app, handle_signals=False, access_log=None, shutdown_timeout=shutdown_timeout
    )
    await runner.setup()
    manager = runner.server
    assert manager is not None  # set by setup()
    loop = asyncio.get_running_loop()

    def protocol() -> _DeadlineProtocol:
        return _DeadlineProtocol(
            manager,
            loop=loop,
            header_timeout=HEADER_TIMEOUT if header_timeout is None else header_timeout,
            keepalive_timeout=KEEPALIVE_TIMEOUT,
            lingering_time=LINGERING_TIME,
            access_log=cast(logging.Logger, None),
        )

    server: asyncio.Server | None = None
    try:
        server = await loop.create_server(
            protocol,
            host,
            port,
            ssl=ssl_context,
            reuse_address=True,
            ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT if ssl_context is not None else None,
        )
        log.info(
            "listening",
            extra={
                "component": name,
                "host": host,
                "port": port,
                # The bound address, which differs from `port` when it was 0.
                "addresses": [_address(s.getsockname()) for s in server.sockets],
                "tls": ssl_context is not None,
                "client_auth": ssl_context is not None
                and ssl_context.verify_mode == ssl.CERT_REQUIRED,
            },
        )
        await asyncio.Future()  # only cancellation ends this
    finally:
        log.info("stopping", extra={"component": name, "host": host, "port": port})
        if server is not None:
            server.close()
        await runner.cleanup()
        if server is not None:
            await server.wait_closed()


def _address(sockname: Any) -> str:
    return f"{sockname[0]}:{sockname[1]}" if isinstance(sockname, tuple) else str(sockname)
