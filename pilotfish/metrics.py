"""Every Prometheus metric Pilotfish exports, named `pilotfish_<component>_<what>_<unit>`.

One module so names stay consistent and a dashboard author has one place to read. Each
component process serves the default registry on its /metrics endpoint.
"""

from prometheus_client import Counter, Gauge, Histogram

EXTENDER_REQUESTS = Counter(
    "pilotfish_extender_requests_total",
    "Scheduler extender calls received, by verb and outcome.",
    ["verb", "outcome"],
)
EXTENDER_REQUEST_SECONDS = Histogram(
    "pilotfish_extender_request_duration_seconds",
    "Time to answer one scheduler extender call, by verb.",
    ["verb"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)

WEBHOOK_REVIEWS = Counter(
    "pilotfish_webhooks_reviews_total",
    "Admission reviews answered, by webhook path, operation and decision.",
    ["webhook", "operation", "decision"],
)
WEBHOOK_REVIEW_SECONDS = Histogram(
    "pilotfish_webhooks_review_duration_seconds",
    "Time to answer one admission review, by webhook path.",
    ["webhook"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)

OPERATOR_RECONCILE_ERRORS = Counter(
    "pilotfish_operator_reconcile_errors_total",
    "Reconcile attempts that failed and were requeued, by controller.",
    ["controller"],
)

OPERATOR_CONFLICTS = Counter(
    "pilotfish_operator_write_conflicts_total",
    "Conditional writes refused because the object changed since it was read, by controller.",
    ["controller"],
)

OPERATOR_LEADER = Gauge(
    "pilotfish_operator_leader",
    "1 while this operator process holds the leader lease, else 0.",
)
