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
EXTENDER_SNAPSHOT_SYNCED = Gauge(
    "pilotfish_extender_snapshot_synced",
    "1 once the extender's node and pod snapshot has listed everything; until then filter "
    "answers an error and kube-scheduler (ignorable) places pods without the extender.",
)
EXTENDER_SNAPSHOT_NODES = Gauge(
    "pilotfish_extender_snapshot_nodes",
    "Nodes in the extender's snapshot (including nodes only known from their pods).",
)
EXTENDER_SNAPSHOT_PODS = Gauge(
    "pilotfish_extender_snapshot_pods",
    "Bound, unfinished pods in the extender's snapshot.",
)
EXTENDER_ASSUMED_PODS = Gauge(
    "pilotfish_extender_assumed_pods",
    "Pods scored but not yet seen bound, counted on their best-scored node.",
)
EXTENDER_REJECTED_NODES = Counter(
    "pilotfish_extender_rejected_nodes_total",
    "Candidate nodes the extender's filter rejected, by cause.",
    ["cause"],
)
EXTENDER_PREEMPTION_VETOES = Counter(
    "pilotfish_extender_preemption_vetoes_total",
    "Preemption candidate nodes dropped by the extender, by cause (a production victim, or "
    "a victim the snapshot does not know yet).",
    ["cause"],
)

