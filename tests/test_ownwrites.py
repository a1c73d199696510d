"""The one own-writes rule: stale until the informer shows exactly the version written."""

from __future__ import annotations

from typing import Any, cast

from pilotfish import metrics
from pilotfish.kube.informer import Informer
from pilotfish.kube.ownwrites import OwnWrites
from pilotfish.kube.rest import PODS, Rest
from pilotfish.timeutil import FakeClock


def obj(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "a", "resourceVersion": rv}}


def test_stale_until_exactly_that_version_is_seen_never_ordered() -> None:
    settled: list[str] = []
    t = OwnWrites("t", FakeClock(), on_settled=settled.append)
    t.wrote("a/p", obj("p", "9"), owner="web")
    t.observe("MODIFIED", obj("p", "10"))  # "10" > "9" means nothing: versions are opaque
    assert not t.settled("web") and not t.fresh("a/p")
    t.observe("MODIFIED", obj("p", "9"))
    assert t.settled("web") and settled == ["web"]


def test_a_delete_is_awaited_as_a_delete() -> None:
    t = OwnWrites("t", FakeClock())
    t.deleted("a/p", owner="web")
    t.observe("MODIFIED", obj("p", "3"))
    assert not t.settled("web")
    t.observe("DELETED", obj("p", "4"))
    assert t.settled("web")


def test_an_answer_that_comes_after_its_event_and_a_later_one_does_not_stall() -> None:
    """Created, then bound by the scheduler, both seen by the watch before the create's
    answer arrived: the informer shows neither the written version nor its absence."""
    t = OwnWrites("t", FakeClock())
    inf = Informer(cast(Rest, None), PODS)
    t.watch(inf)
    inf._apply({"type": "ADDED", "object": obj("p", "898")})
    inf._apply({"type": "MODIFIED", "object": obj("p", "899")})
    t.wrote("a/p", obj("p", "898"), owner="web")
    assert t.settled("web")
    t.wrote("a/p", obj("p", "897"), owner="api")  # never seen: stale
    assert not t.settled("api")


def test_a_relist_after_the_write_or_the_ttl_ends_the_wait() -> None:
    clock = FakeClock()
    t = OwnWrites("t", clock, ttl=60)
    t.wrote("a/p", obj("p", "1"), owner="web")
    clock.advance(1)
    t.relisted(clock.monotonic() - 2)  # a list that began before the write: proves nothing
    assert not t.settled("web")
    t.relisted(clock.monotonic())
    assert t.settled("web")
    t.wrote("a/q", obj("q", "5"), owner="api")
    clock.advance(59)
    assert not t.settled("api")
    clock.advance(1)
    assert t.settled("api"), "a lost event costs the TTL, never a stall"


def test_each_write_reports_how_late_the_informer_showed_it() -> None:
    clock = FakeClock()
    lags: list[float] = []
    t = OwnWrites("lag-test", clock, on_visible=lambda _now, lag: lags.append(lag))
    t.wrote("a/p", obj("p", "1"), owner="web")
    clock.advance(0.25)
    t.observe("MODIFIED", obj("p", "2"))  # not the version written: not yet
    assert lags == []
    t.observe("MODIFIED", obj("p", "1"))
    t.deleted("a/q", owner="web")
    clock.advance(0.5)
    t.observe("DELETED", obj("q", "7"))
    inf = Informer(cast(Rest, None), PODS)
    t.watch(inf)
    inf._apply({"type": "ADDED", "object": obj("r", "9")})
    t.wrote("a/r", obj("r", "9"), owner="web")  # its event came before the answer
    assert lags == [0.25, 0.5, 0.0]
    assert metrics.OWN_WRITES_VISIBLE.labels("lag-test")._sum.get() == 0.75
