"""The quota controller's running sums: whatever order pods come, change and go in, the index
gives the team exactly what summing every pod again would, and the status decided from it is
the same."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pilotfish import ledger
from pilotfish.operators.quota.decide import desired_status
from pilotfish.operators.quota.model import ChargeIndex
from pilotfish.quota import Resources
from tests.test_quota_controller import pod as quota_pod

NAMESPACES = ("a", "b", "c")
TEAM = ("a", "b")  # "c" belongs to another team: never in the team's sums


def pod(ns: str, name: str, uid: str, cpu: int, memory: int, band: str, state: str) -> Any:
    phase = "Succeeded" if state == "finished" else "Running"
    return quota_pod(
        uid, f"{cpu}m", band, phase, ns, state == "gated", name=name, memory=f"{memory}Mi"
    )


events = st.lists(
    st.tuples(
        st.sampled_from(("ADDED", "MODIFIED", "DELETED")),
        st.sampled_from(NAMESPACES),
        st.sampled_from(("p0", "p1", "p2", "p3")),
        st.sampled_from(("u1", "u2")),  # a name recreated under a new uid
        st.integers(0, 3000),  # 0: a request that sums to nothing
        st.integers(0, 512),
        st.sampled_from(("production", "batch", "best-effort")),
        st.sampled_from(("running", "gated", "finished")),
    ),
    max_size=60,
)


def pruned(used: dict[str, Resources]) -> dict[str, Resources]:
    """`used_of` keeps a resource that sums to zero; the status leaves it out either way."""
    out = {b: {r: v for r, v in res.items() if v} for b, res in used.items()}
    return {b: res for b, res in out.items() if res}


@settings(max_examples=300, deadline=None)
@given(events)
def test_the_running_sums_equal_summing_every_pod_again(steps: list[tuple[Any, ...]]) -> None:
    index = ChargeIndex()
    live: dict[tuple[str, str], Any] = {}
    for kind, ns, name, uid, cpu, memory, band, state in steps:
        obj = pod(ns, name, f"{ns}-{name}-{uid}", cpu, memory, band, state)
        index.apply(kind, obj)
        if kind == "DELETED":
            live.pop((ns, name), None)
        else:
            live[(ns, name)] = obj
        got = index.team(TEAM)
        want = ledger.TeamCharges.of(ledger.charge_of(o) for (n, _), o in live.items() if n in TEAM)
        assert dict(got.used) == pruned(dict(want.used))
        assert dict(got.by_uid) == dict(want.by_uid)
        tq = {
            "metadata": {"name": "t", "generation": 1},
            "spec": {"team": "t", "bands": {"production": {"cpu": "10"}}},
            "status": {},
        }
        assert desired_status(tq, got, {}) == desired_status(tq, want, {})


def test_a_pod_moving_out_of_counted_is_taken_off_its_band() -> None:
    index = ChargeIndex()
    index.apply("ADDED", pod("a", "x", "1", 2000, 0, "production", "running"))
    index.apply("ADDED", pod("a", "y", "2", 500, 0, "production", "running"))
    index.apply("MODIFIED", pod("a", "x", "1", 2000, 0, "production", "finished"))
    used = index.team(["a"]).used
    assert used["production"]["cpu"] * 1000 == 500
    assert used["production"]["pods"] == 1
    index.apply("DELETED", pod("a", "y", "2", 500, 0, "production", "running"))
    assert dict(index.team(["a"]).used) == {}
