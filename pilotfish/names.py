"""Well-known names every Pilotfish part agrees on (ARCHITECTURE section 4).

Kept in one module so that the chart, the CRDs, the webhooks and the operators cannot drift
apart on a label key or a ServiceAccount name.
"""

from typing import Final

GROUP: Final = "pilotfish.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
CATEGORY: Final = "pilotfish"

LABEL_TEAM: Final = "pilotfish.io/team"
LABEL_BAND: Final = "pilotfish.io/band"
# On a Namespace, "disabled": Pilotfish's admission webhooks skip it (the chart's
# namespaceSelector, `pilotfish.webhookNamespaceSelector`).
LABEL_WEBHOOKS: Final = "pilotfish.io/webhooks"
WEBHOOKS_DISABLED: Final = "disabled"
ANNOTATION_EPOCH: Final = "pilotfish.io/epoch"
GATE_PREFIX: Final = "gates.pilotfish.io/"
BATCH_CPU: Final = "batch.pilotfish.io/cpu"
BATCH_MEMORY: Final = "batch.pilotfish.io/memory"
# Reclaim: batch and best-effort pods placed on capacity production reserved but does not
# use. On a pod: the cpu/memory entries the webhook moved into batch.pilotfish.io/* (JSON).
# On a Namespace: enabled | disabled, over the cluster default. On a Node: the figures
# behind its batch allocatable (JSON), and a condition saying whether they are measured.
ANNOTATION_ORIGINAL_RESOURCES: Final = "batch.pilotfish.io/original-resources"
LABEL_RECLAIM: Final = "pilotfish.io/reclaim"
ANNOTATION_RECLAIM: Final = "batch.pilotfish.io/reclaim"
CONDITION_BATCH_CAPACITY: Final = "BatchCapacity"

BANDS: Final = ("production", "batch", "best-effort")
PRIORITY_CLASS: Final = {
    "production": "pilotfish-production",
    "batch": "pilotfish-batch",
    "best-effort": "pilotfish-best-effort",
}

SYSTEM_NAMESPACE: Final = "pilotfish-system"
SCHEDULER_NAME: Final = "pilotfish-scheduler"

# One ServiceAccount per component, each bound to its own least-privilege role by the chart.
SA_OPERATOR: Final = "pilotfish-operator"
SA_EXTENDER: Final = "pilotfish-extender"
SA_WEBHOOKS: Final = "pilotfish-webhooks"
SA_SCHEDULER: Final = "pilotfish-scheduler"
# The batch operator's writes are made as this account (the operator impersonates it), so
# API Priority and Fairness queues them in their own level, behind production's.
SA_BATCH: Final = "pilotfish-batch"
COMPONENT_ACCOUNTS: Final = {
    "operator": SA_OPERATOR,
    "extender": SA_EXTENDER,
    "webhooks": SA_WEBHOOKS,
}


def service_account_user(namespace: str, account: str) -> str:
    """The user name the API server gives a ServiceAccount's requests."""
    return f"system:serviceaccount:{namespace}:{account}"


# Label on kwok-managed fake nodes; kwok only plays the kubelet for nodes carrying it.
LABEL_FAKE_NODE: Final = "pilotfish.io/fake-node"
LABEL_ZONE: Final = "topology.kubernetes.io/zone"
# The one real node (`pilotfish dev up --real-node`): a kubelet on this host, labelled and
# tainted with this key so only pods that select and tolerate it land there.
LABEL_REAL_NODE: Final = "pilotfish.io/real-node"
REAL_NODE_NAME: Final = "pilotfish-real-0"

# Planned maintenance (NodeMaintenance). On a Node: the NodeMaintenance draining it (set with
# the cordon, removed with the uncordon; the ServiceWorkload controller surges its pods), and
# the one that set spec.unschedulable (absent when someone else had cordoned it already: that
# someone keeps it, Pilotfish uncordons only what it cordoned).
ANNOTATION_DRAINING: Final = "pilotfish.io/draining"
ANNOTATION_CORDONED_BY: Final = "pilotfish.io/cordoned-by"
FINALIZER_MAINTENANCE: Final = "pilotfish.io/maintenance"
