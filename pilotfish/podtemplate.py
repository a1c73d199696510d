"""The pod a workload's template becomes: one builder for the operator and the admission check.

The ServiceWorkload controller creates its replicas with `pod_body`, and the workloads
webhook dry-runs the same body at admission, so a template the API server would refuse is
refused when it is written rather than looping on FailedCreate afterwards. Kept in the core
because the parts may not import each other.

A workload's `spec.placement` (`pilotfish.api.serviceworkload.Placement`; any workload kind
that has one) is applied on top of the template, and both must hold, so nothing either says
is dropped:
- zones and machine class become required node affinity (`topology.kubernetes.io/zone`,
  `node.kubernetes.io/instance-type`, the label the extender reads a node's class from),
  added to every one of the template's own required terms (they are ORed, so adding to each
  keeps both sides);
- nodeSelector is merged into the pod's; a key the template selects with another value is
  required through node affinity as well, so the pod stays Pending with the scheduler's
  reason instead of either value being silently thrown away;
- gpus becomes `nvidia.com/gpu` requests and limits of the first container, unless that
  container sets `nvidia.com/gpu` itself: the per-container statement is the more specific;
- spread becomes a topology spread constraint (maxSkew 1, ScheduleAnyway) over the
  workload's pods of the same revision, unless the template spreads over that key itself.
  ScheduleAnyway: spread is a preference; a zone that is down or full must not stop
  replicas from running elsewhere.
Changing the placement alone is not a new revision: it applies to pods created afterwards.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

from pilotfish import names
from pilotfish.api.serviceworkload import Placement
from pilotfish.workloads import LABEL_REVISION, LABEL_WORKLOAD

Obj = dict[str, Any]

LABEL_HOSTNAME: Final = "kubernetes.io/hostname"
LABEL_INSTANCE_TYPE: Final = "node.kubernetes.io/instance-type"
GPU: Final = "nvidia.com/gpu"
SPREAD_KEY: Final = {"zone": names.LABEL_ZONE, "node": LABEL_HOSTNAME}
REQUIRED: Final = "requiredDuringSchedulingIgnoredDuringExecution"


def owner_reference(workload: Mapping[str, Any]) -> dict[str, Any]:
    meta = workload["metadata"]
    return {
        "apiVersion": workload.get("apiVersion", names.API_VERSION),
        "kind": workload.get("kind", "ServiceWorkload"),
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pod_name(workload: str, hash_: str, suffix: str) -> str:
    return f"{workload}-{hash_}-{suffix}"


def pod_body(
    workload: Mapping[str, Any],
    template: Mapping[str, Any],
    hash_: str,
    name: str,
    default_band: str = "production",
    *,
    selector_labels: Mapping[str, str] | None = None,
) -> Obj:
    """A pod of `template` (the revision's, not necessarily the current spec's).

    `selector_labels`: the labels that make the pod one of this workload's, also what the
    placement's spread counts; a ServiceWorkload's (workload name and revision) when unset.
    """
    meta = workload["metadata"]
    spec = workload.get("spec") or {}
    tmeta = template.get("metadata") or {}
    own = (
        dict(selector_labels)
        if selector_labels is not None
        else {LABEL_WORKLOAD: meta["name"], LABEL_REVISION: hash_}
    )
    labels = {
        **(tmeta.get("labels") or {}),
        **own,
        names.LABEL_TEAM: spec.get("team", ""),
        names.LABEL_BAND: spec.get("band", default_band),
    }
    pod_meta: Obj = {
        "name": name,
        "namespace": meta["namespace"],
        "labels": labels,
        "ownerReferences": [owner_reference(workload)],
    }
    if tmeta.get("annotations"):
        pod_meta["annotations"] = dict(tmeta["annotations"])
    pod_spec = dict(template.get("spec") or {})
    raw = spec.get("placement")
    if raw is not None:
        placement = Placement.model_validate(raw)
        patch = placement_patch(placement, meta["name"], selector_labels=selector_labels)
        pod_spec = with_placement(pod_spec, patch)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": pod_meta,
        "spec": pod_spec,
    }


def placement_patch(
    placement: Placement, workload: str, *, selector_labels: Mapping[str, str] | None = None
) -> Obj:
    """What `placement` adds to a pod spec of `workload`, as pod spec fields.

    Only the fields the placement asks for are present: `nodeSelector`, `affinity` (one
    required term), `topologySpreadConstraints`, and `containers` holding the first
    container's GPU resources.
    """
    out: Obj = {}
    expressions = []
    if placement.zones:
        expressions.append(_in(names.LABEL_ZONE, list(placement.zones)))
    if placement.machine_class:
        expressions.append(_in(LABEL_INSTANCE_TYPE, [placement.machine_class]))
    if expressions:
        out["affinity"] = {
            "nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": expressions}]}}
        }
    if placement.node_selector:
        out["nodeSelector"] = dict(placement.node_selector)
    if placement.gpus:
        amount = str(placement.gpus)
        out["containers"] = [{"resources": {"requests": {GPU: amount}, "limits": {GPU: amount}}}]
    spread: Obj = {
        "maxSkew": 1,
        "topologyKey": SPREAD_KEY[placement.spread],
        "whenUnsatisfiable": "ScheduleAnyway",
    }
    if selector_labels is None:
        spread["labelSelector"] = {"matchLabels": {LABEL_WORKLOAD: workload}}
        spread["matchLabelKeys"] = [LABEL_REVISION]
    else:
        spread["labelSelector"] = {"matchLabels": dict(selector_labels)}
    out["topologySpreadConstraints"] = [spread]
    return out


def with_placement(pod_spec: Mapping[str, Any], patch: Mapping[str, Any]) -> Obj:
    """`pod_spec` with a `placement_patch` applied, both holding; `pod_spec` is not changed."""
    out = copy.deepcopy(dict(pod_spec))
    expressions = [
        e for t in _terms(patch.get("affinity")) for e in t.get("matchExpressions") or []
    ]
    selector = dict(out.get("nodeSelector") or {})
    for key, value in (patch.get("nodeSelector") or {}).items():
        if key not in selector:
            selector[key] = value
        elif selector[key] != value:
            expressions.append(_in(key, [value]))
    if selector:
        out["nodeSelector"] = selector
    if expressions:
        _require(out, expressions)
    spreads = list(out.get("topologySpreadConstraints") or [])
    keys = {c.get("topologyKey") for c in spreads if isinstance(c, Mapping)}
    for constraint in patch.get("topologySpreadConstraints") or []:
        if constraint["topologyKey"] not in keys:
            spreads.append(copy.deepcopy(constraint))
    if spreads:
        out["topologySpreadConstraints"] = spreads
    extra = patch.get("containers") or []
    containers = out.get("containers")
    if extra and isinstance(containers, list) and containers and isinstance(containers[0], dict):
        _add_resources(containers[0], extra[0].get("resources") or {})
    return out


def _in(key: str, values: list[str]) -> Obj:
    return {"key": key, "operator": "In", "values": values}


def _terms(affinity: Any) -> list[Obj]:
    if not isinstance(affinity, Mapping):
        return []
    required = (affinity.get("nodeAffinity") or {}).get(REQUIRED) or {}
    return [t for t in required.get("nodeSelectorTerms") or [] if isinstance(t, dict)]


def _require(pod_spec: Obj, expressions: list[Obj]) -> None:
    """AND `expressions` into the pod's required node affinity (into each ORed term)."""
    affinity = pod_spec.setdefault("affinity", {})
    node = affinity.setdefault("nodeAffinity", {})
    required = node.setdefault(REQUIRED, {})
    terms = [t for t in required.get("nodeSelectorTerms") or [] if isinstance(t, dict)]
    if not terms:
        terms = [{}]
    for term in terms:
        term["matchExpressions"] = [*(term.get("matchExpressions") or []), *expressions]
    required["nodeSelectorTerms"] = terms


def _add_resources(container: Obj, resources: Mapping[str, Any]) -> None:
    """The placement's GPUs, unless the container states its own GPU request or limit."""
    own = container.get("resources") or {}
    if any(GPU in (own.get(kind) or {}) for kind in ("requests", "limits")):
        return
    merged = dict(own)
    for kind, amounts in resources.items():
        merged[kind] = {**(own.get(kind) or {}), **amounts}
    container["resources"] = merged
