"""What the API server and /proc say about a process: its watches, lists and memory.

Pure (fed text and audit events) except `AuditTail`, which follows the audit log file.
`benchmarks/operator_memory` counts the operator's watches with these; they live beside it
(not as a `benchmarks/*.py` module, each of which `make bench` runs) so they can be tested.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Final
from urllib.parse import parse_qs, urlsplit

from prometheus_client.parser import text_string_to_metric_families

from pilotfish import names

OPERATOR_USER: Final = f"system:serviceaccount:{names.SYSTEM_NAMESPACE}:{names.SA_OPERATOR}"


def samples(text: str, family: str) -> Iterator[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of one metric family in a Prometheus text page."""
    for fam in text_string_to_metric_families(text):
        if fam.name == family:
            for s in fam.samples:
                yield s.labels, s.value


def apiserver_watches(text: str) -> dict[str, int]:
    """Open watches by resource (`group/resource`, core resources bare) from the API server's
    metrics: `apiserver_longrunning_requests{verb="WATCH"}` summed over scopes, else the
    pre-1.25 `apiserver_registered_watchers` (by kind)."""
    out: Counter[str] = Counter()
    for labels, value in samples(text, "apiserver_longrunning_requests"):
        if labels.get("verb") == "WATCH" and not labels.get("subresource"):
            group, resource = labels.get("group", ""), labels.get("resource", "")
            out[f"{group}/{resource}" if group else resource] += int(value)
    if not out:
        for labels, value in samples(text, "apiserver_registered_watchers"):
            group, kind = labels.get("group", ""), labels.get("kind", "")
            out[f"{group}/{kind}" if group else kind] += int(value)
    return dict(out)


def watch_delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Watches per resource that appeared between two readings (non-zero changes only)."""
    keys = set(before) | set(after)
    return {k: d for k in sorted(keys) if (d := after.get(k, 0) - before.get(k, 0))}


@dataclass(frozen=True, order=True)
class WatchKey:
    """What one informer (or kopf watcher) lists and watches: one of these, one watch."""

    resource: str  # group/resource, core resources bare
    namespace: str = ""
    label_selector: str = ""
    field_selector: str = ""

    def describe(self) -> dict[str, str]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v}


def watch_key(event: Mapping[str, Any]) -> WatchKey:
    ref = event.get("objectRef") or {}
    query = parse_qs(urlsplit(str(event.get("requestURI", ""))).query)
    group = ref.get("apiGroup", "")
    resource = str(ref.get("resource", ""))
    return WatchKey(
        f"{group}/{resource}" if group else resource,
        str(ref.get("namespace", "")),
        (query.get("labelSelector") or [""])[0],
        (query.get("fieldSelector") or [""])[0],
    )


def client_of(event: Mapping[str, Any]) -> str:
    return "kopf" if str(event.get("userAgent", "")).startswith("kopf/") else "runtime"


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


@dataclass
class Ledger:
    """One process's lists and watches, from the API server's audit events (pure: fed events).

    A watch is open from its ResponseStarted until its ResponseComplete. Only requests
    received at or after `since` (when the process under test started) count."""

    since: datetime
    user: str = OPERATOR_USER
    open: dict[str, tuple[WatchKey, str, datetime]] = field(default_factory=dict)
    listed: dict[WatchKey, datetime] = field(default_factory=dict)
    last_change: datetime | None = None

    def feed(self, event: Mapping[str, Any]) -> None:
        if (event.get("user") or {}).get("username") != self.user:
            return
        verb, stage = event.get("verb"), event.get("stage")
        received = _time(str(event.get("requestReceivedTimestamp")))
        if verb == "watch" and stage == "ResponseComplete":
            self.open.pop(str(event.get("auditID")), None)
        if received < self.since:
            return
        if verb == "list" and stage == "ResponseComplete":
            self.listed[watch_key(event)] = _time(str(event.get("stageTimestamp")))
            self.last_change = received
        elif verb == "watch" and stage == "ResponseStarted":
            self.open[str(event["auditID"])] = (watch_key(event), client_of(event), received)
            self.last_change = received

    def watches(self) -> Counter[tuple[WatchKey, str]]:
        return Counter((key, client) for key, client, _ in self.open.values())

    def unwatched(self) -> list[WatchKey]:
        """Listed keys with no watch opened after their last list: not synced yet."""
        started: dict[WatchKey, datetime] = {}
        for key, _, at in self.open.values():
            started[key] = max(at, started.get(key, at))
        return sorted(k for k, t in self.listed.items() if k not in started or started[k] < t)

    def quiet_for(self, now: datetime) -> float:
        """Seconds since the process last listed or opened a watch (or since it started)."""
        return (now - (self.last_change or self.since)).total_seconds()


def watch_table(counts: Mapping[tuple[WatchKey, str], int]) -> list[dict[str, Any]]:
    return [
        {**key.describe(), "client": client, "watches": n}
        for (key, client), n in sorted(counts.items())
    ]


def most_watches_per_key(counts: Mapping[tuple[WatchKey, str], int]) -> int:
    """The most watches one (resource, namespace, selector) has in the process, whichever
    client (runtime or kopf) holds them: two clients watching the same view is two."""
    per_key: Counter[WatchKey] = Counter()
    for (key, _), n in counts.items():
        per_key[key] += n
    return max(per_key.values(), default=0)


def several_watches(counts: Mapping[tuple[WatchKey, str], int]) -> list[dict[str, Any]]:
    """The views watched more than once in the process, with who holds the watches."""
    per_key: dict[WatchKey, Counter[str]] = {}
    for (key, client), n in counts.items():
        per_key.setdefault(key, Counter())[client] += n
    return [
        {**key.describe(), "watches": dict(clients)}
        for key, clients in sorted(per_key.items())
        if sum(clients.values()) > 1
    ]


def proc_memory(status_text: str) -> dict[str, float]:
    """VmRSS and VmHWM (peak) in MB from the text of /proc/PID/status."""
    out = {}
    for line in status_text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = round(int(rest.split()[0]) / 1024, 1)  # kB
    return out


class AuditTail:
    """Follows the API server's audit log across rotation: the open file is read to its end
    before a new file at the same path is opened; a half-written last line waits."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: IO[bytes] | None = None
        self.pending = b""

    def events(self) -> Iterator[dict[str, Any]]:
        while True:
            if self.file is None:
                try:
                    self.file = self.path.open("rb")
                except FileNotFoundError:
                    return
            while chunk := self.file.read(1 << 20):
                *lines, self.pending = (self.pending + chunk).split(b"\n")
                yield from (json.loads(line) for line in lines if line.strip())
            try:
                rotated = os.stat(self.path).st_ino != os.fstat(self.file.fileno()).st_ino
            except FileNotFoundError:
                rotated = False
            if not rotated:
                return
            self.file.close()
            self.file, self.pending = None, b""
