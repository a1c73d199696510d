"""Helpers for tests that start a real server on a loopback port.

The servers under test speak mutual TLS with the local control plane's PKI (`dev_pki`):
the webhooks and the extender present their serving certificates and require a client
certificate signed by the same CA, which `client_tls` presents.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from aiohttp import web

from pilotfish import httpserver
from pilotfish.devcluster import pki


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def wait_listening(task: asyncio.Task[None], port: int) -> None:
    """Until `port` accepts connections; fails at once if the serving task ended."""
    for _ in range(500):
        if task.done():
            task.result()  # surfaces the start-up error
            raise AssertionError("serve returned without being cancelled")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.01)
            continue
        writer.close()
        await writer.wait_closed()
        return
    raise AssertionError(f"nothing listening on {port}")


@contextlib.asynccontextmanager
async def serving(start: Callable[[int], Awaitable[None]], *also: int) -> AsyncIterator[int]:
    """Run `start(port)` on a free port until the block ends; yields the port once it and
    the ports in `also` (a health port, say) accept connections."""
    port = free_port()
    task = asyncio.ensure_future(start(port))
    try:
        for each in (port, *also):
            await wait_listening(task, each)
        yield port
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def dev_pki(root: Path) -> pki.Pki:
    """The PKI `pilotfish dev up` makes, in `root` (made once, reused when it exists)."""
    return pki.ensure(root)


def server_tls(certs: pki.Pki, stem: str) -> ssl.SSLContext:
    """Serving context of host process `stem` ("webhooks", "extender"), requiring clients
    signed by the dev CA, exactly as `pilotfish dev up` starts them."""
    return httpserver.server_tls(
        str(certs.cert(stem)), str(certs.key(stem)), client_ca=str(certs.ca_cert)
    )


def client_tls(certs: pki.Pki, identity: str | None = "local-probe") -> ssl.SSLContext:
    """A client that trusts the dev CA and presents `identity`'s certificate (None: none)."""
    if identity is None:
        return ssl.create_default_context(cafile=str(certs.ca_cert))
    return pki.client_context(certs, identity)


async def seconds_until_closed(
    port: int, sent: bytes, context: ssl.SSLContext | None = None, limit: float = 60.0
) -> float:
    """Send `sent` (half a request, say), then wait for the server to hang up; how long it
    took. Whatever the server answers before closing is read and dropped."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    started = time.monotonic()
    try:
        writer.write(sent)
        await writer.drain()
        async with asyncio.timeout(limit):
            while await reader.read(65536):
                pass
        return time.monotonic() - started
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()


def impatient_tls_server(
    app: web.Application, certs: pki.Pki, stem: str
) -> Callable[[int], Awaitable[None]]:
    """A `serving` start function: `app` over mutual TLS as `stem`, with a request-head
    deadline of 0.5 s so tests of slow clients finish quickly."""

    async def start(port: int) -> None:
        await httpserver.run_until_cancelled(
            app,
            "127.0.0.1",
            port,
            name=stem,
            ssl_context=server_tls(certs, stem),
            header_timeout=0.5,
        )

    return start
