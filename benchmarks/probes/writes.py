"""API writes per writer, counted from the API server's audit events.

Pure (fed audit events). `benchmarks/batch_job` sets the writes a BatchWorkload costs beside
the built-in Job controller's for the same work; the devcluster's audit policy logs pod
writes (pods, pods/status, pods/binding, pods/eviction), Pilotfish's objects and Jobs'
status at Metadata level, one `ResponseComplete` event per request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Final

from pilotfish import names

WRITE_VERBS: Final = frozenset({"create", "update", "patch", "delete", "deletecollection"})
JOB_CONTROLLER: Final = "system:serviceaccount:kube-system:job-controller"
BATCH_OPERATOR: Final = f"system:serviceaccount:{names.SYSTEM_NAMESPACE}:{names.SA_BATCH}"
OPERATOR: Final = f"system:serviceaccount:{names.SYSTEM_NAMESPACE}:{names.SA_OPERATOR}"
SCHEDULER: Final = "system:kube-scheduler"
KWOK: Final = "pilotfish-kwok"  # its client certificate's common name (devcluster/pki.py)
GARBAGE_COLLECTOR: Final = "system:serviceaccount:kube-system:generic-garbage-collector"

# Who is who in a report: a task's controller, the kubelet's part (kwok), the scheduler.
ROLES: Final[Mapping[str, tuple[str, ...]]] = {
    "job_controller": (JOB_CONTROLLER,),
    # Pilotfish's controllers: the batch operator writes as its own ServiceAccount; when it
    # runs without one, and for every other controller (gates), as the operator's.
    "batch_operator": (BATCH_OPERATOR, OPERATOR),
    "kwok": (KWOK,),
    "scheduler": (SCHEDULER,),
    "garbage_collector": (GARBAGE_COLLECTOR,),
}

WriteCounts = dict[str, Counter[str]]  # user -> "resource[/subresource] verb" -> requests


def writer(event: Mapping[str, Any]) -> str:
    """Whose write it is: the impersonated user when the client impersonated one (the batch
    operator writes through impersonation), else the authenticated user."""
    impersonated = (event.get("impersonatedUser") or {}).get("username")
    return str(impersonated or (event.get("user") or {}).get("username") or "?")


def count_writes(events: Iterable[Mapping[str, Any]], namespace: str) -> WriteCounts:
    """Completed write requests on objects of `namespace`, by writer and by what they wrote.

    Requests the API server refused count too: a 409 from a repeated create or a conflicting
    update cost the server a request all the same."""
    out: WriteCounts = {}
    for event in events:
        if event.get("stage") != "ResponseComplete" or event.get("verb") not in WRITE_VERBS:
            continue
        ref = event.get("objectRef") or {}
        if ref.get("namespace") != namespace:
            continue
        what = ref.get("resource", "?") + (
            f"/{ref['subresource']}" if ref.get("subresource") else ""
        )
        out.setdefault(writer(event), Counter())[f"{what} {event['verb']}"] += 1
    return out


def by_role(counts: WriteCounts) -> dict[str, int]:
    """Requests per role of ROLES, plus `other` for every writer not named there."""
    known = {user: role for role, users in ROLES.items() for user in users}
    out = dict.fromkeys([*ROLES, "other"], 0)
    for user, what in counts.items():
        out[known.get(user, "other")] += sum(what.values())
    return out


def per_task(counts: WriteCounts, tasks: int) -> dict[str, float]:
    """Writes per task by role, and in all."""
    roles = by_role(counts)
    total = sum(roles.values())
    return {k: round(v / tasks, 3) for k, v in {**roles, "total": total}.items()}
