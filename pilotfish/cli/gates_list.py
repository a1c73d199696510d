"""`kubectl pilotfish gates` listing: what is waiting, on what, and for how much longer.

Answered from the creation-time gate record the webhook wrote (pilotfish.gates), so it shows
the terms the controller will apply, not whatever the GatePolicy says today. Pure but for
`list_gates`, which only reads and prints.
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, TextIO

from pilotfish import gates, timeutil
from pilotfish.cli.output import human_duration, table
from pilotfish.kube.rest import PODS, ApiError, Rest
from pilotfish.timeutil import parse_time_or_none as _time


@dataclass(frozen=True)
class GateRow:
    """One Pilotfish gate held by one pod, with its creation-time terms when recorded."""

    namespace: str
    pod: str
    gate: str
    created: datetime.datetime | None
    record: gates.GateRecord | None
    review: bool
    state: str | None  # reason of the gates.pilotfish.io/State condition

    @property
    def deadline(self) -> datetime.datetime | None:
        if self.record is None:
            return None
        try:
            return timeutil.parse_time(self.record.deadline)
        except ValueError:
            return None


def state_condition(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The gate controller's gates.pilotfish.io/State condition on `pod`, if any."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == gates.POD_CONDITION:
            return dict(cond)
    return None


def gate_rows(pods: Sequence[dict[str, Any]]) -> list[GateRow]:
    """One row per Pilotfish gate still on each pod, sorted by namespace, pod, gate.

    Gates of other owners are not listed: Pilotfish neither decides nor may remove them. A
    Pilotfish gate without a record (no GatePolicy put it there) is still listed, so a gate
    no controller will ever release is visible rather than silent.
    """
    rows: list[GateRow] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        held = [g for g in gates.scheduling_gates(pod) if gates.is_pilotfish_gate(g)]
        if not held:
            continue
        record = gates.read_record(pod)
        created = _time(record.created if record else None) or _time(meta.get("creationTimestamp"))
        review = (meta.get("labels") or {}).get(gates.LABEL_REVIEW) == "required"
        cond = state_condition(pod)
        for gate in held:
            rows.append(
                GateRow(
                    namespace=str(meta.get("namespace", "")),
                    pod=str(meta.get("name", "")),
                    gate=gate,
                    created=created,
                    record=record.gates.get(gate) if record else None,
                    review=review,
                    state=str(cond.get("reason")) if cond and cond.get("reason") else None,
                )
            )
    rows.sort(key=lambda r: (r.namespace, r.pod, r.gate))
    return rows


def condition_text(condition: dict[str, Any] | None) -> str:
    """`GateSignal(warehouse-export)`, `Gang(size=8)`, `Image(minNodes=2)`, `Quota`, and a
    batch gang's `Gang(workload=train)`."""
    if not condition:
        return "-"
    kind = str(condition.get("type", "?"))
    if condition.get("signalName"):
        return f"{kind}({condition['signalName']})"
    if condition.get("size") is not None:
        return f"{kind}(size={condition['size']})"
    if condition.get("minNodes") is not None:
        return f"{kind}(minNodes={condition['minNodes']})"
    if condition.get("workload"):
        return f"{kind}(workload={condition['workload']})"
    return kind


def deadline_text(deadline: datetime.datetime | None, now: datetime.datetime) -> str:
    """`in 4m12s`, or `EXPIRED 2m ago` once the deadline has passed; `-` when unknown."""
    if deadline is None:
        return "-"
    left = (deadline - now).total_seconds()
    if left <= 0:
        return f"EXPIRED {human_duration(-left)} ago"
    return f"in {human_duration(left)}"


HEADER: Final = (
    "NAMESPACE",
    "POD",
    "GATE",
    "CONDITION",
    "AGE",
    "DEADLINE",
    "ON-EXPIRY",
    "REVIEW",
    "STATE",
)


def render_table(rows: Sequence[GateRow], now: datetime.datetime, wide: bool = False) -> str:
    """kubectl-style table; `wide` adds the absolute deadline, the policy and its generation."""
    header = list(HEADER)
    if wide:
        header += ["DEADLINE-AT", "POLICY"]
    body = []
    for r in rows:
        cells = [
            r.namespace,
            r.pod,
            r.gate,
            condition_text(r.record.condition if r.record else None),
            human_duration((now - r.created).total_seconds()) if r.created else "-",
            deadline_text(r.deadline, now),
            r.record.on_expiry if r.record else "-",
            "required" if r.review else "-",
            r.state or "-",
        ]
        if wide:
            cells += [
                r.record.deadline if r.record else "-",
                f"{r.record.policy}@{r.record.generation}" if r.record else "-",
            ]
        body.append(cells)
    return table(header, body)


def rows_json(rows: Sequence[GateRow], now: datetime.datetime) -> dict[str, Any]:
    """The same facts, machine-readable, with absolute times and seconds as numbers."""
    items = []
    for r in rows:
        deadline = r.deadline
        items.append(
            {
                "namespace": r.namespace,
                "pod": r.pod,
                "gate": r.gate,
                "condition": r.record.condition if r.record else None,
                "policy": r.record.policy if r.record else None,
                "policyGeneration": r.record.generation if r.record else None,
                "createdAt": timeutil.format_time(r.created) if r.created else None,
                "ageSeconds": int((now - r.created).total_seconds()) if r.created else None,
                "deadline": r.record.deadline if r.record else None,
                "remainingSeconds": (
                    int((deadline - now).total_seconds()) if deadline is not None else None
                ),
                "expired": deadline is not None and deadline <= now,
                "onExpiry": r.record.on_expiry if r.record else None,
                "attempts": r.record.attempts if r.record else None,
                "review": r.review,
                "state": r.state,
                "recorded": r.record is not None,
            }
        )
    return {"items": items}


async def list_gates(
    rest: Rest,
    namespace: str | None,
    output: str,
    clock: timeutil.Clock = timeutil.SYSTEM_CLOCK,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Print the gated pods of `namespace` (None: all namespaces the caller may list)."""
    path = PODS.path(namespace)
    try:
        pods, _ = await rest.list_pages(path, {"labelSelector": f"{gates.LABEL_GATED}=true"})
    except ApiError as e:
        print(f"error: cannot list pods: {e.message} ({e.status} {e.reason})", file=err)
        return 1
    rows = gate_rows(pods)
    t = clock.now()
    if output == "json":
        print(json.dumps(rows_json(rows, t), indent=2), file=out)
        return 0
    if not rows:
        where = f"in namespace {namespace}" if namespace else "in any namespace"
        print(f"No pods hold Pilotfish gates {where}.", file=err)
        return 0
    print(render_table(rows, t, wide=output == "wide"), file=out)
    return 0
