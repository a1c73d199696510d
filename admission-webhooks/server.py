"""The HTTPS face of the admission webhooks, called by kube-apiserver on every admission.

Each path maps to one pure review function; this module only checks the AdmissionReview
envelope, calls the review, builds the answer and records it. A bug in a review becomes
HTTP 500 rather than an invented decision, so the webhook's configured failurePolicy
decides: fail closed for tenant namespaces, and kube-system and Pilotfish's own namespace
are left out by the chart's namespaceSelector so a broken webhook cannot deadlock them.

It is also where the pure pod reviews meet their inputs: the GatePolicy snapshot of the
informer-backed cache and the clock. Until the cache has synced, pod reviews are refused
(`pods.starting`) and /readyz answers 503, so no pod is admitted without its gates.
"""

import asyncio
import inspect
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from aiohttp import web

from pilotfish import httpserver, metrics
from pilotfish.httpserver import BadRequest
from pilotfish.kube.client import api_client
from pilotfish.kube.rest import Rest
from pilotfish.timeutil import utcnow as utc_now
from pilotfish.webhooks import pods, workloads
from pilotfish.webhooks.admission import Decision, build_response, parse_review
from pilotfish.webhooks.gatecache import Clock, GatePolicyCache, StaticViews, ViewSource
from pilotfish.webhooks.gateview import GateView
from pilotfish.webhooks.teamview import TeamCache, TeamSnapshot, TeamSource

log = logging.getLogger(__name__)

# An UPDATE carries the object and the old object; a Pod may be up to ~1.5 MB in etcd.
MAX_BODY_BYTES: Final = 8 * 1024 * 1024

