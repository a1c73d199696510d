"""The HTTP face of the scheduler extender: kube-scheduler calls it on every placement.

The scheduler waits for each call synchronously inside its scheduling cycle (a public
measurement saw throughput fall from ~991 to ~111 pods/s at 500 nodes behind a slow
extender), so a handler here only parses, calls a pure function in `decide` and encodes.
It reads the raw body and uses `json.loads` directly, skips aiohttp's access log, and
binds its metric children once when the app is built so a call does not look labels up.
"""

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiohttp import web

from pilotfish import httpserver, metrics
from pilotfish.extender import decide, wire
from pilotfish.httpserver import BadRequest

log = logging.getLogger(__name__)

# Enough for NodeNames of 10,000 nodes with room to spare, and for the full-Node and
# full-victim-Pod forms the scheduler sends when nodeCacheCapable is false.
MAX_BODY_BYTES: Final = 64 * 1024 * 1024

OUTCOMES: Final = ("ok", "bad_request", "error")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_Decision = Callable[[Any], bytes]


def _filter(body: Any) -> bytes:
    args = wire.parse_extender_args(body)
    result = decide.filter_nodes(args.pod, args.node_names)
    return wire.encode_filter_result(args, result.passing, result.failed, result.unresolvable)


def _prioritize(body: Any) -> bytes:
    args = wire.parse_extender_args(body)
    scores = decide.score_nodes(args.pod, args.node_names)
    return wire.encode_host_priorities(args.node_names, scores)


def _preempt(body: Any) -> bytes:
    args = wire.parse_preemption_args(body)
    return wire.encode_preemption_result(decide.choose_victims(args.pod, args.victims))


def _instrumented(verb: str, decision: _Decision) -> Handler:
    """Wrap a body-to-answer function with parsing, error mapping, counting and timing.

    Outcomes: `ok`; `bad_request` for input that can never succeed (HTTP 400, the
    scheduler records an extender error); `error` for a bug here (HTTP 500), logged with
    its traceback since nothing else would show it.
    """
    counters = {outcome: metrics.EXTENDER_REQUESTS.labels(verb, outcome) for outcome in OUTCOMES}
    seconds = metrics.EXTENDER_REQUEST_SECONDS.labels(verb)

    async def handle(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        outcome = "error"
        try:
            body = httpserver.decode_json(await request.read())
            response = httpserver.json_response(decision(body))
            outcome = "ok"
        except BadRequest as exc:
            outcome = "bad_request"
            log.warning("bad extender request", extra={"verb": verb, "reason": str(exc)})
            response = httpserver.bad_request(f"{verb}: {exc}")
        except web.HTTPException:
            # e.g. 413 from aiohttp's body size limit: already an HTTP answer.
            outcome = "bad_request"
            raise
        except Exception:
            log.exception("extender call failed", extra={"verb": verb})
            response = web.Response(status=500, text=f"{verb}: internal error, see extender log")
        finally:
            seconds.observe(time.perf_counter() - started)
            counters[outcome].inc()
        return response

    return handle


def make_app() -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post("/filter", _instrumented("filter", _filter))
    app.router.add_post("/prioritize", _instrumented("prioritize", _prioritize))
    app.router.add_post("/preempt", _instrumented("preempt", _preempt))
    httpserver.add_common_routes(app)
    return app


async def serve(host: str, port: int) -> None:
    """Run the extender over plain HTTP until cancelled.

    Plain HTTP because the scheduler reaches it on localhost or inside the cluster network;
    the scheduler's extender config supports TLS if a deployment needs it later.
    """
    await httpserver.run_until_cancelled(make_app(), host, port, name="extender")
