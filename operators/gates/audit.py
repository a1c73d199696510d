"""The gate audit log: one JSON line per release or expiry, written after the API accepted it.

On-call's safe cancel/release procedure and every post-mortem read this file, so each line
says what happened to which pod (name and uid), which gate, on what evidence, at which
resourceVersion, and which controller instance did it. A line is written only once the write
it records has succeeded, and flushed at once: a process killed with SIGKILL loses no line
that it had written (the page cache outlives the process). The same record also goes to the
structured stderr log, for clusters that collect logs rather than files.

Every field of a line is the controller's own observation: what it removed, when, on the
evidence it evaluated, in its own words. Nothing is copied from a pod's annotations, so no
one who can write a pod can put text or a time into the audit log. A release that committed
without its line (the process died before writing it, or the API's answer was lost) is
audited when the controller sees the result (`unaudited_releases`), at the time it sees it,
saying so.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any, Final, Literal

from pilotfish.operators.gates.model import OWNER, PodView
from pilotfish.timeutil import format_micro_time

log = logging.getLogger("pilotfish.gates.audit")

Decision = Literal["released", "expired-fail", "expired-retry", "expired-review"]
DECISIONS: Final = ("released", "expired-fail", "expired-retry", "expired-review")


class AuditLog:
    def __init__(self, path: Path | None, actor: str) -> None:
        self.path = path
        self.actor = actor
        self._file: IO[str] | None = None
        # (pod uid, gate) of every `released` line in the file; read once, on first need.
        self._released: set[tuple[str, str]] | None = None

    def _open(self) -> IO[str] | None:
        if self.path is None:
            return None
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        return self._file

    def record(
        self,
        *,
        ts: datetime.datetime,
        namespace: str,
        name: str,
        uid: str,
        gate: str,
        decision: Decision,
        evidence: str,
        resource_version: str,
        decided_from: str = "",
    ) -> dict[str, Any]:
        """Append one line (and log it); returns the record written."""
        line: dict[str, Any] = {
            "ts": format_micro_time(ts),
            "pod": f"{namespace}/{name}",
            "uid": uid,
            "gate": gate,
            "decision": decision,
            "evidence": evidence,
            "resourceVersion": resource_version,
            "decidedFrom": decided_from,
            "actor": self.actor,
        }
        f = self._open()
        if f is not None:
            f.write(json.dumps(line, sort_keys=True) + "\n")
            f.flush()
        if decision == "released" and self._released is not None:
            self._released.add((uid, gate))
        log.info("gate %s", decision, extra={"audit": line})
        return line

    def complete(self, pods: Iterable[PodView], now: datetime.datetime, prefix: str) -> None:
        """Audit the releases that committed without their line (the process died between
        the write and the audit, or the API's answer was lost), as this process sees them
        now. Needs the file, read once per process; without one there is nothing to do."""
        if self.path is None:
            return
        if self._released is None:
            self._released = released_keys(self.path)
        for p, g in unaudited_releases(pods, self._released, prefix):
            self.record(
                ts=now,
                namespace=p.namespace,
                name=p.name,
                uid=p.uid,
                gate=g,
                decision="released",
                evidence=f"{g} was released by this controller without its line being "
                "written (the process stopped before writing it, or the API's answer was "
                f"lost): audited by {self.actor} when it saw the pod without the gate and "
                "with the controller's release mark",
                resource_version=p.resource_version,
            )

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def unaudited_releases(
    pods: Iterable[PodView], audited: set[tuple[str, str]], actor_prefix: str
) -> list[tuple[PodView, str]]:
    """(pod, gate) of each release the controller committed without auditing it.

    The controller marks every gate it removes in `gates.pilotfish.io/released`, in the
    same write that removes it, and only the operator may write that annotation
    (`pilotfish.podmeta`). The mark only says *which* releases to look for: a gate counts
    when it is gone from the pod, was one of ours in the record, is marked by this
    controller, and has no `released` line yet. What the line says is not taken from it.
    """
    out: list[tuple[PodView, str]] = []
    for p in pods:
        for g, entry in sorted(p.released_log.items()):
            rec = p.record.get(g)
            if (
                g in p.scheduling_gates
                or (p.uid, g) in audited
                or rec is None
                or rec.owner != OWNER
                or not entry.get("actor", "").startswith(actor_prefix)
            ):
                continue
            out.append((p, g))
    return out


def released_keys(path: Path) -> set[tuple[str, str]]:
    """(pod uid, gate) of every `released` line already in the file."""
    return {
        (str(r.get("uid")), str(r.get("gate")))
        for r in read(path)
        if r.get("decision") == "released"
    }


def read(path: Path) -> list[dict[str, Any]]:
    """Every complete record of an audit file (the controller after a restart, tests and
    on-call tooling read it back). A last line without its newline is still being written,
    or was cut by a crash; it and any undecodable line are skipped, with a warning for the
    latter, so one bad line never stops the controller from reading the rest."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    out: list[dict[str, Any]] = []
    complete = text.split("\n")[:-1]  # whatever follows the last newline is unfinished
    for n, line in enumerate(complete, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            log.warning("unreadable audit line skipped", extra={"path": str(path), "line": n})
            continue
        if isinstance(record, dict):
            out.append(record)
    return out
