"""The status phase of a round, last: the State condition of each pod that still holds a
Pilotfish gate after the round's writes, and the review flag of pods whose records are untrusted.

The condition speaks for a gated pod only. A release is one write, the conditional gate
patch, which also carries the release mark (`gates.pilotfish.io/released`: when, on what
evidence, from which version, by whom); the API server ignores status in a pods patch, so a
condition saying "released" would be a second write per pod, at the API server's cost, for a
fact the pod already shows (no Pilotfish gate in its spec, the mark) and the audit log keeps.
What happens to a released pod next is the scheduler's PodScheduled and the kubelet's phase.
So the last condition a released pod carries is the one from its gated phase, and its
`observedGeneration` (the pod's generation it describes) is older than the pod's: the gate
patch changed the spec.

A condition is written only when it differs from what the pod already shows, and its message
uses each verdict's `summary`, which changes only when the reason does: a moving quota does
not rewrite the status of every waiting pod.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from pilotfish import gates, timeutil
from pilotfish.operators.gates.model import PodView
from pilotfish.operators.gates.plan import Flag, Progress, SetCondition, kind
from pilotfish.operators.gates.terms import REASON_UNTRUSTED

MESSAGE_MAX: Final = 2000


def untrusted_message(p: PodView, held: Sequence[str]) -> str:
    parts = [f"{g} ({p.untrusted[g]})" for g in held]
    return (
        f"held, record does not match its GatePolicy: {'; '.join(parts)}; nothing releases "
        "it on the record's terms: release or cancel it with `kubectl pilotfish gates` "
        f"(label {gates.LABEL_REVIEW}=required)"
    )


def state(prog: Progress, p: PodView) -> tuple[str, str, str] | None:
    """(status, reason, message) of the pod's State condition after this round; None once
    it holds no Pilotfish gate (released: the condition is not written again)."""
    now = prog.now
    if p.key in prog.failing:
        e = prog.failing[p.key]
        rec = p.record[e.gate]
        return (
            "False",
            gates.STATE_EXPIRED,
            f"{e.gate} expired at {e.deadline} (timeout {rec.timeout_seconds}s, onExpiry "
            f"Fail): {e.evidence}; the pod is deleted",
        )
    gone = prog.removed.get(p.key, {})
    remaining = [g for g in p.pilotfish_gates if g not in gone]
    if not remaining:
        return None
    held = [g for g in remaining if g in p.untrusted]
    if held:
        return ("False", REASON_UNTRUSTED, untrusted_message(p, held))
    review = [
        g
        for g in remaining
        if p.managed(g)
        and p.record[g].on_expiry == "Review"
        and (p.deadline(g) or now) <= now
        and (p.review_flagged or g in prog.reviewing.get(p.key, []))
    ]
    if review:
        g = review[0]
        return (
            "False",
            gates.STATE_EXPIRED,
            f"{g} expired at {p.record[g].deadline} (onExpiry Review): waiting for a "
            f"person to review (label {gates.LABEL_REVIEW}=required)",
        )
    if p.key in prog.paced:
        return (
            "False",
            gates.STATE_GATED,
            f"conditions met; queued by the release pacing of namespace {p.namespace}",
        )
    parts = []
    for g in remaining:
        v = prog.verdicts[p.key].get(g) or prog.joint.get(p.key, {}).get(g)
        if v is not None:
            brief = v.brief
        elif kind(p, g) == "Quota":
            brief = "quota checked once the other gates are met"
        else:
            brief = "waiting"
        parts.append(f"{g} ({brief})")
    return ("False", gates.STATE_GATED, "waiting for " + "; ".join(parts))


def flag(prog: Progress, p: PodView) -> None:
    """Flag a pod holding an untrusted gate, until its condition shows it was."""
    held = [g for g in p.pilotfish_gates if g in p.untrusted]
    if not held or p.key in prog.failing:
        return
    shown = p.state is not None and p.state.reason == REASON_UNTRUSTED
    if p.review_flagged and shown:
        return
    for g in held:
        prog.actions.append(Flag(p, g, p.untrusted[g]))


def conditions(prog: Progress, pods: Sequence[PodView]) -> None:
    """A SetCondition for each still-gated pod whose State condition changes, or whose
    condition describes an older generation of the pod than it has now."""
    for p in pods:
        got = state(prog, p)
        if got is None:
            continue
        status, reason, message = got
        message = message[:MESSAGE_MAX]
        cur = p.state
        if (
            cur
            and (cur.status, cur.reason, cur.message) == (status, reason, message)
            and cur.observed_generation in (0, p.generation)
        ):
            continue
        ltt = (
            cur.last_transition_time
            if cur and cur.status == status and cur.last_transition_time
            else timeutil.format_time(prog.now)
        )
        prog.actions.append(SetCondition(p, status, reason, message, ltt))
