"""Admission review of Pilotfish workloads (ServiceWorkload, BatchWorkload).

Schema and CEL rules in the CRDs reject what types alone can express; this review is for
checks that need more than the object. Today that is the pod template, checked by a dry
run of the pod it makes (`templates`): the one check that needs the API server, injected as
`dry_run` so the decision stays a unit test. Without a `dry_run` (tests and tools with no
cluster) templates pass unchecked, as they did before the check existed. GatePolicies are
routed here too and allowed: their rules are all in the CRD.
"""

from collections.abc import Mapping
from typing import Any, Final

from pilotfish.httpserver import BadRequest
from pilotfish.webhooks import templates
from pilotfish.webhooks.admission import Decision
from pilotfish.webhooks.templates import DryRun

WORKLOAD_KINDS: Final = frozenset({"ServiceWorkload", "BatchWorkload"})


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadRequest(f"{where} must be an object")
    return value


def _objects(request: Mapping[str, Any], key: str, required: bool) -> None:
    """The shapes the review reads; the API server only sends objects its schema admitted."""
    if request.get(key) is None and not required:
        return
    obj = _mapping(request.get(key), f"request.{key}")
    if not obj:
        raise BadRequest(f"request.{key} must be an object")
    _mapping(obj.get("metadata"), f"request.{key}.metadata")
    where = f"request.{key}.spec.template"
    template = _mapping(_mapping(obj.get("spec"), f"request.{key}.spec").get("template"), where)
    _mapping(template.get("spec"), f"{where}.spec")
    meta = _mapping(template.get("metadata"), f"{where}.metadata")
    for field in ("labels", "annotations"):
        _mapping(meta.get(field), f"{where}.metadata.{field}")


async def validate(request: Mapping[str, Any], dry_run: DryRun | None = None) -> Decision:
    """Deny a workload whose template makes a pod the API server refuses, naming the field."""
    gvk = request.get("kind")
    kind = gvk.get("kind") if isinstance(gvk, Mapping) else None
    operation = request.get("operation")
    if dry_run is None or kind not in WORKLOAD_KINDS or operation not in ("CREATE", "UPDATE"):
        return Decision.allow()
    _objects(request, "object", required=True)
    _objects(request, "oldObject", required=operation == "UPDATE")
    return await templates.check(request, dry_run)
