"""The pod a workload's template becomes: one builder for the operator and the admission check.

The ServiceWorkload controller creates its replicas with `pod_body`, and the workloads
webhook dry-runs the same body at admission, so a template the API server would refuse is
refused when it is written rather than looping on FailedCreate afterwards. Kept in the core
because the parts may not import each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pilotfish import names
from pilotfish.workloads import LABEL_REVISION, LABEL_WORKLOAD

Obj = dict[str, Any]


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
) -> Obj:
    """A pod of `template` (the revision's, not necessarily the current spec's)."""
    meta = workload["metadata"]
    spec = workload.get("spec") or {}
    tmeta = template.get("metadata") or {}
    labels = {
        **(tmeta.get("labels") or {}),
        LABEL_WORKLOAD: meta["name"],
        LABEL_REVISION: hash_,
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
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": pod_meta,
        "spec": dict(template.get("spec") or {}),
    }
