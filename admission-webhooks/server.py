"""The HTTPS face of the admission webhooks, called by kube-apiserver on every admission.

Each path maps to one pure review function; this module only checks the AdmissionReview
(strictly: `admission.parse_review`), calls the review, builds the answer and records it.

Who may call: with `client_ca`, only a client presenting a certificate signed by that CA,
which is the API server's webhook client certificate (its AdmissionConfiguration
kubeConfigFile); anyone else is refused in the TLS handshake, so nobody else can post a
review, let alone one that reserves quota. /healthz, /readyz and /metrics are served on the
same port and, for kubelet probes and Prometheus, on an optional plain `health_port`.

What the answers mean:
- 200: a decision (allow, deny with the reason, or a patch).
- 400: the body is not an AdmissionReview the API server would send (bad JSON, nesting past
  `httpserver.MAX_JSON_DEPTH`, a field of the wrong type, a Pod in `object` whose fields
  Pilotfish reads have the wrong types); the reason names the field. 408: the body did not
  arrive in time; 413: it is larger than `MAX_BODY_BYTES`.
- 500: a bug in a review, met on input that passed every check above. It is logged with
  its traceback and counted (decision `error`), and the API server applies the webhook's
  failurePolicy: fail closed for tenant namespaces, while kube-system and Pilotfish's own
  namespace are left out by the chart's namespaceSelector so a broken webhook cannot
  deadlock them. It is an answer, not an invented decision. No input reaches it by design;
  tests/test_server_fuzz.py drives malformed bodies at every path to hold that.

It is also where the pure pod reviews meet their inputs: the GatePolicy snapshot of the
informer-backed cache and the clock. Until the cache has synced, pod reviews are refused
(`pods.starting`) and /readyz answers 503, so no pod is admitted without its gates.
"""

import asyncio
import inspect
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final

from aiohttp import web

from pilotfish import httpserver, metrics, names, tasks
from pilotfish.httpserver import BadRequest
from pilotfish.kube.client import api_client
from pilotfish.kube.factory import InformerFactory
from pilotfish.kube.rest import Rest
from pilotfish.timeutil import utcnow as utc_now
from pilotfish.webhooks import (
    createpace,
    pods,
    podupdate,
    quantities,
    reclaim,
    templates,
    tolerations,
    workloads,
)
from pilotfish.webhooks.admission import Decision, InvalidObject, build_response, parse_review
from pilotfish.webhooks.gatecache import Clock, GatePolicyCache, StaticViews, ViewSource
from pilotfish.webhooks.gateview import GateView
from pilotfish.webhooks.teamview import TeamCache, TeamSnapshot, TeamSource
from pilotfish.webhooks.tenancy import ForeignSchedulers

log = logging.getLogger(__name__)

# An UPDATE carries the object and the old object; a Pod may be up to ~1.5 MB in etcd.
MAX_BODY_BYTES: Final = 8 * 1024 * 1024
NOT_SYNCED: Final = "GatePolicy view not synced"

