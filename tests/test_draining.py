"""On SIGTERM a server keeps answering, sends every caller to a new connection and leaves
the Service, and stops only after the drain; a bad drain setting names the variable."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Iterator

import aiohttp
import pytest
from aiohttp import web

from pilotfish import draining, httpserver


@pytest.fixture(autouse=True)
def serving() -> Iterator[None]:
    draining.stop_draining()
    yield
    draining.stop_draining()


def app() -> web.Application:
    async def hello(_request: web.Request) -> web.Response:
        return web.Response(text="hello")

    served = web.Application()
    served.router.add_get("/hello", hello)
    served.router.add_get("/readyz", httpserver.readyz(lambda: True, "nothing"))
    return served


async def test_sigterm_drains_then_stops() -> None:
    loop = asyncio.get_running_loop()
    started: asyncio.Future[int] = loop.create_future()

    async def main() -> None:
        served = app()

        async def on_startup(_app: web.Application) -> None:
            if not started.done():
                started.set_result(0)

        served.on_startup.append(on_startup)
        await httpserver.run_until_cancelled(served, "127.0.0.1", 0, name="test")

    # Port 0: the kernel chooses; the test finds it from the listening socket.
    runner = asyncio.ensure_future(
        draining.serve_until_terminated(main(), name="test", drain_seconds=1.0)
    )
    await asyncio.wait_for(started, 10)
    port = await bound_port()
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/hello") as r:
            assert r.status == 200
            assert r.headers.get("Connection", "").lower() != "close"
        os.kill(os.getpid(), signal.SIGTERM)
        await wait_for(draining.draining)
        async with session.get(f"http://127.0.0.1:{port}/hello") as r:
            assert r.status == 200 and await r.text() == "hello"  # still served...
            assert r.headers.get("Connection", "").lower() == "close"  # ...on its way out
        async with session.get(f"http://127.0.0.1:{port}/readyz") as r:
            assert r.status == 503 and "draining" in await r.text()
        os.kill(os.getpid(), signal.SIGTERM)  # a second one changes nothing
    await asyncio.wait_for(runner, 10)  # the drain ends, and the server with it
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as session:
            await session.get(f"http://127.0.0.1:{port}/hello")


async def bound_port() -> int:
    """The port of the one TCP listener this process opened on 127.0.0.1 (port 0)."""
    for _ in range(500):
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:"):
                inode = target[8:-1]
                port = _listening_port(inode)
                if port:
                    return port
        await asyncio.sleep(0.01)
    raise AssertionError("no listening socket")


def _listening_port(inode: str) -> int | None:
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[9] == inode and fields[3] == "0A":  # LISTEN
                return int(fields[1].split(":")[1], 16)
    return None


async def wait_for(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not check():  # noqa: ASYNC110 - the signal handler runs between checks
            await asyncio.sleep(0.01)


async def test_a_cancelled_server_that_was_not_draining_is_cancelled() -> None:
    async def forever() -> None:
        await asyncio.Future()

    runner = asyncio.ensure_future(
        draining.serve_until_terminated(forever(), name="test", drain_seconds=1.0)
    )
    await asyncio.sleep(0)
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, draining.DRAIN_SECONDS), ("", draining.DRAIN_SECONDS), ("2.5", 2.5)],
)
def test_the_drain_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, expected: float
) -> None:
    if raw is None:
        monkeypatch.delenv(draining.DRAIN_ENV, raising=False)
    else:
        monkeypatch.setenv(draining.DRAIN_ENV, raw)
    assert draining.drain_seconds_from_env() == expected


@pytest.mark.parametrize(
    ("raw", "rule"), [("soon", "a number"), ("-1", "not be negative"), ("301", "at most 300")]
)
def test_a_bad_drain_names_the_variable_and_the_rule(
    monkeypatch: pytest.MonkeyPatch, raw: str, rule: str
) -> None:
    monkeypatch.setenv(draining.DRAIN_ENV, raw)
    with pytest.raises(ValueError, match=rf"PILOTFISH_DRAIN_SECONDS='{raw}'.*{rule}"):
        draining.drain_seconds_from_env()
