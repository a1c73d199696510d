"""Keys shared by the workload controllers, the endpoints controller and the drain path.

A pod leaves a service in three steps so no request is sent to a stopping pod:
1. its owner (rollout, scale-down, maintenance) marks it with ANNOTATION_DRAIN (the time);
2. the endpoints controller writes the pod's endpoint as not ready, terminating, and once that
   slice write has succeeded records ANNOTATION_DRAINED on the pod (the time it was written);
3. the owner deletes the pod with its grace period once ANNOTATION_DRAINED is at least
   PROPAGATION_SECONDS old (time for proxies to see the slice), or once the drain has waited
   DRAIN_TIMEOUT_SECONDS without an answer (the endpoints controller may be down: a service
   must still be able to roll out, and the pod is not ready in any slice it is in by then).
Both annotations are written with conditional patches; deleting a pod is idempotent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pilotfish import names

# Labels on every pod of a ServiceWorkload.
LABEL_WORKLOAD: Final = "pilotfish.io/workload"  # the ServiceWorkload's name
LABEL_REVISION: Final = "pilotfish.io/revision"  # hash of the pod template (ControllerRevision)

# Labels, annotation, env var and finalizer of a BatchWorkload's task pods.
LABEL_BATCH: Final = "pilotfish.io/batchworkload"  # the BatchWorkload's name
LABEL_TASK_INDEX: Final = "pilotfish.io/task-index"  # the task's index, 0 .. completions-1
ANNOTATION_TASK_ATTEMPT: Final = "pilotfish.io/task-attempt"  # 0 for an index's first pod
# The index's failures before this pod (the built-in Job's `job-index-failure-count`).
ANNOTATION_TASK_FAILURES: Final = "pilotfish.io/task-failures"
ENV_TASK_INDEX: Final = "PILOTFISH_TASK_INDEX"
ENV_COMPLETION_INDEX: Final = "JOB_COMPLETION_INDEX"  # what indexed Jobs' programs read
# Held on a task pod until its outcome is recorded in the BatchWorkload's status, so a pod
# deleted by anyone else is never a lost result.
FINALIZER_TASK: Final = "pilotfish.io/batch-tracking"

ANNOTATION_DRAIN: Final = "pilotfish.io/drain-requested-at"
ANNOTATION_DRAINED: Final = "pilotfish.io/drained-at"

# How long after the slice write a draining pod may be stopped (seeds: endpoint change to
# every proxy < 5 s; kube-proxy's default sync period is 1 s).
PROPAGATION_SECONDS: Final = 2.0
# How long an owner waits for the endpoints controller before stopping the pod anyway.
DRAIN_TIMEOUT_SECONDS: Final = 30.0

ENDPOINTSLICE_MANAGED_BY: Final = "endpointslice.pilotfish.io"
MAX_ENDPOINTS_PER_SLICE: Final = 100

# The DisruptionTarget reason on a pod the node lifecycle controller evicts from a lost node:
# it is Terminating until the node returns, and no controller counts it (replaced at once).
DISRUPTION_NODE_LOST: Final = "PilotfishNodeLost"
# The reason the node lifecycle controller gives a running pod it marks not ready because its
# node went silent (and what the local kwok's resync stage looks for when the node is back).
POD_REASON_NODE_UNREACHABLE: Final = "NodeUnreachable"


def is_at_most_one(pod: Mapping[str, Any]) -> bool:
    """An at-most-one pod: a fencing epoch and a ServiceWorkload controlling it (whose
    controller releases it, never eviction). The annotation alone is not enough: a tenant may
    put it on a raw pod of its own, which nothing would then ever release."""
    meta = pod.get("metadata") or {}
    if names.ANNOTATION_EPOCH not in (meta.get("annotations") or {}):
        return False
    return any(
        isinstance(o, Mapping) and o.get("kind") == "ServiceWorkload" and o.get("controller")
        for o in meta.get("ownerReferences") or []
    )