WEBHOOK_REVIEWS = Counter(
    "pilotfish_webhooks_reviews_total",
    "Admission reviews answered, by webhook path, operation and decision.",
    ["webhook", "operation", "decision"],
)
WEBHOOK_REVIEW_SECONDS = Histogram(
    "pilotfish_webhooks_review_duration_seconds",
    "Time to answer one admission review, by webhook path; a paced pod create's hold is "
    "included (alone in pilotfish_webhooks_pod_create_hold_seconds).",
    ["webhook"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)

WEBHOOK_QUOTA_CONFLICTS = Counter(
    "pilotfish_webhooks_quota_reservation_conflicts_total",
    "TeamQuota reservations that lost a race to another admission and were decided again.",
)
WEBHOOK_POD_CREATE_HOLD_SECONDS = Histogram(
    "pilotfish_webhooks_pod_create_hold_seconds",
    "How long admission held a tenant's pod create for its team's pace (0: a token was there).",
    buckets=(0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0),
)
WEBHOOK_POD_CREATES_THROTTLED = Counter(
    "pilotfish_webhooks_pod_creates_throttled_total",
    "Tenants' pod creates refused with 429 because their team's pace allowed none for longer "
    "than a create may be held.",
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

OPERATOR_RETRIES = Counter(
    "pilotfish_operator_retries_total",
    "Keys a work queue backed off (a RETRY result or an exception), by queue.",
    ["controller"],
)

OPERATOR_QUEUE_DEPTH = Gauge(
    "pilotfish_operator_queue_depth",
    "Keys waiting in a controller's work queue, by queue.",
    ["controller"],
)

OWN_WRITES_EXPIRED = Counter(
    "pilotfish_operator_own_writes_expired_total",
    "Own writes whose resourceVersion the informer never showed within the tracker's TTL "
    "(the controller then trusts its cache again), by controller.",
    ["controller"],
)
OWN_WRITES_VISIBLE = Histogram(
    "pilotfish_operator_own_writes_visible_seconds",
    "From an own write returning to the controller's informer showing it (the API server's "
    "watch delay as the controller feels it), by controller.",
    ["controller"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)

INFORMER_OBJECTS = Gauge(
    "pilotfish_informer_objects",
    "Objects held by a shared informer, by resource and selector.",
    ["resource", "selector"],
)

OPERATOR_LEADER = Gauge(
    "pilotfish_operator_leader",
    "1 while this operator process holds the leader lease, else 0.",
)

EVENTS_QUEUED = Gauge(
    "pilotfish_events_queued",
    "Events posted and not yet written: the one Event writer's backlog (bounded; beyond it "
    "Events are dropped and counted in pilotfish_events_total).",
)

EVENTS = Counter(
    "pilotfish_events_total",
    "events.k8s.io Events by reporting controller, reason and outcome (created, series, "
    "pending: counted into a series written later, dropped: spam filter, failed).",
    ["controller", "reason", "outcome"],
)

# The gate controller (operators/gates). Gate names are label values: they are few (each
# comes from a GatePolicy) and they name the unmet condition, never data.
GATES_GATED_PODS = Gauge(
    "pilotfish_gates_gated_pods",
    "Live pods still holding a Pilotfish scheduling gate, by gate and namespace.",
    ["gate", "namespace"],
)
GATES_OLDEST_GATED_AGE = Gauge(
    "pilotfish_gates_oldest_gated_age_seconds",
    "Age of the oldest live pod still holding the gate, by gate and namespace: the "
    "silent-stall alarm (compare with pilotfish_gates_timeout_seconds).",
    ["gate", "namespace"],
)
GATES_TIMEOUT = Gauge(
    "pilotfish_gates_timeout_seconds",
    "The longest timeout a live pod holding the gate was given, by gate and namespace.",
    ["gate", "namespace"],
)
GATES_RELEASE_AGE = Histogram(
    "pilotfish_gates_release_age_seconds",
    "How long a pod held a gate when the gate was removed, by gate.",
    ["gate"],
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600),
)
GATES_RELEASES = Counter(
    "pilotfish_gates_releases_total",
    "Gates removed because their condition held, by gate and namespace.",
    ["gate", "namespace"],
)
GATES_EXPIRATIONS = Counter(
    "pilotfish_gates_expirations_total",
    "Gates that reached their deadline unmet, by gate and expiry action (Fail, Retry, Review).",
    ["gate", "action"],
)
GATES_PENDING_WRITES = Gauge(
    "pilotfish_gates_pending_writes",
    "Writes the current decision round has decided and not applied yet.",
)
GATES_IN_FLIGHT = Gauge(
    "pilotfish_gates_in_flight_pods",
    "Pods released from their gates but not yet bound to a node, by namespace (tenant).",
    ["namespace"],
)
GATES_ROUND_SECONDS = Histogram(
    "pilotfish_gates_round_duration_seconds",
    "Time of one decision round of the gate controller: observe, decide and act.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)

ENDPOINTS_SLICE_WRITES = Counter(
    "pilotfish_endpoints_slice_writes_total",
    "EndpointSlice writes that succeeded, by verb (create, update, delete).",
    ["verb"],
)
ENDPOINTS = Gauge(
    "pilotfish_endpoints_endpoints",
    "Endpoints in Pilotfish-managed EndpointSlices, by whether they are ready.",
    ["ready"],
)
ENDPOINTS_SYNC_SECONDS = Histogram(
    "pilotfish_endpoints_sync_latency_seconds",
    "Time from a pod change being seen to the slice that shows it being written "
    "(includes the coalescing delay under churn).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0),
)
ENDPOINTS_DRAINED = Counter(
    "pilotfish_endpoints_drained_total",
    "Draining pods marked drained-at after the slice write that took them out of rotation.",
)

# The ServiceWorkload rollout controller (operators/serviceworkload).
ROLLOUT_SYNC_SECONDS = Histogram(
    "pilotfish_rollout_sync_duration_seconds",
    "Time of one ServiceWorkload sync: observe, plan, act and write status.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
ROLLOUT_POD_ACTIONS = Counter(
    "pilotfish_rollout_pod_actions_total",
    "Pod actions the rollout controller applied, by action (create, drain, delete) and "
    "outcome (ok, failed).",
    ["action", "outcome"],
)
ROLLOUT_WORKLOADS = Gauge(
    "pilotfish_rollout_workloads",
    "ServiceWorkloads by rollout state (complete, progressing, paused, stalled).",
    ["state"],
)
ROLLOUT_EXPECTED_WRITES = Gauge(
    "pilotfish_rollout_expected_writes",
    "The rollout controller's own writes not yet seen by its informers (expectations).",
)

# The BatchWorkload controller (operators/batchworkload).
BATCH_SYNC_SECONDS = Histogram(
    "pilotfish_batch_sync_duration_seconds",
    "Time of one BatchWorkload sync: observe, decide, write status, remove, create.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
BATCH_PODS_CREATED = Counter(
    "pilotfish_batch_pods_created_total",
    "Task pod creates by outcome (ok, refused).",
    ["outcome"],
)
BATCH_POD_WRITES = Counter(
    "pilotfish_batch_pod_writes_total",
    "Task pod writes other than creates, by kind (unfinalize, delete).",
    ["kind"],
)
BATCH_HELD_FOR_PRODUCTION = Gauge(
    "pilotfish_batch_held_for_production",
    "Production pods waiting for placement while they hold every BatchWorkload's pod "
    "creation (0: batch is not held).",
)
BATCH_UNBOUND_PODS = Gauge(
    "pilotfish_batch_unbound_pods",
    "Task pods created and not yet bound to a node, over every BatchWorkload (the paced "
    "in-flight count).",
)

# The node lifecycle controller (operators/nodelifecycle): lease silence, eviction, brake.
NODELIFECYCLE_UNREACHABLE_NODES = Gauge(
    "pilotfish_nodelifecycle_unreachable_nodes",
    "Nodes whose lease this operator has not seen renewed for the unreachable timeout.",
)
NODELIFECYCLE_EVICTIONS = Counter(
    "pilotfish_nodelifecycle_evictions_total",
    "Pods evicted (marked DisruptionTarget and deleted) from lost nodes, by reason.",
    ["reason"],
)
NODELIFECYCLE_ZONE_BRAKE = Gauge(
    "pilotfish_nodelifecycle_zone_brake",
    "1 while the zone brake holds a zone (a partition-sized silence: no mass eviction, its "
    "pods keep Ready), else 0.",
    ["zone"],
)
NODELIFECYCLE_SILENT_NODES = Gauge(
    "pilotfish_nodelifecycle_silent_nodes",
    "Unreachable nodes (lease silent for the unreachable timeout) per zone.",
    ["zone"],
)

# The ServiceWorkload controller's at-most-one release (operators/serviceworkload/atmostone).
SW_AT_MOST_ONE_WAITING = Gauge(
    "pilotfish_serviceworkload_at_most_one_waiting",
    "At-most-one identities whose pod is on a silent node, waiting for its lease to surely "
    "expire before a replacement starts.",
)

# Planned maintenance (operators/maintenance): drains of NodeMaintenances.
MAINTENANCE_NODES = Gauge(
    "pilotfish_maintenance_nodes",
    "Nodes of every NodeMaintenance by drain state (Pending, Cordoned, Draining, Drained, Failed).",
    ["state"],
)
MAINTENANCE_EVICTIONS = Counter(
    "pilotfish_maintenance_evictions_total",
    "Evictions requested by planned maintenance, by result: evicted, refused (429: a "
    "disruption budget said not now) or error.",
    ["result"],
)
MAINTENANCE_BLOCKED_NODES = Gauge(
    "pilotfish_maintenance_blocked_nodes",
    "Draining nodes that have gone blockedAfterSeconds without a pod evicted while a budget, "
    "a surge, local storage or a refused eviction holds them.",
)

# Reclaim (operators/reclaim): batch capacity on what production reserved but does not use.
RECLAIM_BATCH_CORES = Gauge(
    "pilotfish_reclaim_batch_allocatable_cores",
    "The batch.pilotfish.io/cpu allocatable each node carries, in cores.",
    ["node"],
)
RECLAIM_BATCH_BYTES = Gauge(
    "pilotfish_reclaim_batch_allocatable_bytes",
    "The batch.pilotfish.io/memory allocatable each node carries, in bytes.",
    ["node"],
)
RECLAIM_RECLAIMED_CORES = Gauge(
    "pilotfish_reclaim_reclaimed_cores",
    "Cores of each node's batch allocatable that production reserved but does not use (p95).",
    ["node"],
)
RECLAIM_RECLAIMED_BYTES = Gauge(
    "pilotfish_reclaim_reclaimed_bytes",
    "Bytes of each node's batch allocatable that production reserved but does not use (p95).",
    ["node"],
)
RECLAIM_EVICTIONS = Counter(
    "pilotfish_reclaim_evictions_total",
    "Batch pods evicted to give reclaimed capacity back, by result: evicted, refused (429: a "
    "disruption budget said not now; tried next cycle), gone or error.",
    ["result"],
)
RECLAIM_STALE_NODES = Gauge(
    "pilotfish_reclaim_stale_nodes",
    "Nodes whose batch allocatable is decaying toward 0: usage data stale or Prometheus down.",
)
RECLAIM_PRODUCTION_OVER_REQUEST = Gauge(
    "pilotfish_reclaim_production_over_request_pods",
    "Production pods whose p95 usage exceeds their request, on nodes hosting batch pods.",
)
RECLAIM_CYCLE_SECONDS = Histogram(
    "pilotfish_reclaim_cycle_seconds",
    "Time of one reclaim cycle: the PromQL queries, every node's figure and evictions.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
RECLAIM_PROMETHEUS_ERRORS = Counter(
    "pilotfish_reclaim_prometheus_errors_total",
    "Reclaim cycles whose PromQL queries failed (every node's figure then decays).",
)

# TeamQuotas (operators/quota): what each team's band holds (used + reserved) and its limits.
QUOTA_HELD = Gauge(
    "pilotfish_quota_held",
    "What a team's band holds (used plus reserved), by team, band and resource (cpu in "
    "cores, memory in bytes, pods, gpus, extended resources in units).",
    ["team", "band", "resource"],
)
QUOTA_LIMIT = Gauge(
    "pilotfish_quota_limit",
    "A team's band limit, by team, band and resource (only limited resources).",
    ["team", "band", "resource"],
)

# Placement (operators/schedulinglatency): creation to bound, by band.
SCHEDULING_LATENCY = Histogram(
    "pilotfish_scheduling_latency_seconds",
    "Time from a pod's creation to its binding (PodScheduled True), by the band it was "
    "admitted in (none: outside Pilotfish); includes time held by scheduling gates.",
    ["band"],
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
