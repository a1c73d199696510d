"""Leader election decisions: table-driven over (lease, identity, now)."""

from __future__ import annotations

import datetime

import pytest

from pilotfish.kube.leader import LeaseView, Verdict, decide, view

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def lease(holder: str | None, renewed_ago: float | None, duration: int = 15) -> LeaseView:
    renew = None if renewed_ago is None else T0 - datetime.timedelta(seconds=renewed_ago)
    return LeaseView(holder, renew, duration, 0, "1")


@pytest.mark.parametrize(
    ("current", "verdict"),
    [
        (None, Verdict.CREATE),
        (lease("me", 100), Verdict.RENEW),
        (lease("other", 1), Verdict.WAIT),
        (lease("other", 14.9), Verdict.WAIT),
        (lease("other", 15), Verdict.TAKE_OVER),
        (lease("other", 60), Verdict.TAKE_OVER),
        (lease("", 1), Verdict.TAKE_OVER),
        (lease("other", None), Verdict.TAKE_OVER),
    ],
)
def test_decide(current: LeaseView | None, verdict: Verdict) -> None:
    assert decide(current, "me", T0) is verdict


def test_view_parses_the_api_object() -> None:
    v = view(
        {
            "metadata": {"resourceVersion": "42"},
            "spec": {
                "holderIdentity": "a",
                "renewTime": "2026-01-01T00:00:00.000000Z",
                "leaseDurationSeconds": 15,
                "leaseTransitions": 3,
            },
        }
    )
    assert v == LeaseView("a", T0, 15, 3, "42")
    assert view(None) is None
