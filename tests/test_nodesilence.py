"""Lease silence is measured on this process's clock from renewals it saw, never from the
lease's renewTime against the local wall clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pilotfish.nodesilence import MODE_UPSTREAM, NodeSilence, SilenceSettings
from pilotfish.timeutil import FakeClock


def lease(name: str, renew: str, rv: str) -> dict[str, object]:
    return {"metadata": {"name": name, "resourceVersion": rv}, "spec": {"renewTime": renew}}


def test_silence_counts_from_the_last_renewal_this_process_saw() -> None:
    clock = FakeClock()
    silence = NodeSilence(clock)
    assert silence.silent_for("n1") is None  # never seen: not judged
    silence._on_lease("ADDED", lease("n1", "2000-01-01T00:00:00Z", "1"), None)
    clock.advance(30)
    assert silence.silent_for("n1") == pytest.approx(30)
    # The same renewal seen again (a resync) is not a renewal.
    silence._on_lease("MODIFIED", lease("n1", "2000-01-01T00:00:00Z", "1"), None)
    assert silence.silent_for("n1") == pytest.approx(30)
    # A renewal whose renewTime is far in the past still counts as seen now: the node's wall
    # clock is not ours.
    silence._on_lease("MODIFIED", lease("n1", "1999-01-01T00:00:00Z", "2"), None)
    assert silence.silent_for("n1") == pytest.approx(0)


def test_listeners_hear_each_renewal_and_deleted_leases_are_forgotten() -> None:
    clock = FakeClock()
    silence = NodeSilence(clock)
    heard: list[str] = []
    silence.add_listener(heard.append)
    silence._on_lease("ADDED", lease("n1", "t1", "1"), None)
    silence._on_lease("MODIFIED", lease("n1", "t1", "1"), None)
    silence._on_lease("MODIFIED", lease("n1", "t2", "2"), None)
    assert heard == ["n1", "n1"]
    silence._on_lease("DELETED", lease("n1", "t2", "2"), None)
    assert silence.silent_for("n1") is None
    assert silence.nodes() == []


@given(st.lists(st.tuples(st.floats(0, 100), st.booleans()), max_size=30))
def test_silence_is_never_longer_than_the_time_since_the_last_change(
    steps: list[tuple[float, bool]],
) -> None:
    clock = FakeClock()
    silence = NodeSilence(clock)
    silence.observe("n", ("t", "0"))
    since_change = 0.0
    for i, (dt, renewed) in enumerate(steps):
        clock.advance(dt)
        since_change += dt
        if renewed:
            silence.observe("n", ("t", str(i + 1)))
            since_change = 0.0
        assert silence.silent_for("n") == pytest.approx(since_change)


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert SilenceSettings.from_env() == SilenceSettings()
    monkeypatch.setenv("PILOTFISH_NODE_UNREACHABLE_SECONDS", "20")
    monkeypatch.setenv("PILOTFISH_AT_MOST_ONE_MARGIN_SECONDS", "5")
    monkeypatch.setenv("PILOTFISH_NODE_LIFECYCLE", MODE_UPSTREAM)
    s = SilenceSettings.from_env()
    assert (s.unreachable_after, s.at_most_one_release_after, s.mode) == (20, 25, MODE_UPSTREAM)


@pytest.mark.parametrize(
    ("var", "value", "says"),
    [
        ("PILOTFISH_NODE_UNREACHABLE_SECONDS", "soon", "must be a number"),
        ("PILOTFISH_EVICTION_WAIT_SECONDS", "-1", "must not be negative"),
        ("PILOTFISH_NODE_LIFECYCLE", "kubelet", "must be one of"),
    ],
)
def test_bad_settings_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str, says: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=f"{var}={value!r}: {says}"):
        SilenceSettings.from_env()
