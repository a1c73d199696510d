"""Placement decisions: pure functions from a pod and candidate nodes to an answer.

This is where filtering ("no node in zone b has 8 free GPUs"), scoring (spread production,
pack batch) and preemption policy (never preempt production) will live. Kept apart from
HTTP and from the wire format so that each rule is a unit test on plain values, and so the
handler can stay within the scheduler's millisecond budget: nothing here may do I/O, read
the clock or allocate per node more than the answer needs.

Today every function is the neutral answer: every node passes, every node scores the same,
the scheduler's proposed victims stand.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pilotfish.extender.wire import MetaVictims


@dataclass(frozen=True, slots=True)
class FilterResult:
    """Nodes that pass, and why the others do not.

    `unresolvable` is for failures preemption cannot fix (wrong zone, missing GPU model),
    so the scheduler does not evict pods on those nodes in vain.
    """

    passing: Sequence[str]
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)


def filter_nodes(pod: Mapping[str, Any], node_names: Sequence[str]) -> FilterResult:
    """Every candidate passes until placement rules exist.

    Returns the caller's sequence itself rather than a copy: with thousands of nodes the
    copy would be the most expensive thing the handler does.
    """
    del pod
    return FilterResult(node_names)


def score_nodes(pod: Mapping[str, Any], node_names: Sequence[str]) -> Sequence[int]:
    """One score per node, in `node_names` order; today neutral, so in-tree plugins rank.

    A parallel list rather than (name, score) pairs saves a tuple per node per call.
    Scores may fall outside 0..10; the wire encoder clamps them, so scoring rules can be
    written as plain arithmetic.
    """
    del pod
    return [0] * len(node_names)


def choose_victims(
    pod: Mapping[str, Any], proposed: Mapping[str, MetaVictims]
) -> dict[str, MetaVictims]:
    """Accept the scheduler's proposal, minus nodes that would evict nobody.

    kube-scheduler rejects an extender answer with a node that has no victims ("expected
    at least one victim pod on node") unless the extender is ignorable, so such nodes are
    dropped rather than passed through.
    """
    del pod
    return {node: victims for node, victims in proposed.items() if victims.pod_uids}
