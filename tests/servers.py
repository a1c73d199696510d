"""Helpers for tests that start a real server on a loopback port."""

from __future__ import annotations

import asyncio
import socket


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
