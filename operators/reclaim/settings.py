"""The reclaim controller's settings, from the operator's environment, and the PromQL it asks.

A bad value stops the operator at start-up with an error naming the variable, the value and
the rule: a margin of 1.5 or a window of "an hour" must not become a figure on every node.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

ENV_URL: Final = "PILOTFISH_PROMETHEUS_URL"
ENV_INTERVAL: Final = "PILOTFISH_RECLAIM_INTERVAL_SECONDS"
ENV_WINDOW: Final = "PILOTFISH_RECLAIM_WINDOW"
ENV_MARGIN: Final = "PILOTFISH_RECLAIM_MARGIN"
ENV_STALE_AFTER: Final = "PILOTFISH_RECLAIM_STALE_AFTER_SECONDS"

_UNIT_SECONDS: Final = {
    "ms": 0.001,
    "s": 1,
    "m": 60,
    "h": 3600,
    "d": 86400,
    "w": 7 * 86400,
    "y": 365 * 86400,
}
# Prometheus durations: number-unit pairs, largest unit first ("1h30m").
_DURATION: Final = re.compile(r"^(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?$")
_PART: Final = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
# Points of the p95 subquery over the window: enough for a 95th percentile to mean
# something, few enough that a cycle's query stays cheap over thousands of pods.
STEPS_PER_WINDOW: Final = 60
MIN_STEP_SECONDS: Final = 1


def duration_seconds(name: str, value: str) -> float:
    """A positive Prometheus duration in seconds; ValueError naming `name` otherwise."""
    if not value or not _DURATION.match(value):
        raise ValueError(f"{name}={value!r}: must be a Prometheus duration such as 1h or 2m")
    total = sum(int(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(value))
    if total <= 0:
        raise ValueError(f"{name}={value!r}: must be longer than 0")
    return float(total)


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: must be a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{name}={raw!r}: must be a finite number")
    return value


def _larger(a: str, b: str) -> str:
    """Element-wise max of two vectors with the same labels; a series in only one is kept."""
    return f"(({a}) > ({b})) or ({b}) or ({a})"


@dataclass(frozen=True)
class ReclaimSettings:
    prometheus_url: str | None = None  # None: reclaim is off
    interval: float = 60.0
    window: str = "1h"
    margin: float = 0.10  # of each node's allocatable
    stale_after: float = 180.0

    @property
    def enabled(self) -> bool:
        return bool(self.prometheus_url)

    @property
    def step(self) -> str:
        """The p95 subquery's resolution: the window in `STEPS_PER_WINDOW` points."""
        seconds = duration_seconds(ENV_WINDOW, self.window) / STEPS_PER_WINDOW
        return f"{max(MIN_STEP_SECONDS, math.floor(seconds))}s"

    def cpu_p95(self) -> str:
        """Per pod, the larger of its p95 over the window and its rate now (the last two
        samples): a rise in production's usage gives capacity back at the next cycle, not
        once it fills 5 % of the window (3 minutes of an hour)."""
        now = "sum by (node, namespace, pod) (irate(pod_cpu_usage_seconds_total[2m]))"
        p95 = (
            "quantile_over_time(0.95, (sum by (node, namespace, pod) "
            f"(rate(pod_cpu_usage_seconds_total[1m])))[{self.window}:{self.step}])"
        )
        return _larger(p95, now)

    def memory_p95(self) -> str:
        """As `cpu_p95`: the larger of the p95 and the working set now."""
        now = "sum by (node, namespace, pod) (pod_memory_working_set_bytes)"
        p95 = f"quantile_over_time(0.95, ({now})[{self.window}:{self.step}])"
        return _larger(p95, now)

    @staticmethod
    def freshness() -> str:
        return "time() - max by (node) (timestamp(node_memory_working_set_bytes))"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ReclaimSettings:
        """From PILOTFISH_PROMETHEUS_URL and PILOTFISH_RECLAIM_*; unset ones keep the
        defaults."""
        env = os.environ if env is None else env
        d = cls()
        url = (env.get(ENV_URL) or "").strip() or None
        if url is not None and not re.match(r"^https?://[^/\s]+", url):
            raise ValueError(f"{ENV_URL}={url!r}: must be an http:// or https:// URL")
        interval = _number(env, ENV_INTERVAL, d.interval)
        if interval < 1:
            raise ValueError(f"{ENV_INTERVAL}={interval:g}: must be at least 1 (seconds)")
        window = (env.get(ENV_WINDOW) or "").strip() or d.window
        if duration_seconds(ENV_WINDOW, window) < 60:
            raise ValueError(f"{ENV_WINDOW}={window!r}: must be at least 1m (a 1m rate inside)")
        margin = _number(env, ENV_MARGIN, d.margin)
        if not 0 <= margin < 1:
            raise ValueError(f"{ENV_MARGIN}={margin:g}: must be at least 0 and below 1")
        stale_after = _number(env, ENV_STALE_AFTER, d.stale_after)
        if stale_after <= 0:
            raise ValueError(f"{ENV_STALE_AFTER}={stale_after:g}: must be above 0 (seconds)")
        return cls(url, interval, window, margin, stale_after)
