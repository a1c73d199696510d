"""Reclaim at pod creation: batch and best-effort pods placed on reclaimed capacity, and
production memory held to its request.

Where reclaim is on (the namespace's `pilotfish.io/reclaim` label, `enabled` | `disabled`,
over the cluster default `PILOTFISH_RECLAIM`, `on` | `off`), a pod of band `batch` or
`best-effort` has every container's and init container's cpu and memory requests and
limits moved into `batch.pilotfish.io/cpu` (millicores, rounded up) and
`batch.pilotfish.io/memory` (bytes, rounded up), set as both request and limit because the
API server requires an extended resource's request to equal its limit. The originals are
kept in the `batch.pilotfish.io/original-resources` annotation. kube-scheduler's own fit
then places the pod against the node's batch allocatable (what the reclaim controller
measured production leaves unused), never against the cpu and memory production reserved.

Limits go too, not only requests: the API server defaults a missing request to the limit
after a webhook mutates, which would put the cpu request straight back. Without cpu or
memory requests or limits the pod is BestEffort: on a real kubelet it runs in the
BestEffort cgroup with cpu.shares 2 (the lowest weight, so production's cpu always wins
under contention) and is the first one the kernel OOM-kills (oom_score_adj 1000).

Production pods in those namespaces get memory limit = memory request (the design's rule):
memory cannot be throttled back, so a production pod may not grow into what batch borrowed.

`pilotfish.quota.pod_requests` reads `batch.pilotfish.io/*` back as cpu and memory, so a
translated pod is charged to its TeamQuota exactly what it asked (to the millicore and the
byte). A pod may not name `batch.pilotfish.io/*` itself to get around that: production may
never (it would run on capacity reclaimed from production), batch only where reclaim is on,
and never beside the cpu or memory the webhook would translate into the same entry.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pilotfish import names, quantity
from pilotfish.webhooks.patches import Op, pointer, remove_entries, set_entries

ENV: Final = "PILOTFISH_RECLAIM"
MODES: Final = {"on": True, "off": False}
LABEL_VALUES: Final = {"enabled": True, "disabled": False}
TRANSLATED_BANDS: Final = frozenset({"batch", "best-effort"})
# resource -> (its batch twin, to the twin's integer unit)
MOVED: Final = {
    "cpu": (names.BATCH_CPU, quantity.milli),
    "memory": (names.BATCH_MEMORY, quantity.whole),
}
BATCH_RESOURCES: Final = (names.BATCH_CPU, names.BATCH_MEMORY)
_LISTS: Final = ("containers", "initContainers")
_KINDS: Final = ("requests", "limits")


def default_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """The cluster default, read once at start; a bad value stops the webhook starting
    (ValueError naming the variable) rather than guessing which capacity pods go on."""
    value = environ.get(ENV, "").strip() or "off"
    if value not in MODES:
        raise ValueError(
            f"{ENV}={value!r} is not one of {', '.join(MODES)} (the cluster default for "
            f"placing batch pods on reclaimed capacity; namespaces override it with the label "
            f"{names.LABEL_RECLAIM}=enabled|disabled)"
        )
    return MODES[value]


@dataclass(frozen=True)
class Setting:
    """Reclaim in one namespace: on or off, and the words saying where that came from."""

    on: bool
    source: str


def setting(namespace: str, labels: Mapping[str, str], default: bool) -> Setting | str:
    """The namespace's setting, or why its label cannot be read (the pod is refused then:
    putting it on the wrong capacity could not be undone after creation)."""
    label = labels.get(names.LABEL_RECLAIM)
    if label is None:
        mode = "on" if default else "off"
        return Setting(default, f"the cluster default {ENV}={mode}")
    if label not in LABEL_VALUES:
        return (
            f"namespace {namespace} label {names.LABEL_RECLAIM}={label!r} is not one of "
            f"{', '.join(LABEL_VALUES)}; the platform must fix the label before pods are "
            "admitted there"
        )
    return Setting(
        LABEL_VALUES[label], f"label {names.LABEL_RECLAIM}={label} of namespace {namespace}"
    )


def _field(path: str, name: str) -> str:
    """A resource as a path element: `.cpu`, but `[batch.pilotfish.io/cpu]`."""
    return f"{path}.{name}" if name.isalnum() else f"{path}[{name}]"


def _containers(pod: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    spec = pod.get("spec") or {}
    for key in _LISTS:
        items = spec.get(key)
        for i, c in enumerate(items if isinstance(items, list) else []):
            if isinstance(c, Mapping):
                yield key, i, c


def _amounts(container: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    resources = container.get("resources")
    found = resources.get(kind) if isinstance(resources, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def problems(pod: Mapping[str, Any], namespace: str, band: str, reclaim: Setting) -> list[str]:
    """Why the pod cannot be admitted in its band with this reclaim setting, every field."""
    out: list[str] = []
    translated = band in TRANSLATED_BANDS and reclaim.on
    for key, i, c in _containers(pod):
        at = f"spec.{key}[{i}].resources"
        named = {(kind, r) for kind in _KINDS for r in _amounts(c, kind)}
        for kind, resource in sorted(named):
            if resource not in BATCH_RESOURCES:
                continue
            where = _field(f"{at}.{kind}", resource)
            value = quantity.shown(_amounts(c, kind)[resource])
            if band not in TRANSLATED_BANDS:
                out.append(
                    f"{where}: {value} is refused: {band} pods may not request {resource}, "
                    "the capacity reclaimed from production for batch and best-effort pods"
                )
            elif not reclaim.on:
                out.append(
                    f"{where}: {value} is refused: {resource} is reclaimed capacity and reclaim "
                    f"is off in namespace {namespace} ({reclaim.source}); request "
                    f"{_plain(resource)} instead"
                )
            elif any((k, _plain(resource)) in named for k in _KINDS):
                out.append(
                    f"{where}: {value} is refused: the container also names "
                    f"{_plain(resource)}, which the webhook moves into {resource} in namespace "
                    f"{namespace} ({reclaim.source}); name only {_plain(resource)}"
                )
        if translated:
            out += _too_large(at, c)
    level = ((pod.get("spec") or {}).get("resources") or {}) if translated else {}
    for kind in _KINDS:
        for resource in MOVED:
            if resource in (level.get(kind) or {}):
                out.append(
                    f"{_field(f'spec.resources.{kind}', resource)}: pod-level {resource} cannot "
                    f"be placed on reclaimed capacity ({names.BATCH_CPU}, {names.BATCH_MEMORY} "
                    f"are per container) in namespace {namespace} ({reclaim.source}); set it "
                    "on the containers instead"
                )
    return out


def _plain(batch_resource: str) -> str:
    return "cpu" if batch_resource == names.BATCH_CPU else "memory"


def _too_large(at: str, container: Mapping[str, Any]) -> list[str]:
    """cpu in millicores can exceed what an extended resource holds where cores did not."""
    out = []
    for kind in _KINDS:
        value = _amounts(container, kind).get("cpu")
        if value is None:
            continue
        try:
            millis = quantity.milli(value)
        except quantity.QuantityError:
            continue  # refused by the quantity checks already
        if millis > quantity.MAX:
            out.append(
                f"{_field(f'{at}.{kind}', 'cpu')}: {quantity.shown(value)} is more than "
                f"{names.BATCH_CPU} can hold ({quantity.MAX} millicores)"
            )
    return out


def _effective(container: Mapping[str, Any], resource: str) -> Any:
    """The request the API server will use: the request, else the limit it defaults from."""
    requests, limits = _amounts(container, "requests"), _amounts(container, "limits")
    return requests.get(resource, limits.get(resource))


def translate(pod: Mapping[str, Any]) -> list[Op]:
    """JSON patch moving every container's cpu/memory into `batch.pilotfish.io/*` (request
    and limit alike, from the effective request) and recording the originals."""
    ops: list[Op] = []
    record: dict[str, dict[str, Any]] = {key: {} for key in _LISTS}
    for key, i, c in _containers(pod):
        moved = {
            kind: {r: v for r, v in _amounts(c, kind).items() if r in MOVED} for kind in _KINDS
        }
        if not any(moved.values()):
            continue
        record[key][str(c.get("name") or i)] = {k: dict(v) for k, v in moved.items() if v}
        batch: dict[str, str] = {}
        for resource, (twin, unit) in MOVED.items():
            value = _effective(c, resource)
            amount = unit(value) if value is not None else 0
            if amount > 0:
                batch[twin] = str(amount)
        for kind in _KINDS:
            kept = {r: v for r, v in _amounts(c, kind).items() if r not in MOVED}
            new = {**kept, **batch}
            if new or kind in (c.get("resources") or {}):
                ops.append(
                    {
                        "op": "add",
                        "path": pointer("spec", key, str(i), "resources", kind),
                        "value": new,
                    }
                )
    meta = pod.get("metadata") or {}
    if any(record.values()):
        text = json.dumps(record, sort_keys=True, separators=(",", ":"))
        ops += set_entries(
            meta.get("annotations"),
            ("metadata", "annotations"),
            {names.ANNOTATION_ORIGINAL_RESOURCES: text},
        )
    else:
        ops += remove_entries(
            meta.get("annotations"),
            ("metadata", "annotations"),
            [names.ANNOTATION_ORIGINAL_RESOURCES],
        )
    return ops


def production_memory(pod: Mapping[str, Any]) -> list[Op]:
    """JSON patch setting each container's memory limit to its memory request."""
    ops: list[Op] = []
    for key, i, c in _containers(pod):
        request = _amounts(c, "requests").get("memory")
        if request is None:
            continue  # no request: the API server defaults it to the limit, equal already
        current = _amounts(c, "limits").get("memory")
        try:
            if current is not None and quantity.parse(current) == quantity.parse(request):
                continue
        except quantity.QuantityError:
            continue  # refused by the quantity checks already
        limits = (c.get("resources") or {}).get("limits")
        ops += set_entries(
            limits, ("spec", key, str(i), "resources", "limits"), {"memory": request}
        )
    return ops


def patch(pod: Mapping[str, Any], band: str, reclaim: Setting) -> list[Op]:
    """The reclaim patch for a pod that `problems` found nothing wrong with."""
    if reclaim.on and band in TRANSLATED_BANDS:
        return translate(pod)
    ops = remove_entries(
        (pod.get("metadata") or {}).get("annotations"),
        ("metadata", "annotations"),
        [names.ANNOTATION_ORIGINAL_RESOURCES],
    )
    if reclaim.on and band == "production":
        ops += production_memory(pod)
    return ops