Review = Callable[[Mapping[str, Any]], Decision | Awaitable[Decision]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def bind_reviews(
    views: ViewSource,
    clock: Clock = utc_now,
    teams: TeamSource | None = None,
    scheduler_name: str | None = None,
) -> dict[str, Review]:
    """Path -> review, the pod reviews bound to their views, the clock and the reservation.

    The path is also the `webhook` metric label and must match the chart's
    MutatingWebhookConfiguration / ValidatingWebhookConfiguration `clientConfig.service.path`.
    `teams` None: no bands or quotas (tests and tools without a cluster).
    """

    def team_snapshot() -> TeamSnapshot | None:
        return TeamSnapshot() if teams is None else teams.snapshot()

    def mutate_pods(request: Mapping[str, Any]) -> Decision:
        view, team = views.snapshot(), team_snapshot()
        if view is None or team is None:
            return pods.starting()
        return pods.mutate(request, view, clock(), team, scheduler_name)

    async def validate_pods(request: Mapping[str, Any]) -> Decision:
        view, team = views.snapshot(), team_snapshot()
        if view is None or team is None:
            return pods.starting()
        checked = pods.validate(request, view, team)
        if not checked.allowed:
            return checked
        now = clock()
        verdict = pods.quota_verdict(request, team, now)
        if isinstance(verdict, Decision):
            return verdict
        assert teams is not None  # only a team view yields reservations
        refused = await teams.reserve(
            verdict.pod, verdict.namespace_labels, verdict.band, verdict.admit, now
        )
        return Decision.allow() if refused is None else Decision.deny(refused)

    return {
        "/mutate/pods": mutate_pods,
        "/validate/pods": validate_pods,
        "/validate/workloads": workloads.validate,
    }


# The reviews of a cluster without GatePolicies: what `make_app()` serves by default, for
# tests and tools. `serve` always binds the reviews to the live GatePolicy cache instead.
REVIEWS: Final[Mapping[str, Review]] = bind_reviews(StaticViews(GateView()))


def _review_handler(path: str, review: Review) -> Handler:
    seconds = metrics.WEBHOOK_REVIEW_SECONDS.labels(path)

    async def handle(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        operation = "unknown"
        outcome = "error"
        try:
            admission = parse_review(httpserver.decode_json(await request.read()))
            operation = admission["operation"]
            answered = review(admission)
            decision = await answered if inspect.isawaitable(answered) else answered
            outcome = decision.label
            answer = build_response(admission["uid"], decision)
            response = httpserver.json_response(httpserver.dumps(answer))
            if not decision.allowed:
                log.info(
                    "admission denied",
                    extra={
                        "webhook": path,
                        "uid": admission["uid"],
                        "operation": operation,
                        "namespace": admission.get("namespace", ""),
                        "object_name": admission.get("name", ""),
                        "reason": decision.message,
                    },
                )
        except BadRequest as exc:
            outcome = "invalid"
            log.warning("bad admission review", extra={"webhook": path, "reason": str(exc)})
            response = httpserver.bad_request(f"{path}: {exc}")
        except web.HTTPException:
            outcome = "invalid"  # e.g. 413 from the body size limit
            raise
        except Exception:
            log.exception("admission review failed", extra={"webhook": path})
            response = web.Response(status=500, text=f"{path}: internal error, see webhook log")
        finally:
            seconds.observe(time.perf_counter() - started)
            metrics.WEBHOOK_REVIEWS.labels(path, operation, outcome).inc()
        return response

    return handle


def _readyz(ready: Callable[[], bool]) -> Handler:
    async def handle(_request: web.Request) -> web.StreamResponse:
        if ready():
            return web.Response(text="ok")
        return web.Response(status=503, text="starting: GatePolicy view not synced")

    return handle


def make_app(
    reviews: Mapping[str, Review] = REVIEWS, ready: Callable[[], bool] = lambda: True
) -> web.Application:
    """Build the app; `reviews` can be replaced to exercise the server with other rules.

    /healthz is liveness (the process serves); /readyz is readiness (`ready()`: the views
    the reviews need have synced), for a readiness probe that keeps a starting replica out
    of the Service.
    """
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    for path, review in reviews.items():
        app.router.add_post(path, _review_handler(path, review))
    httpserver.add_common_routes(app)
    app.router.add_get("/readyz", _readyz(ready))
    return app


def server_ssl_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    """TLS 1.2+ server context; the API server refuses plain HTTP webhooks."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    return context


async def serve(
    host: str,
    port: int,
    certfile: str,
    keyfile: str,
    kubeconfig: str | None = None,
    *,
    views: ViewSource | None = None,
    clock: Clock = utc_now,
    scheduler_name: str | None = None,
) -> None:
    """Run the webhooks over HTTPS until cancelled.

    The API client comes from `kubeconfig`, else $KUBECONFIG, else the in-cluster
    ServiceAccount, and feeds the GatePolicy cache. `views` replaces the cache (no API
    server at all), for tests. The certificate is read once at start; a rotated certificate
    takes effect on restart.
    """
    context = server_ssl_context(certfile, keyfile)
    if views is not None:
        app = make_app(bind_reviews(views, clock))
        await httpserver.run_until_cancelled(app, host, port, name="webhooks", ssl_context=context)
        return
    api = await api_client(kubeconfig)
    try:
        rest = Rest(api)
        cache = GatePolicyCache.watching(rest)
        teams = TeamCache(rest)
        app = make_app(
            bind_reviews(cache, clock, teams, scheduler_name),
            ready=lambda: cache.synced() and teams.synced(),
        )
        await httpserver.run_together(
            "webhooks",
            httpserver.run_until_cancelled(app, host, port, name="webhooks", ssl_context=context),
            _watch(cache),
            teams.run(),
        )
    finally:
        await api.close()


async def _watch(cache: GatePolicyCache) -> None:
    started = time.monotonic()

    async def announce() -> None:
        await cache.informer.synced.wait()
        log.info(
            "GatePolicy view synced; admitting pods",
            extra={
                "policies": len(cache.informer.store),
                "seconds": round(time.monotonic() - started, 3),
            },
        )

    announcer = asyncio.create_task(announce())
    try:
        await cache.run()
    finally:
        announcer.cancel()
