"""Text output of the kubectl plugin: durations and tables shaped like kubectl's own.

On-call reads these next to `kubectl get` output at 3 a.m.; using kubectl's conventions
(left-aligned columns three spaces apart, upper-case headers, `4m12s`-style ages) means
nothing has to be learnt twice.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence


def human_duration(seconds: float) -> str:
    """A duration the way kubectl prints ages (k8s.io/apimachinery duration.HumanDuration).

    Precision drops as the duration grows: `45s`, `4m12s`, `2h5m`, `3d4h`, `40d`, `2y30d`, `9y`.
    Negative durations (clock skew between client and server) print as `0s`.
    """
    s = int(max(seconds, 0))
    if s < 60 * 2:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        rest_m = minutes % 60
        return f"{hours}h{rest_m}m" if rest_m else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest_h = hours % 24
        return f"{hours // 24}d{rest_h}h" if rest_h else f"{hours // 24}d"
    days = hours // 24
    if days < 365 * 2:
        return f"{days}d"
    if days < 365 * 8 and days % 365:
        return f"{days // 365}y{days % 365}d"
    return f"{days // 365}y"


def ago(then: datetime.datetime | None, now: datetime.datetime) -> str:
    """`4m ago`, or `unknown time ago` when the timestamp is missing."""
    if then is None:
        return "an unknown time ago"
    return f"{human_duration((now - then).total_seconds())} ago"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, three spaces apart; no trailing blanks."""
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in (header, *rows):
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("   ".join(cells).rstrip())
    return "\n".join(lines)
