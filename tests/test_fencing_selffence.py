"""`pilotfish.fencing.SelfFence`: the holder's own deadline, 30 s from the send of its last
successful renewal, so it always stops before the controller may replace it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pilotfish.fencing import SelfFence


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_holder_stops_30_s_after_the_send_of_its_last_renewal() -> None:
    clock = Clock()
    fence = SelfFence(clock=clock)
    assert not fence.valid() and fence.remaining() == 0.0
    with fence.renewal():
        clock.t += 4.0  # the answer takes 4 s: the deadline counts from the send
    assert fence.remaining() == pytest.approx(26.0)
    with pytest.raises(TimeoutError), fence.renewal():
        clock.t += 10.0
        raise TimeoutError  # a renewal that failed moves nothing
    assert fence.remaining() == pytest.approx(16.0)
    clock.t += 15.9
    assert fence.valid()
    clock.t += 0.1
    assert not fence.valid() and fence.remaining() == 0.0


# Steps: (seconds that pass before the send, seconds until the answer, whether it succeeded).
STEPS = st.lists(
    st.tuples(st.floats(0, 40), st.floats(0, 40), st.booleans()), min_size=1, max_size=20
)


@given(STEPS)
def test_the_holder_always_stops_before_the_controller_replaces_it(
    steps: list[tuple[float, float, bool]],
) -> None:
    """Whatever the delays: the holder may act only within 30 s of a successful renewal's
    send, and the controller, which waits 40 s + margin from the moment it *saw* that renewal
    (never before its send), releases only after the holder has stopped."""
    clock = Clock()
    fence = SelfFence(clock=clock)
    last_sent: float | None = None
    for before, answer, ok in steps:
        clock.t += before
        assert fence.valid() == (last_sent is not None and clock.t < last_sent + 30.0)
        sent = clock.t
        try:
            with fence.renewal():
                clock.t += answer
                if not ok:
                    raise ConnectionError
        except ConnectionError:
            pass
        else:
            last_sent = sent if last_sent is None else max(last_sent, sent)
        if fence.valid():
            assert last_sent is not None
            stops = clock.t + fence.remaining()
            assert stops == pytest.approx(last_sent + 30.0)
            assert stops < last_sent + 40.0 + 15.0  # the controller's earliest release
