"""The HTTPS face of the admission webhooks, called by kube-apiserver on every admission.

Each path maps to one pure review function; this module only checks the AdmissionReview
envelope, calls the review, builds the answer and records it. A bug in a review becomes
HTTP 500 rather than an invented decision, so the webhook's configured failurePolicy
decides: fail closed for tenant namespaces, and kube-system and Pilotfish's own namespace
are left out by the chart's namespaceSelector so a broken webhook cannot deadlock them.
"""

import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from aiohttp import web

from pilotfish import httpserver, metrics
from pilotfish.httpserver import BadRequest
from pilotfish.webhooks import pods, workloads
from pilotfish.webhooks.admission import Decision, build_response, parse_review

log = logging.getLogger(__name__)

# An UPDATE carries the object and the old object; a Pod may be up to ~1.5 MB in etcd.
MAX_BODY_BYTES: Final = 8 * 1024 * 1024

Review = Callable[[Mapping[str, Any]], Decision]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Path -> review. The path is also the `webhook` metric label and must match the chart's
# MutatingWebhookConfiguration / ValidatingWebhookConfiguration `clientConfig.service.path`.
REVIEWS: Final[Mapping[str, Review]] = {
    "/mutate/pods": pods.mutate,
    "/validate/pods": pods.validate,
    "/validate/workloads": workloads.validate,
}


def _review_handler(path: str, review: Review) -> Handler:
    seconds = metrics.WEBHOOK_REVIEW_SECONDS.labels(path)

    async def handle(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        operation = "unknown"
        outcome = "error"
        try:
            admission = parse_review(httpserver.decode_json(await request.read()))
            operation = admission["operation"]
            decision = review(admission)
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


def make_app(reviews: Mapping[str, Review] = REVIEWS) -> web.Application:
    """Build the app; `reviews` can be replaced to exercise the server with other rules."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    for path, review in reviews.items():
        app.router.add_post(path, _review_handler(path, review))
    httpserver.add_common_routes(app)
    return app


def server_ssl_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    """TLS 1.2+ server context; the API server refuses plain HTTP webhooks."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    return context


async def serve(host: str, port: int, certfile: str, keyfile: str) -> None:
    """Run the webhooks over HTTPS until cancelled.

    The certificate is read once at start; a rotated certificate takes effect on restart.
    """
    context = server_ssl_context(certfile, keyfile)
    await httpserver.run_until_cancelled(
        make_app(), host, port, name="webhooks", ssl_context=context
    )
