"""The expiry phase of a round: a gate still unmet at its deadline is never removed silently.

Fail marks the pod Expired and deletes it, Retry extends the deadline with exponential
backoff, Review flags the pod for a person. A gate whose condition holds and that only waits
for pacing does not expire: the wait is this controller's own throttling. Deadlines are the
record's wall-clock timestamps, so they are compared with the round's wall time.
"""

from __future__ import annotations

import datetime
from dataclasses import replace

from pilotfish import timeutil
from pilotfish.gates import GateRecord, PodGates
from pilotfish.operators.gates.model import PodView
from pilotfish.operators.gates.plan import Expire, Progress, UpdateRecord, kind


def retry_backoff(rec: GateRecord) -> int:
    """Seconds added to the deadline by the next Retry: initial * 2**attempts, capped."""
    return int(min(rec.initial_backoff_seconds * 2**rec.attempts, rec.max_backoff_seconds))


def retried(rec: GateRecord, now: datetime.datetime) -> GateRecord:
    deadline = now + datetime.timedelta(seconds=retry_backoff(rec))
    return replace(rec, deadline=timeutil.format_time(deadline), attempts=rec.attempts + 1)


def why(prog: Progress, p: PodView, g: str) -> str:
    """The evidence that gate `g` of `p` is unmet, as the earlier phases found it."""
    if g in prog.verdicts[p.key]:
        return prog.verdicts[p.key][g].evidence
    if g in prog.joint.get(p.key, {}):
        return prog.joint[p.key][g].evidence
    if kind(p, g) == "Quota":
        return f"quota not checked: waiting for {prog.first_unmet(p) or 'its other gates'}"
    return prog.waiting.get(p.key, "condition not met")


def expire(prog: Progress, p: PodView, removing: set[str]) -> None:
    """Add the expiry actions of `p` (none for the gates this round removes)."""
    now = prog.now
    fails: list[str] = []
    retries: list[str] = []
    reviews: list[str] = []
    for g in p.pilotfish_gates:
        if g in removing or not p.managed(g):
            continue
        deadline = p.deadline(g)
        if deadline is None:
            continue
        if deadline > now:
            prog.wake_at(deadline)
            continue
        if p.key in prog.paced:
            continue  # conditions met; only our own pacing holds it
        action = p.record[g].on_expiry
        if action == "Fail":
            fails.append(g)
        elif action == "Retry":
            retries.append(g)
        elif not p.review_flagged:
            reviews.append(g)
    if fails:
        g = fails[0]
        exp = Expire(p, g, "Fail", why(prog, p, g), p.record[g].deadline)
        prog.failing[p.key] = exp
        prog.actions.append(exp)
        return
    if retries:
        new = dict(p.record)
        for g in retries:
            new[g] = retried(p.record[g], now)
            prog.wake_at(timeutil.parse_time(new[g].deadline))
        encoded = PodGates(created=p.record_created, gates=new).encode()
        prog.actions.append(UpdateRecord(p, encoded, tuple(retries)))
        for g in retries:
            prog.actions.append(
                Expire(
                    p,
                    g,
                    "Retry",
                    why(prog, p, g),
                    p.record[g].deadline,
                    next_deadline=new[g].deadline,
                    attempts=new[g].attempts,
                )
            )
    for g in reviews:
        prog.actions.append(Expire(p, g, "Review", why(prog, p, g), p.record[g].deadline))
    if reviews:
        prog.reviewing[p.key] = reviews
