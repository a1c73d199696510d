"""An informer rides out an API outage: every failure costs a capped backoff, never the task."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import aiohttp
import pytest

from pilotfish.kube import informer as informer_mod
from pilotfish.kube.informer import BACKOFF_MAX, Informer, backoff_delay
from pilotfish.kube.rest import PODS, ApiError, Rest


def pod(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "n", "resourceVersion": rv}}


class FlakyRest:
    """Lists and watches that fail in a scripted order, then work."""

    def __init__(self, list_failures: list[Exception], watches: list[Any]) -> None:
        self.list_failures = list_failures
        self.watches = watches  # each: a list of events, or an exception to raise at once
        self.items = [pod("a", "1")]
        self.lists = 0
        self.watch_from: list[str] = []
        self.done = asyncio.Event()

    async def list_pages(
        self, path: str, params: Any = None, page: int = 500, each: Any = None
    ) -> Any:
        self.lists += 1
        if self.list_failures:
            raise self.list_failures.pop(0)
        return [each(dict(i, metadata=dict(i["metadata"]))) for i in self.items], "1"

    async def watch(
        self, path: str, rv: str, params: Any = None, timeout_seconds: int = 300
    ) -> AsyncIterator[dict[str, Any]]:
        self.watch_from.append(rv)
        if not self.watches:
            self.done.set()
            await asyncio.Event().wait()
        step = self.watches.pop(0)
        if isinstance(step, Exception):
            raise step
        for event in step:
            if isinstance(event, Exception):
                raise event
            yield event


@pytest.fixture
def delays(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Backoffs asked for (as failure counts), without waiting them out."""
    asked: list[int] = []

    def record(failures: int, jitter: float) -> float:
        asked.append(failures)
        return 0.0

    monkeypatch.setattr(informer_mod, "backoff_delay", record)
    return asked


async def run_until_idle(inf: Informer, rest: FlakyRest) -> None:
    task = asyncio.create_task(inf.run())
    await asyncio.wait_for(rest.done.wait(), timeout=5)
    assert not task.done(), "the informer must never end on its own"
    task.cancel()


def test_backoff_is_exponential_capped_and_jittered_down() -> None:
    assert backoff_delay(0, 0.0) == pytest.approx(0.1)
    assert backoff_delay(0, 0.999) == pytest.approx(0.2, abs=1e-3)
    assert backoff_delay(3, 0.999) == pytest.approx(1.6, abs=1e-2)
    assert all(backoff_delay(n, 0.999) <= BACKOFF_MAX for n in range(200))
    assert backoff_delay(200, 0.0) == BACKOFF_MAX / 2


async def test_list_failures_of_every_kind_are_retried(delays: list[int]) -> None:
    rest = FlakyRest(
        [
            OSError("connection refused"),
            ApiError(503, "ServiceUnavailable", "apiserver is shutting down"),
            aiohttp.ClientConnectionError("reset"),
            TimeoutError(),
        ],
        [],
    )
    inf = Informer(cast(Rest, rest), PODS)
    await run_until_idle(inf, rest)
    assert rest.lists == 5 and inf.synced.is_set() and set(inf.store) == {"n/a"}
    assert delays == [0, 1, 2, 3], "consecutive failures back off further each time"


async def test_a_broken_watch_resumes_from_its_last_version(delays: list[int]) -> None:
    rest = FlakyRest(
        [],
        [
            [{"type": "ADDED", "object": pod("b", "2")}, OSError("connection reset")],
            aiohttp.ClientConnectionError("connection refused"),
            [{"type": "ADDED", "object": pod("c", "3")}],
        ],
    )
    inf = Informer(cast(Rest, rest), PODS)
    await run_until_idle(inf, rest)
    assert rest.lists == 1, "a transport failure resumes the watch, no relist"
    assert rest.watch_from == ["1", "2", "2", "3"]
    assert set(inf.store) == {"n/a", "n/b", "n/c"}
    assert delays == [0, 1], "an event resets the backoff; a failure after it starts at 0"


async def test_gone_relists_at_once_and_a_bug_relists_after_a_backoff(delays: list[int]) -> None:
    calls = {"n": 0}

    def transform(obj: dict[str, Any]) -> dict[str, Any]:
        calls["n"] += 1
        if obj["metadata"]["name"] == "bad" and calls["n"] < 5:
            raise KeyError("spec")  # a bug meeting an object it did not expect
        return obj

    rest = FlakyRest(
        [],
        [
            ApiError(410, "Expired", "too old resource version"),
            [{"type": "ADDED", "object": pod("bad", "4")}],
        ],
    )
    inf = Informer(cast(Rest, rest), PODS, transform=transform)
    await run_until_idle(inf, rest)
    assert rest.lists == 3, "410 and the failed transform each relist"
    assert delays == [0], "410 is no failure; the bug is"


async def test_a_watch_that_ends_at_once_is_backed_off(delays: list[int]) -> None:
    rest = FlakyRest([], [[], [], []])
    inf = Informer(cast(Rest, rest), PODS)
    await run_until_idle(inf, rest)
    assert delays == [0, 1, 2]
