"""The HTTP face of the scheduler extender: kube-scheduler calls it on every placement.

The scheduler waits for each call synchronously inside its scheduling cycle (a public
measurement saw throughput fall from ~991 to ~111 pods/s at 500 nodes behind a slow
extender), so a handler here only parses, calls a pure function in `decide` against the
in-memory snapshot and encodes. It reads the raw body and uses `json.loads` directly, skips
aiohttp's access log, and binds its metric children once when the app is built so a call
does not look labels up.

When the extender is down, or its snapshot has not synced yet
----------------------------------------------------------------
Only kube-scheduler calls it: over HTTPS, presenting a client certificate signed by the CA
given with `--client-ca` (pilotfish/devcluster/components.py and the chart configure the
extender's tlsConfig); any other client is refused in the TLS handshake. Malformed bodies
get 400 naming the field (`wire`), slow ones are cut off (`pilotfish.httpserver`).

The scheduler configuration (pilotfish/devcluster/components.py and the chart) sets
`ignorable: true`. Until both informers have listed everything, filter and prioritize answer
HTTP 503 (outcome `unavailable`); a killed or unreachable extender fails the connection. In
both cases kube-scheduler logs the error, skips the extender for that pod and goes on with
its own plugins, so:
- scheduling continues: no pod in the cluster waits on the extender;
- what is lost while it is away: production spreading over zones and workload replicas,
  batch packing, the machine-class and batch-capacity checks and the zone-grouped pending
  messages; the scheduler's own plugins (resource fit including GPUs, affinity, taints)
  still hold;
- preemption stays safe by priority: production's PriorityClass (1,000,000) is above batch
  (100,000) and best-effort (1,000), and kube-scheduler never evicts a pod of equal or
  higher priority, so batch cannot preempt production and production cannot preempt
  production. What the extender adds on top, refusing to evict a pod whose *label* says
  production while its priority is lower, is lost while it is down;
- before the snapshot syncs, preempt answers "no candidates" (HTTP 200, empty) rather than
  an error: an error would make the scheduler preempt without the production veto.
Coming back needs nothing: the extender lists nodes and pods again and answers as soon as
it has synced; bindings are made by the scheduler alone, so no pod is bound twice.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final

import uvloop
from aiohttp import web

from pilotfish import draining, httpserver, metrics, tasks
from pilotfish.extender import decide, reasons, wire
from pilotfish.extender.feed import SnapshotFeed
from pilotfish.extender.snapshot import Snapshot
from pilotfish.httpserver import BadRequest
from pilotfish.kube.client import api_client
from pilotfish.kube.factory import InformerFactory
from pilotfish.kube.rest import Rest

log = logging.getLogger(__name__)

# Enough for NodeNames of 10,000 nodes with room to spare, and for the full-Node and
# full-victim-Pod forms the scheduler sends when nodeCacheCapable is false.
MAX_BODY_BYTES: Final = 64 * 1024 * 1024

OUTCOMES: Final = ("ok", "bad_request", "unavailable", "error")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_Decision = Callable[[Any], bytes]
Clock = Callable[[], float]


class Unavailable(Exception):
    """The extender cannot judge yet (snapshot not synced).

    With `answer` set, that answer goes out with HTTP 200 (a safe default, e.g. "preempt
    nobody"); without, the call fails with 503 and an ignorable extender is skipped.
    """

    def __init__(self, message: str, answer: bytes | None = None) -> None:
        super().__init__(message)
        self.answer = answer


NOT_SYNCED: Final = "node and pod snapshot not synced yet"


class Extender:
    """The three verbs over one snapshot; `clock` dates assumed placements (monotonic)."""

    def __init__(self, snapshot: Snapshot, clock: Clock = time.monotonic) -> None:
        self.snapshot = snapshot
        self.clock = clock
        self._rejected = {c: metrics.EXTENDER_REJECTED_NODES.labels(c) for c in reasons.CAUSES}
        self._vetoes = {
            c: metrics.EXTENDER_PREEMPTION_VETOES.labels(c)
            for c in (decide.VETO_PRODUCTION, decide.VETO_UNKNOWN)
        }

    def filter(self, body: Any) -> bytes:
        args = wire.parse_extender_args(body)
        if not self.snapshot.synced:
            raise Unavailable(NOT_SYNCED)
        result = decide.filter_nodes(decide.incoming(args.pod), self.snapshot, args.node_names)
        for cause, count in result.causes.items():
            self._rejected[cause].inc(count)
        return wire.encode_filter_result(args, result.passing, result.failed, result.unresolvable)

    def prioritize(self, body: Any) -> bytes:
        args = wire.parse_extender_args(body)
        snap = self.snapshot
        if not snap.synced:
            raise Unavailable(NOT_SYNCED)
        now = self.clock()
        snap.expire(now)
        pod = decide.incoming(args.pod)
        # The pod's own earlier assumption (a retry) must not count against its own spread.
        snap.forget(pod.uid)
        scores = decide.score_nodes(pod, snap, args.node_names)
        if scores.best is not None:
            snap.assume(
                pod.uid,
                scores.best,
                pod.workload,
                pod.cpu,
                pod.memory,
                now,
                batch_cpu=pod.batch_cpu,
                batch_memory=pod.batch_memory,
            )
        return wire.encode_host_priorities(args.node_names, scores.scores)

    def preempt(self, body: Any) -> bytes:
        args = wire.parse_preemption_args(body)
        if not self.snapshot.synced:
            raise Unavailable(NOT_SYNCED, wire.encode_preemption_result({}))
        result = decide.choose_victims(self.snapshot, args.victims)
        for node, cause in result.vetoed.items():
            self._vetoes[cause].inc()
            log.info(
                "preemption candidate vetoed",
                extra={"node": node, "cause": cause, "pod": _pod_name(args.pod)},
            )
        return wire.encode_preemption_result(result.victims)


def _pod_name(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _instrumented(verb: str, decision: _Decision) -> Handler:
    """Wrap a body-to-answer function with parsing, error mapping, counting and timing.

    Outcomes: `ok`; `bad_request` for input that can never succeed (HTTP 400, the
    scheduler records an extender error); `unavailable` while the snapshot has not synced
    (503, or a safe 200 answer); `error` for a bug here (HTTP 500), logged with its
    traceback since nothing else would show it.
    """
    counters = {outcome: metrics.EXTENDER_REQUESTS.labels(verb, outcome) for outcome in OUTCOMES}
    seconds = metrics.EXTENDER_REQUEST_SECONDS.labels(verb)

    async def handle(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        outcome = "error"
        try:
            body = httpserver.decode_json(await httpserver.read_body(request))
            response = httpserver.json_response(decision(body))
            outcome = "ok"
        except BadRequest as exc:
            outcome = "bad_request"
            log.warning("bad extender request", extra={"verb": verb, "reason": str(exc)})
            response = httpserver.bad_request(f"{verb}: {exc}")
        except Unavailable as exc:
            outcome = "unavailable"
            if exc.answer is not None:
                response = httpserver.json_response(exc.answer)
            else:
                response = web.Response(status=503, text=f"{verb}: {exc}")
        except web.HTTPException as exc:
            # 413 from aiohttp's body size limit, 408 from the body deadline.
            outcome = "bad_request"
            log.warning("bad extender request", extra={"verb": verb, "reason": exc.text})
            raise
        except Exception:
            log.exception("extender call failed", extra={"verb": verb})
            response = web.Response(status=500, text=f"{verb}: internal error, see extender log")
        finally:
            seconds.observe(time.perf_counter() - started)
            counters[outcome].inc()
        return response

    return handle


def make_app(extender: Extender) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post("/filter", _instrumented("filter", extender.filter))
    app.router.add_post("/prioritize", _instrumented("prioritize", extender.prioritize))
    app.router.add_post("/preempt", _instrumented("preempt", extender.preempt))

    # Ready once the snapshot has synced: before that every call is skipped.
    app.router.add_get("/readyz", httpserver.readyz(lambda: extender.snapshot.synced, NOT_SYNCED))
    httpserver.add_common_routes(app)
    return app


@dataclass(frozen=True)
class Tls:
    """The serving certificate and, to require callers' certificates, the CA that signs
    them (kube-scheduler's extender tlsConfig certFile/keyFile)."""

    certfile: str
    keyfile: str
    client_ca: str | None = None

    def context(self) -> ssl.SSLContext:
        return httpserver.server_tls(self.certfile, self.keyfile, self.client_ca)


async def serve_snapshot(
    host: str,
    port: int,
    snapshot: Snapshot,
    feed: Coroutine[Any, Any, None] | None = None,
    *,
    tls: Tls | None = None,
    health_port: int | None = None,
) -> None:
    """Serve the verbs over `snapshot` while `feed` (the informers) keeps it current.

    The HTTP server starts at once, so /healthz answers while the snapshot lists; if the
    feed ever stops (it retries internally, so only a bug ends it), the process stops too
    rather than answer from a view that no longer moves. `health_port`: also serve
    /healthz, /readyz and /metrics over plain HTTP there, for kubelet probes and Prometheus,
    which cannot present a client certificate.
    """
    if tls is None or tls.client_ca is None:
        log.warning(
            "extender without client certificates: any client that reaches the port can call it",
            extra={"component": "extender", "tls": tls is not None},
        )
    parts: dict[str, Coroutine[Any, Any, None]] = {
        "extender": httpserver.run_until_cancelled(
            make_app(Extender(snapshot)),
            host,
            port,
            name="extender",
            ssl_context=tls.context() if tls is not None else None,
        )
    }
    if health_port is not None:
        health = httpserver.health_app(lambda: snapshot.synced, NOT_SYNCED)
        parts["extender-health"] = httpserver.run_until_cancelled(
            health, host, health_port, name="extender-health"
        )
    if feed is not None:
        parts["snapshot feed"] = feed
    await tasks.run_guarded(parts)


async def serve(
    host: str,
    port: int,
    kubeconfig: str | None = None,
    *,
    tls: Tls | None = None,
    health_port: int | None = None,
) -> None:
    """Run the extender until cancelled, its snapshot fed by informers.

    Over HTTPS with `tls` (kube-scheduler's extender `urlPrefix: https://...` with a
    `tlsConfig`), and then, with a client CA, only for callers presenting a certificate it
    signed: the placement verbs and the assumptions prioritize records are the scheduler's
    alone. The API client comes from `kubeconfig`, else $KUBECONFIG, else the in-cluster
    ServiceAccount.
    """
    api = await api_client(kubeconfig)
    try:
        snapshot = Snapshot()
        await serve_snapshot(
            host,
            port,
            snapshot,
            SnapshotFeed(InformerFactory(Rest(api)), snapshot).run(),
            tls=tls,
            health_port=health_port,
        )
    finally:
        await api.close()


def run(
    host: str,
    port: int,
    kubeconfig: str | None = None,
    *,
    tls: Tls | None = None,
    health_port: int | None = None,
    drain_seconds: float = draining.DRAIN_SECONDS,
) -> None:
    """`serve` on uvloop, draining for `drain_seconds` on SIGTERM (`pilotfish.draining`).

    kube-scheduler waits on every call, and profiled under its real call pattern
    (benchmarks/extender_overhead) the event loop, TLS and aiohttp around a call cost about
    twice the handler itself; uvloop's loop and TLS (libuv, Cython) took the extender's CPU
    per placed pod for its calls from ~2.0 ms to ~1.7 ms there."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        served = serve(host, port, kubeconfig, tls=tls, health_port=health_port)
        runner.run(
            draining.serve_until_terminated(served, name="extender", drain_seconds=drain_seconds)
        )
