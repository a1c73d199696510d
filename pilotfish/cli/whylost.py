"""The machine-failure layer of `kubectl pilotfish why`: a pod on a lost node, and an
at-most-one pod's identity (ARCHITECTURE section 9).

A pod on a node whose lease went silent looks, to its owner, like a pod that is Running and
not Ready, or Terminating forever; neither says that the machine is gone, when Pilotfish
decided so, or whether a replacement runs. The evidence is on three objects: the node's
`node.kubernetes.io/unreachable` NoExecute taint (its timeAdded is when it was marked) and
Ready condition, the pod's DisruptionTarget condition (when and why it was evicted), and, for
an at-most-one pod, its ServiceWorkload's AtMostOne condition (whether the identity is held,
or waits for the old holder's lease to expire, until when). A tenant may not read nodes: the
pod's own Ready condition (reason NodeUnreachable) then dates the silence.

`explain_lost` is pure (pod, node, workload, now) -> sentences; `lost_layer` only reads.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Final, TextIO

from pilotfish import names, workloads
from pilotfish.cli.output import ago
from pilotfish.kube.rest import NODES, SERVICEWORKLOADS, ApiError, Rest
from pilotfish.timeutil import parse_time_or_none as _time

TAINT_UNREACHABLE: Final = "node.kubernetes.io/unreachable"
POD_UNREACHABLE: Final = "NodeUnreachable"  # the pod Ready reason while its node is lost
CONDITION_AT_MOST_ONE: Final = "AtMostOne"
WAITING: Final = "WaitingForLeaseExpiry"
HELD: Final = "Held"
SW_KIND: Final = "ServiceWorkload"


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = (obj or {}).get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _conditions(obj: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    status = (obj or {}).get("status")
    conds = status.get("conditions") if isinstance(status, Mapping) else None
    return [c for c in conds or [] if isinstance(c, Mapping)]


def _condition(obj: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any] | None:
    return next((c for c in _conditions(obj) if c.get("type") == kind), None)


def _message(cond: Mapping[str, Any] | None) -> str:
    return str((cond or {}).get("message") or "").strip().rstrip(".")


def epoch_of(pod: Mapping[str, Any]) -> str | None:
    """The at-most-one epoch annotation of a pod (None: an ordinary pod)."""
    value = (_meta(pod).get("annotations") or {}).get(names.ANNOTATION_EPOCH)
    return None if value is None else str(value)


def workload_of(pod: Mapping[str, Any]) -> str | None:
    """The ServiceWorkload that controls the pod (owner reference, else its label)."""
    meta = _meta(pod)
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") and ref.get("kind") == SW_KIND:
            return str(ref.get("name"))
    label = (meta.get("labels") or {}).get(workloads.LABEL_WORKLOAD)
    return str(label) if label else None


def _unreachable_taint(node: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    taints = ((node or {}).get("spec") or {}).get("taints") or []
    marked = [t for t in taints if isinstance(t, Mapping) and t.get("key") == TAINT_UNREACHABLE]
    return next(
        (t for t in marked if t.get("effect") == "NoExecute"), marked[0] if marked else None
    )


def _stamp(value: Any, now: datetime.datetime) -> str:
    t = _time(value)
    return f"{value} ({ago(t, now)})" if t is not None else "an unknown time"


def unreachable_sentence(
    pod: Mapping[str, Any], node: Mapping[str, Any] | None, now: datetime.datetime
) -> str | None:
    """When the pod's node was marked unreachable, from its taint (or the pod's Ready)."""
    name = ((pod.get("spec") or {}).get("nodeName")) or "?"
    taint = _unreachable_taint(node)
    ready = _condition(pod, "Ready")
    if taint is not None:
        since = _stamp(taint.get("timeAdded"), now)
        node_ready = _condition(node, "Ready")
        detail = _message(node_ready) if (node_ready or {}).get("status") != "True" else ""
        tail = f": {detail}." if detail else "."
        return f"Node {name} unreachable since {since} (lease silent){tail}"
    if node is None and ready is not None and ready.get("reason") == POD_UNREACHABLE:
        since = _stamp(ready.get("lastTransitionTime"), now)
        return (
            f"Node {name} unreachable since {since} (lease silent; from the pod's Ready "
            f"condition, {POD_UNREACHABLE}, as the node cannot be read)."
        )
    return None


def eviction_sentence(pod: Mapping[str, Any], now: datetime.datetime) -> str | None:
    target = _condition(pod, "DisruptionTarget")
    if target is None or target.get("status") != "True":
        return None
    reason = str(target.get("reason") or "DisruptionTarget")
    node = (pod.get("spec") or {}).get("nodeName") or "its node"
    owned = any(
        isinstance(r, Mapping) and r.get("controller")
        for r in _meta(pod).get("ownerReferences") or []
    )
    replaced = (
        "its controller replaced it" if owned else "no controller owns it, so nothing replaces it"
    )
    text = f"Evicted at {_stamp(target.get('lastTransitionTime'), now)} ({reason}): {replaced}"
    if reason == workloads.DISRUPTION_NODE_LOST:
        text += (
            f"; this copy stays Terminating until {node} returns and its kubelet removes it, "
            "and no controller counts it"
        )
    return text + "."


def _pending_sentence(pod: Mapping[str, Any], node: Mapping[str, Any] | None) -> str:
    """What comes next for an ordinary pod of a lost node that was not evicted yet."""
    ready = _condition(pod, "Ready")
    name = (pod.get("spec") or {}).get("nodeName")
    if node is not None and (ready or {}).get("status") == "True":
        return (
            "It still reports Ready, so its endpoints keep it: Pilotfish leaves a lost node's "
            "pods Ready only while the zone brake holds their zone (a partition-sized "
            f"silence: ZoneBrake Events on node {name}), and evicts nothing there meanwhile."
        )
    return (
        "It is evicted once the node has been unreachable for the eviction wait (60 s by "
        "default; not while a zone brake holds the zone), and its controller then replaces it."
    )


def at_most_one_sentences(
    pod: Mapping[str, Any], sw: Mapping[str, Any] | None, name: str | None, now: datetime.datetime
) -> list[str]:
    epoch = epoch_of(pod)
    if epoch is None:
        return []
    owner = f"ServiceWorkload {name}" if name else "its ServiceWorkload (none owns it)"
    lines = [
        f"It is an at-most-one pod (epoch {epoch}, {owner}): it is never evicted; a replacement "
        "starts only once this copy is gone or its node's lease has surely expired, with a "
        "higher epoch."
    ]
    if name is None:
        return lines
    if sw is None:
        return [*lines, f"{owner} was not found (or cannot be read)."]
    cond = _condition(sw, CONDITION_AT_MOST_ONE)
    if cond is None:
        return [*lines, f"{owner} reports no {CONDITION_AT_MOST_ONE} condition yet."]
    status, reason = cond.get("status"), str(cond.get("reason") or "")
    message = _message(cond)
    when = ago(_time(cond.get("lastTransitionTime")), now)
    head = f"{owner}: {CONDITION_AT_MOST_ONE} {status} ({reason or 'no reason'}, {when})"
    if reason == WAITING:
        head = f"{owner} waits for the old holder's lease to expire ({WAITING}, {when})"
    elif reason == HELD and status == "True":
        head = f"{owner}: the identity is held ({HELD}, {when})"
    return [*lines, head + (f": {message}." if message else ".")]


def explain_lost(
    pod: Mapping[str, Any],
    node: Mapping[str, Any] | None,
    sw: Mapping[str, Any] | None,
    now: datetime.datetime,
    workload: str | None = None,
) -> list[str]:
    """The lost-node and at-most-one sentences of a pod ([] for a pod with neither)."""
    lost = unreachable_sentence(pod, node, now)
    evicted = eviction_sentence(pod, now)
    lines = [s for s in (lost, evicted) if s]
    if lost and not evicted and epoch_of(pod) is None and not _meta(pod).get("deletionTimestamp"):
        lines.append(_pending_sentence(pod, node))
    name = workload if workload is not None else workload_of(pod)
    return lines + at_most_one_sentences(pod, sw, name, now)


async def lost_layer(
    rest: Rest, pod: Mapping[str, Any], now: datetime.datetime, err: TextIO
) -> list[str]:
    """Reads the pod's node (a tenant may not: then none) and, for an at-most-one pod, its
    ServiceWorkload, and explains."""
    node: dict[str, Any] | None = None
    node_name = (pod.get("spec") or {}).get("nodeName")
    if node_name:
        try:
            node = await rest.get(NODES.path(None, str(node_name)))
        except ApiError as e:
            if e.status not in (403, 404):
                print(f"warning: cannot read node {node_name} ({e.status} {e.message})", file=err)
    sw: dict[str, Any] | None = None
    name = workload_of(pod)
    if epoch_of(pod) is not None and name:
        ns = str(_meta(pod).get("namespace") or "")
        try:
            sw = await rest.get(SERVICEWORKLOADS.path(ns, name))
        except ApiError as e:
            if not e.not_found:
                print(f"warning: cannot read ServiceWorkload {ns}/{name} ({e.status})", file=err)
    return explain_lost(pod, node, sw, now, name)
