"""Why a node fails the extender's filter, in words a pod's PodScheduled message can carry.

One sentence per failed node, or, when every candidate fails, one per cause grouped by zone
(see `decide`'s docstring for why the summary replaces the per-node lines). Pure and cheap:
one `Failure` is built per failed node per filter call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from pilotfish import names
from pilotfish.extender import resources
from pilotfish.extender.records import NodeState
from pilotfish.extender.resources import GPU

if TYPE_CHECKING:
    from pilotfish.extender.decide import Incoming

# Filter causes (also the `cause` label of pilotfish_extender_rejected_nodes_total).
MACHINE_CLASS: Final = "machine_class"
GPUS: Final = "gpu"
BATCH_CPU: Final = "batch_cpu"
BATCH_MEMORY: Final = "batch_memory"
CAUSES: Final = (MACHINE_CLASS, GPUS, BATCH_CPU, BATCH_MEMORY)

# How many groups a summary names before it says "and N more".
MAX_ZONES: Final = 6
MAX_BUCKETS: Final = 3


@dataclass(slots=True)
class Failure:
    """Why one node fails: the cause, what it has (free amount or machine class) and
    whether preemption could ever change that. (Not frozen: a frozen dataclass is slower
    to build, and one is built per failed node per call.)"""

    cause: str
    node: NodeState
    have: int | str
    unresolvable: bool


def fmt_cpu(millis: int) -> str:
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def fmt_bytes(value: int) -> str:
    for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if value >= size:
            amount = value / size
            return f"{amount:.0f}{unit}" if value % size == 0 else f"{amount:.1f}{unit}"
    return str(value)


def node_reason(pod: Incoming, failure: Failure) -> str:
    """One failed node, in words: which node, where, what it has, what the pod asks."""
    node = failure.node
    where = node.where
    if failure.cause == MACHINE_CLASS:
        have = failure.have or "(unlabelled)"
        return f"{where} is machine class {have}, pod asks {pod.machine_class}"
    if failure.cause == GPUS:
        if node.alloc_gpu == 0:
            return f"{where} has no GPUs, pod asks {pod.gpu}"
        return f"{where} has {failure.have} free GPUs, pod asks {pod.gpu}"
    if failure.cause == BATCH_CPU:
        have = fmt_cpu(int(failure.have))
        return f"{where} has {have} {names.BATCH_CPU} free, pod asks {fmt_cpu(pod.batch_cpu)} CPU"
    have = fmt_bytes(int(failure.have))
    asks = fmt_bytes(pod.batch_memory)
    return f"{where} has {have} {names.BATCH_MEMORY} free, pod asks {asks}"


def _count(n: int, singular: str, plural: str, what: str) -> str:
    return f"{n} {singular if n == 1 else plural} {what}"


def _buckets(pod: Incoming, cause: str, failures: Sequence[Failure]) -> str:
    """`3 have 4, 1 is full`: nodes of one zone grouped by what they have, best first."""
    groups: dict[int | str, int] = {}
    for f in failures:
        have: int | str = f.have
        if cause == GPUS and f.node.alloc_gpu == 0:
            have = "none"
        groups[have] = groups.get(have, 0) + 1

    def order(item: tuple[int | str, int]) -> tuple[int, int | str]:
        have, count = item
        if cause == MACHINE_CLASS:
            return (-count, str(have))
        if isinstance(have, int) and have > 0:
            return (0, -have)
        return (1, str(have))

    ordered = sorted(groups.items(), key=order)
    parts = []
    for have, count in ordered[:MAX_BUCKETS]:
        if cause == MACHINE_CLASS:
            parts.append(_count(count, "is", "are", str(have) or "unlabelled"))
        elif have == "none":
            parts.append(_count(count, "has", "have", "none"))
        elif have == 0:
            parts.append(_count(count, "is", "are", "full"))
        elif cause == GPUS:
            parts.append(_count(count, "has", "have", str(have)))
        elif cause == BATCH_CPU:
            parts.append(_count(count, "has", "have", fmt_cpu(int(have))))
        else:
            parts.append(_count(count, "has", "have", fmt_bytes(int(have))))
    rest = sum(count for _, count in ordered[MAX_BUCKETS:])
    if rest:
        parts.append(_count(rest, "has", "have", "less"))
    return ", ".join(parts)


def _need(pod: Incoming, cause: str) -> str:
    if cause == MACHINE_CLASS:
        return f"is machine class {pod.machine_class} ({resources.LABEL_INSTANCE_TYPE})"
    if cause == GPUS:
        return f"has {pod.gpu} free GPUs ({GPU})"
    if cause == BATCH_CPU:
        return f"has {fmt_cpu(pod.batch_cpu)} CPU free in {names.BATCH_CPU}"
    return f"has {fmt_bytes(pod.batch_memory)} free in {names.BATCH_MEMORY}"


def _zone_list(zones: Sequence[str]) -> str:
    if len(zones) == 1:
        return zones[0]
    if len(zones) <= 4:
        return ", ".join(zones[:-1]) + " or " + zones[-1]
    return f"any of {len(zones)} zones"


def summarize(pod: Incoming, failures: Sequence[Failure]) -> str:
    """Every candidate failed: one short sentence per cause, grouped by zone, that says what
    to change ("no node in zone-b has 8 free GPUs (nvidia.com/gpu): 3 have 4, 1 is full")."""
    by_cause: dict[str, dict[str, list[Failure]]] = {}
    for f in failures:
        by_cause.setdefault(f.cause, {}).setdefault(f.node.zone or "(no zone)", []).append(f)
    sentences = []
    for cause in CAUSES:
        zones = by_cause.get(cause)
        if not zones:
            continue
        names_ = sorted(zones)
        head = f"no node in {_zone_list(names_)} {_need(pod, cause)}"
        if len(names_) == 1:
            sentences.append(f"{head}: {_buckets(pod, cause, zones[names_[0]])}")
            continue
        shown = [f"{z}: {_buckets(pod, cause, zones[z])}" for z in names_[:MAX_ZONES]]
        if len(names_) > MAX_ZONES:
            shown.append(f"and {len(names_) - MAX_ZONES} more zones")
        sentences.append(f"{head}: " + "; ".join(shown))
    return "; ".join(sentences)
