"""Durations read from the environment, refused with the variable, the value and the rule."""

from __future__ import annotations

import os


def seconds_from_env(name: str, default: float, *, at_most: float | None = None) -> float:
    """`name` as seconds, `default` when unset or empty; a value that is not a number, is
    negative or is above `at_most` raises ValueError naming the variable and the rule."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: must be a number of seconds") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r}: must not be negative")
    if at_most is not None and value > at_most:
        raise ValueError(f"{name}={raw!r}: must be at most {at_most:g} seconds")
    return value