Review = Callable[[Mapping[str, Any]], Decision | Awaitable[Decision]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def bind_reviews(
    views: ViewSource,
    clock: Clock = utc_now,
    teams: TeamSource | None = None,
    scheduler_name: str | None = None,
    dry_run: templates.DryRun | None = None,
    *,
    foreign_schedulers: ForeignSchedulers = "refuse",
    eviction_wait: float = tolerations.DEFAULT_EVICTION_WAIT,
    reclaim_default: bool = False,
    pace: createpace.CreatePace | None = None,
) -> dict[str, Review]:
    """Path -> review, the pod reviews bound to their views, the clock and the reservation.

    The path is also the `webhook` metric label and must match the chart's
    MutatingWebhookConfiguration / ValidatingWebhookConfiguration `clientConfig.service.path`.
    `teams` None: no bands or quotas; `dry_run` None: workload templates go unchecked (tests
    and tools without a cluster); `pace` None: teams' pod creates are not paced.
    """

    def team_snapshot() -> TeamSnapshot | None:
        return TeamSnapshot() if teams is None else teams.snapshot()

    def judged(team: TeamSnapshot) -> TeamSnapshot | None:
        return None if teams is None else team  # None: teams and bands are not judged

    def mutate_pods(request: Mapping[str, Any]) -> Decision:
        view, team = views.snapshot(), team_snapshot()
        if view is None or team is None:
            return pods.starting()
        return pods.mutate(
            request,
            view,
            clock(),
            judged(team),
            scheduler_name,
            foreign_schedulers=foreign_schedulers,
            eviction_wait=eviction_wait,
            reclaim_default=reclaim_default,
        )

    writers = podupdate.Writers.from_env()
    own_user = names.service_account_user(podupdate.pilotfish_namespace(), names.SA_WEBHOOKS)

    async def validate_pods(request: Mapping[str, Any]) -> Decision:
        if podupdate.is_pod_update(request):
            return podupdate.review(request, writers)  # needs no view: never "starting"
        not_dry = templates.dry_run_only(request, own_user)
        if not_dry is not None:
            return not_dry
        view, team = views.snapshot(), team_snapshot()
        if view is None or team is None:
            return pods.starting()
        checked = pods.validate(request, view, judged(team), scheduler_name)
        if not checked.allowed or templates.is_template_check(request):
            return checked  # a template's dry run is not charged: see `templates`
        now = clock()
        verdict = pods.quota_verdict(request, judged(team), now)
        if isinstance(verdict, Decision) and not verdict.allowed:
            return verdict
        if pace is not None:  # last: a create the rules refuse takes no turn of the pace
            namespace = str(request.get("namespace") or "")
            paced = await pace.admit(request, team.labels_of(namespace))
            if paced is not None:
                return paced
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
        "/validate/workloads": lambda request: workloads.validate(request, dry_run),
        "/validate/teamquotas": quantities.validate_teamquota,
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
            admission = parse_review(httpserver.decode_json(await httpserver.read_body(request)))
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
        except InvalidObject as exc:
            outcome = "invalid"
            log.info("admission denied", extra={"webhook": path, "reason": str(exc)})
            denial = Decision.deny(f"{exc}", code=400, reason="BadRequest")
            response = httpserver.json_response(httpserver.dumps(build_response(exc.uid, denial)))
        except BadRequest as exc:
            outcome = "invalid"
            log.warning("bad admission review", extra={"webhook": path, "reason": str(exc)})
            response = httpserver.bad_request(f"{path}: {exc}")
        except web.HTTPException as exc:
            outcome = "invalid"  # 413 from the body size limit, 408 from the body deadline
            log.warning("bad admission review", extra={"webhook": path, "reason": exc.text})
            raise
        except Exception:
            log.exception("admission review failed", extra={"webhook": path})
            response = web.Response(status=500, text=f"{path}: internal error, see webhook log")
        finally:
            seconds.observe(time.perf_counter() - started)
            metrics.WEBHOOK_REVIEWS.labels(path, operation, outcome).inc()
        return response

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
    app.router.add_get("/readyz", httpserver.readyz(ready, NOT_SYNCED))
    return app


def server_ssl_context(certfile: str, keyfile: str, client_ca: str | None = None) -> ssl.SSLContext:
    """TLS 1.2+ (the API server refuses plain HTTP webhooks); mutual with `client_ca`."""
    return httpserver.server_tls(certfile, keyfile, client_ca)


async def serve(
    host: str,
    port: int,
    certfile: str,
    keyfile: str,
    kubeconfig: str | None = None,
    *,
    client_ca: str | None = None,
    health_port: int | None = None,
    views: ViewSource | None = None,
    clock: Clock = utc_now,
    scheduler_name: str | None = None,
    foreign_schedulers: ForeignSchedulers = "refuse",
    eviction_wait: float | None = None,
    reclaim_default: bool | None = None,
    pace: createpace.CreatePace | None = None,
) -> None:
    """Run the webhooks over HTTPS until cancelled.

    The API client comes from `kubeconfig`, else $KUBECONFIG, else the in-cluster
    ServiceAccount, and feeds the GatePolicy cache. `views` replaces the cache (no API
    server at all), for tests. `client_ca`: require callers' certificates signed by it.
    `health_port`: also serve /healthz, /readyz and /metrics over plain HTTP there. The
    certificates are read once at start; a rotated certificate takes effect on restart.
    `eviction_wait` None: PILOTFISH_EVICTION_WAIT_SECONDS, and `reclaim_default` None:
    PILOTFISH_RECLAIM, and `pace` None: PILOTFISH_TEAM_POD_CREATES_* (`createpace`), read
    once here (a bad value raises ValueError naming it, before anything is served).
    """
    if eviction_wait is None:
        eviction_wait = tolerations.eviction_wait_from_env()
    if reclaim_default is None:
        reclaim_default = reclaim.default_from_env()  # ValueError naming PILOTFISH_RECLAIM
    if pace is None:
        pace = createpace.CreatePace.from_env(podupdate.pilotfish_namespace())
    context = server_ssl_context(certfile, keyfile, client_ca)
    if client_ca is None:
        log.warning(
            "no client CA: any client that reaches the port can post admission reviews",
            extra={"component": "webhooks"},
        )
    if views is not None:
        app = make_app(
            bind_reviews(views, clock, eviction_wait=eviction_wait, reclaim_default=reclaim_default)
        )
        await tasks.run_guarded(
            {
                "webhooks": httpserver.run_until_cancelled(
                    app, host, port, name="webhooks", ssl_context=context
                ),
                **_health(host, health_port, lambda: True),
            }
        )
    api = await api_client(kubeconfig)
    try:
        rest = Rest(api)
        factory = InformerFactory(rest)
        cache = GatePolicyCache.watching(factory)
        teams = TeamCache(factory)

        def ready() -> bool:
            return cache.synced() and teams.synced()

        app = make_app(
            bind_reviews(
                cache,
                clock,
                teams,
                scheduler_name,
                templates.dry_run_with(rest),
                foreign_schedulers=foreign_schedulers,
                eviction_wait=eviction_wait,
                reclaim_default=reclaim_default,
                pace=pace,
            ),
            ready=ready,
        )
        await tasks.run_guarded(
            {
                "webhooks": httpserver.run_until_cancelled(
                    app, host, port, name="webhooks", ssl_context=context
                ),
                **_health(host, health_port, ready),
                "informers": factory.run(),
                "announce": _announce(factory, cache),
            }
        )
    finally:
        await api.close()


def _health(
    host: str, port: int | None, ready: Callable[[], bool]
) -> dict[str, Coroutine[Any, Any, None]]:
    if port is None:
        return {}
    app = httpserver.health_app(ready, NOT_SYNCED)
    return {"health": httpserver.run_until_cancelled(app, host, port, name="webhooks-health")}


async def _announce(factory: InformerFactory, cache: GatePolicyCache) -> None:
    """Log once the views have listed (from then on pods are admitted); then stay, as every
    guarded task does."""
    started = time.monotonic()
    await factory.wait_synced()
    log.info(
        "GatePolicy and team views synced; admitting pods",
        extra={
            "policies": len(cache.informer.store),
            "seconds": round(time.monotonic() - started, 3),
        },
    )
    await asyncio.Event().wait()
