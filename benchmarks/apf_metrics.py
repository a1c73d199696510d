"""The API server's own account of API Priority and Fairness, per priority level, from
/metrics: how many requests waited in its queues and for how long, how many it refused (429),
and how many seats the level had. Without it a benchmark could not tell queuing (what APF
controls) from CPU contention (what it does not)."""

from __future__ import annotations

import re
from typing import Any

from pilotfish.kube.rest import Rest

_LINE = re.compile(r"^(apiserver_flowcontrol_[a-z_]+)\{([^}]*)\}\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
# metric name -> the key it is summed under, per priority level
_KEPT = {
    "apiserver_flowcontrol_request_wait_duration_seconds_count": "requests",
    "apiserver_flowcontrol_request_wait_duration_seconds_sum": "wait_seconds",
    "apiserver_flowcontrol_rejected_requests_total": "rejected",
    "apiserver_flowcontrol_nominal_limit_seats": "nominal_seats",
    "apiserver_flowcontrol_current_limit_seats": "current_seats",
}
_GAUGES = {"nominal_seats", "current_seats"}


def parse(text: str, levels: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Per level in `levels`: the counters summed over flow schemas, and the seat gauges."""
    out: dict[str, dict[str, float]] = {level: {} for level in levels}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m or m.group(1) not in _KEPT:
            continue
        labels = dict(_LABEL.findall(m.group(2)))
        level = labels.get("priority_level") or labels.get("priorityLevel")
        if level not in out:
            continue
        key = _KEPT[m.group(1)]
        out[level][key] = out[level].get(key, 0.0) + float(m.group(3))
    return out


def delta(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> Any:
    """What happened in between: counters as differences, seat gauges as read at the end."""
    out: dict[str, dict[str, float]] = {}
    for level, now in after.items():
        then = before.get(level, {})
        out[level] = {
            k: round(v if k in _GAUGES else v - then.get(k, 0.0), 4) for k, v in sorted(now.items())
        }
    return out


async def scrape(rest: Rest, levels: tuple[str, ...]) -> dict[str, dict[str, float]]:
    resp = await rest.api.send(
        "GET",
        "/metrics",
        params=None,
        headers={"Accept": "text/plain"},
        body=None,
        request_timeout=30,
    )
    return parse((await resp.read()).decode(), levels)
