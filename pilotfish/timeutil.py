"""Time as the API server writes it (RFC 3339, UTC), parsed and formatted in one place.

Every part reads timestamps from objects (creationTimestamp, condition and lease times,
gate deadlines); one parser means one answer to "is this malformed" and one timezone rule
(a time without an offset is UTC).
"""

from __future__ import annotations

import datetime
from typing import Any


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def format_time(t: datetime.datetime) -> str:
    """RFC 3339 to the second, as metav1.Time serialises."""
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(s: str) -> datetime.datetime:
    """An RFC 3339 time (with or without fraction); ValueError if it is not one."""
    t = datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=datetime.UTC)


def parse_time_or_none(value: Any) -> datetime.datetime | None:
    """Like `parse_time`, but None for an absent or malformed value: for reading objects
    whose bad fields are reported by the caller, not raised."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None
