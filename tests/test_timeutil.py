"""One parser for the API server's times: offsets, fractions, malformed and absent values."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from pilotfish.timeutil import format_time, parse_time, parse_time_or_none

T = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    "text",
    [
        "2026-01-02T03:04:05Z",
        "2026-01-02T03:04:05+00:00",
        "2026-01-02T03:04:05",
        "2026-01-02T04:04:05+01:00",
    ],
)
def test_parse_time_is_utc_whatever_the_spelling(text: str) -> None:
    assert parse_time(text) == T
    assert parse_time("2026-01-02T03:04:05.250000Z") == T + datetime.timedelta(milliseconds=250)


@pytest.mark.parametrize("value", [None, "", "yesterday", 17])
def test_parse_time_or_none_never_raises(value: Any) -> None:
    assert parse_time_or_none(value) is None


def test_format_round_trips() -> None:
    assert format_time(T) == "2026-01-02T03:04:05Z"
    assert parse_time(format_time(T)) == T
