"""Who is in a gang and how big it must be (pure): the part of the release phase that knows
the two kinds of gang, so `decide` has one gang algorithm for both.

- A GatePolicy gang is every pod of the namespace with the same `pilotfish.io/gang` label;
  its size is the largest `Gang` condition its members' GatePolicies declare.
- A batch gang is a BatchWorkload's: the pods of its namespace with that label whose
  controller is that BatchWorkload (matched by uid, so a workload deleted and created again
  under the same name is a new gang). Its size is the workload's `spec.gang`, read from the
  controller's BatchWorkload view, never from a pod. A pod merely labelled with the
  workload's name, without the owner reference, is not a member: it is in the label's
  GatePolicy gang, if any. Owner references only name objects of the pod's own namespace,
  so no pod can join, hold or release another namespace's gang.

Both are released by the same rule (`conditions.gang`: all N present and each one's other
gates met, then all at once). One thing only a batch gang has: its gang is released once in
its workload's life, so once any member's release is recorded on it (the
`gates.pilotfish.io/released` annotation the release patch writes) the gang's release has
begun and the rest follow, even if released members have finished meanwhile. That is what
completes a release a kill -9 interrupted after some members' writes, when short tasks are
already done before the restarted controller looks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

from pilotfish import gates
from pilotfish.operators.gates import conditions
from pilotfish.operators.gates.conditions import GangMember, Verdict
from pilotfish.operators.gates.model import BatchView, PodView
from pilotfish.operators.gates.plan import kind

# (namespace, gang label, uid of the owning BatchWorkload; "" for a GatePolicy gang)
GangId = tuple[str, str, str]

NO_LABEL: Final = f"no {gates.LABEL_GANG} label"


def gang_id(p: PodView) -> GangId | None:
    if not p.gang:
        return None
    owner = p.batch_owner
    if owner is not None and owner[0] == p.gang:
        return (p.namespace, p.gang, owner[1])
    return (p.namespace, p.gang, "")


def groups(pods: Iterable[PodView]) -> dict[GangId, list[PodView]]:
    out: dict[GangId, list[PodView]] = {}
    for p in pods:
        gid = gang_id(p)
        if gid is not None:
            out.setdefault(gid, []).append(p)
    return out


def is_batch_gate(p: PodView, gate: str) -> bool:
    """`gate` is a batch gang gate this controller manages (the quota-rule-like record of
    the mutating webhook, confirmed by `terms`)."""
    return p.managed(gate) and p.record[gate].policy == gates.GANG_POLICY


def begun(pods: Iterable[PodView]) -> Counter[GangId]:
    """Per batch gang, how many of its pods (finished ones too) record their gang gate's
    release: a positive count means the gang's release has begun."""
    out: Counter[GangId] = Counter()
    for p in pods:
        gid = gang_id(p)
        rec = p.record.get(gates.GANG_GATE)
        if gid is None or not gid[2] or rec is None or rec.policy != gates.GANG_POLICY:
            continue
        if gates.GANG_GATE in p.released_log and gates.GANG_GATE not in p.scheduling_gates:
            out[gid] += 1
    return out


def _batch_size(
    gid: GangId, batches: Mapping[tuple[str, str], BatchView]
) -> tuple[int | None, str]:
    ns, name, uid = gid
    where = f"BatchWorkload {ns}/{name}"
    bw = batches.get((ns, name))
    if bw is None:
        return None, f"gang {name}: {where} not found (its size is that workload's spec.gang)"
    if not uid or bw.uid != uid:
        return None, (
            f"gang {name}: {where} has uid {bw.uid}, not the {uid or '(none)'} its pods are "
            "owned by (it was deleted and created again)"
        )
    if bw.gang is None:
        return None, f"gang {name}: {where} cannot size it: {bw.problem}"
    return bw.gang, ""


def size(
    gid: GangId, members: Sequence[PodView], batches: Mapping[tuple[str, str], BatchView]
) -> tuple[int | None, str]:
    """(the gang's size, "") or (None, why it cannot be sized; "" when no member holds a
    Gang gate this controller manages). From the members' GatePolicies and, for a batch
    gang, its BatchWorkload: no pod makes itself a gang of one."""
    sizes: list[int] = []
    batch = False
    for m in members:
        for g in m.pilotfish_gates:
            if kind(m, g) != "Gang" or not m.managed(g):
                continue
            if is_batch_gate(m, g):
                batch = True
            else:
                sizes.append(int(m.terms[g].get("size") or 0))
    if batch:
        if not gid[2]:  # the webhook and `terms` only admit owned pods; never sized
            return None, f"gang {gid[1]}: its pods are not owned by a BatchWorkload"
        n, problem = _batch_size(gid, batches)
        if n is None:
            return None, problem
        sizes.append(n)
    return (max(sizes) if sizes else None), ""


def verdict(
    gid: GangId,
    members: Sequence[PodView],
    batches: Mapping[tuple[str, str], BatchView],
    released_before: int,
    ready: Callable[[PodView], bool],
    waiting_for: Callable[[PodView], str],
) -> Verdict | None:
    """Whether the gang goes now (None: no member holds a Gang gate this controller
    manages, so there is no gang to decide about)."""
    n, problem = size(gid, members, batches)
    if problem:
        return Verdict(False, problem, problem)
    if n is None:
        return None
    name = gid[1]
    if released_before:
        return Verdict(
            True,
            f"gang {name}: its release began in an earlier round ({released_before} of {n} "
            "released); releasing the rest",
        )
    return conditions.gang(
        name,
        n,
        [
            GangMember(m.key, m.released or ready(m), "" if m.released else waiting_for(m))
            for m in members
        ],
    )
