"""Time, in the two kinds a controller may use, and the API server's RFC 3339 forms.

Elapsed time (deadlines, backoff, pacing, liveness) is measured only on this process's
monotonic clock: another machine's timestamps, or this machine's wall clock after an NTP
step, would make a silent lease look fresh or a live one dead. Wall time is read only to
write timestamps into objects. Both come from one injected `Clock`, so tests move time
instead of sleeping.

Every part reads timestamps from objects (creationTimestamp, condition and lease times,
gate deadlines); one parser means one answer to "is this malformed" and one timezone rule
(a time without an offset is UTC).
"""

from __future__ import annotations

import datetime
import time
from typing import Any, Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never jumps: for elapsed time only."""
        ...

    def now(self) -> datetime.datetime:
        """Wall time (UTC): only for timestamps written into API objects."""
        ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC)


SYSTEM_CLOCK: Clock = SystemClock()


class FakeClock:
    """Both clocks advanced together by `advance`, for tests."""

    def __init__(
        self,
        start: datetime.datetime = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        monotonic_start: float = 1000.0,
    ) -> None:
        self._now = start
        self._mono = monotonic_start

    def monotonic(self) -> float:
        return self._mono

    def now(self) -> datetime.datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        self._mono += seconds
        self._now += datetime.timedelta(seconds=seconds)


def utcnow() -> datetime.datetime:
    """Wall time from the system clock, for code without an injected Clock (CLI commands)."""
    return SYSTEM_CLOCK.now()


def format_time(t: datetime.datetime) -> str:
    """RFC 3339 to the second, as metav1.Time serialises."""
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(t: datetime.datetime) -> str:
    """RFC 3339 to the microsecond, as metav1.MicroTime serialises (Events, Leases)."""
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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
