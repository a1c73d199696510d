"""How long a tenant pod tolerates its node being lost, where upstream's taint eviction runs.

On a cluster whose own node lifecycle and taint eviction controllers cannot be turned off (a
managed one), upstream taints a lost node `node.kubernetes.io/unreachable` (or `not-ready`)
NoExecute and evicts each pod once its toleration of that taint runs out. The API server's
DefaultTolerationSeconds plugin, which runs before any webhook, gives every pod without one
a toleration of 300 s: five minutes of lost capacity per machine failure. Here:

- An ordinary pod's toleration of each of the two taints is the eviction wait Pilotfish is
  configured with (PILOTFISH_EVICTION_WAIT_SECONDS, 60 s by default), replacing upstream's
  300 s default. A pod without any (an API server whose plugin is off) gets none: that
  cluster's rule, evict at once, is sooner than the wait, and the webhook shortens upstream's
  default rather than invent one.
- A pod that declares its own toleration of a taint keeps it, unchanged and uncapped: a
  toleration is the pod's statement of how long it would rather wait for its machine than be
  moved (local state that costs more to rebuild than to wait for), upstream honours it, and
  a pod that waits longer holds only its own team's capacity. One caveat: a toleration exactly
  like upstream's default (Exists, NoExecute, 300 s) cannot be told from the plugin's and is
  shortened too.
- An at-most-one pod (`workloads.is_at_most_one`: annotation `pilotfish.io/epoch` and a
  ServiceWorkload controlling it) tolerates both taints forever: upstream never evicts it,
  because a second copy may start only once the identity's Lease has surely expired, and the
  ServiceWorkload controller, not a timer on the node's taint, releases it. Every toleration
  of those taints it carries loses its time, a wildcard one (empty key) too: upstream evicts
  by the shortest matching one.

Pods outside tenant namespaces (kube-system, Pilotfish's own) and mirror pods are left alone.
In pilotfish mode nothing evicts by these tolerations (upstream's taint eviction is off and
Pilotfish evicts by its own clock), so the same patch holds in both modes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from pilotfish.nodesilence import SilenceSettings
from pilotfish.webhooks import tenancy
from pilotfish.webhooks.patches import Op, append_items, pointer
from pilotfish.workloads import is_at_most_one

NOT_READY: Final = "node.kubernetes.io/not-ready"
UNREACHABLE: Final = "node.kubernetes.io/unreachable"
LOST_NODE_TAINTS: Final = (NOT_READY, UNREACHABLE)
NO_EXECUTE: Final = "NoExecute"
# What upstream's DefaultTolerationSeconds admission plugin gives a pod without a toleration.
UPSTREAM_DEFAULT_SECONDS: Final = 300
MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"
DEFAULT_EVICTION_WAIT: Final = SilenceSettings().eviction_wait


def eviction_wait_from_env() -> float:
    """PILOTFISH_EVICTION_WAIT_SECONDS, read the way the operator reads it (one setting for
    both, so the chart sets it once); a bad value raises ValueError naming the variable."""
    return SilenceSettings.from_env().eviction_wait


def toleration_seconds(eviction_wait: float) -> int:
    """The API's tolerationSeconds is whole seconds: round up, so a pod is never evicted
    before the configured wait."""
    return math.ceil(eviction_wait)


def tolerates(toleration: Mapping[str, Any], key: str) -> bool:
    """Whether `toleration` matches the value-less NoExecute taint `key`, by upstream's rule
    (an empty key with Exists matches every taint; an empty effect every effect)."""
    if (toleration.get("effect") or "") not in ("", NO_EXECUTE):
        return False
    operator = toleration.get("operator") or "Equal"
    own = toleration.get("key") or ""
    if own == "":
        return operator == "Exists"
    return own == key and (operator == "Exists" or not toleration.get("value"))


def is_upstream_default(toleration: Mapping[str, Any], key: str) -> bool:
    return (
        toleration.get("key") == key
        and toleration.get("operator") == "Exists"
        and toleration.get("effect") == NO_EXECUTE
        and not toleration.get("value")
        and toleration.get("tolerationSeconds") == UPSTREAM_DEFAULT_SECONDS
    )


def _at(index: int) -> str:
    return pointer("spec", "tolerations", str(index), "tolerationSeconds")


def patch(pod: Mapping[str, Any], namespace: str, eviction_wait: float) -> list[Op]:
    """JSON-patch ops giving the pod its lost-node tolerations (see the module docstring),
    computed on `pod` as earlier steps of the review left it."""
    spec = pod.get("spec")
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if not tenancy.is_tenant(namespace) or not isinstance(spec, Mapping):
        return []
    if MIRROR_ANNOTATION in annotations:
        return []
    current = spec.get("tolerations")
    listed: list[Mapping[str, Any]] = list(current) if isinstance(current, list) else []
    forever = is_at_most_one(pod)
    seconds = toleration_seconds(eviction_wait)
    ops: list[Op] = []
    added: list[dict[str, Any]] = []
    for key in LOST_NODE_TAINTS:
        matching = [i for i, t in enumerate(listed) if tolerates(t, key)]
        for i in matching:
            t = listed[i]
            if t.get("tolerationSeconds") is None:
                continue  # forever already
            if forever:
                # Any timed match would let upstream evict it (the shortest one counts).
                ops.append({"op": "remove", "path": _at(i)})
            elif is_upstream_default(t, key):
                ops.append({"op": "replace", "path": _at(i), "value": seconds})
        if forever and not matching:
            added.append({"key": key, "operator": "Exists", "effect": NO_EXECUTE})
    # An empty-key toleration matches both taints; remove its time once, not per taint.
    ops = list({op["path"]: op for op in ops}.values())
    return [*ops, *append_items(current, ("spec", "tolerations"), added)]
