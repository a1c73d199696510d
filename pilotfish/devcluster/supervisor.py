"""Start, check and stop the local cluster's processes.

Each process runs in its own session (it outlives the `pilotfish dev up` that started it),
logs to `logs/<name>.log` and is remembered by a pid file holding its pid and start time, so
`down` stops exactly what `up` started and never a recycled pid.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from pilotfish.devcluster.components import Component, Health, Layout

Clock = Callable[[], float]


class ComponentError(RuntimeError):
    """A component could not be started; the message names it and its log file."""


@dataclass(frozen=True)
class Running:
    pid: int
    started: float  # process start time in clock ticks since boot, from /proc/PID/stat


def _proc_start(pid: int) -> float | None:
    try:
        stat = open(f"/proc/{pid}/stat").read()  # noqa: SIM115
    except OSError:
        return None
    # Field 22 (starttime) counted after the parenthesised command name, which may hold spaces.
    fields = stat.rsplit(")", 1)[1].split()
    return float(fields[19])


def _proc_state(pid: int) -> str | None:
    try:
        stat = open(f"/proc/{pid}/stat").read()  # noqa: SIM115
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def running(layout: Layout, name: str) -> Running | None:
    """The recorded process if it is still the one we started and not a zombie."""
    path = layout.pidfile(name)
    try:
        pid_s, started_s = path.read_text().split()
    except (OSError, ValueError):
        return None
    pid, started = int(pid_s), float(started_s)
    if _proc_start(pid) != started or _proc_state(pid) in (None, "Z", "X"):
        return None
    return Running(pid, started)


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def healthy(h: Health, timeout: float = 2.0) -> bool:
    ctx: ssl.SSLContext | None = None
    if h.url.startswith("https://"):
        if h.ca is not None:
            ctx = ssl.create_default_context(cafile=str(h.ca))
        else:  # a component's self-signed loopback serving cert: liveness only
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if h.client_cert is not None:
            ctx.load_cert_chain(str(h.client_cert), str(h.client_key))
    try:
        with urllib.request.urlopen(h.url, timeout=timeout, context=ctx) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def log_tail(layout: Layout, name: str, lines: int = 15) -> str:
    try:
        text = layout.log(name).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def start(
    layout: Layout,
    c: Component,
    *,
    env: dict[str, str] | None = None,
    ready_timeout: float = 90.0,
    clock: Clock = time.monotonic,
) -> Running:
    """Start `c` unless it already runs healthy; wait until its health URL answers 200."""
    current = running(layout, c.name)
    if current is not None and healthy(c.health):
        return current
    if current is not None:  # alive but not answering: give it the usual chance below
        return wait_ready(layout, c, current, ready_timeout, clock)
    if not os.access(c.argv[0], os.X_OK):
        raise ComponentError(
            f"{c.name}: binary {c.argv[0]} is missing or not executable "
            "(run devcluster/build.sh, or set PILOTFISH_BIN_DIR)"
        )
    if port_in_use(c.port):
        raise ComponentError(
            f"{c.name}: port 127.0.0.1:{c.port} is already in use by another process "
            "(stop it, or choose other ports with --port-offset)"
        )
    layout.logs.mkdir(parents=True, exist_ok=True)
    layout.run.mkdir(parents=True, exist_ok=True)
    with layout.log(c.name).open("ab") as log:
        proc = subprocess.Popen(
            c.argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    started = _proc_start(proc.pid)
    if started is None:
        raise ComponentError(f"{c.name}: exited at once; see {layout.log(c.name)}")
    layout.pidfile(c.name).write_text(f"{proc.pid} {started}\n")
    return wait_ready(layout, c, Running(proc.pid, started), ready_timeout, clock)


def wait_ready(
    layout: Layout, c: Component, proc: Running, timeout: float, clock: Clock
) -> Running:
    deadline = clock() + timeout
    while clock() < deadline:
        if running(layout, c.name) is None:
            raise ComponentError(
                f"{c.name}: exited during start-up; log {layout.log(c.name)}:\n"
                f"{log_tail(layout, c.name)}"
            )
        if healthy(c.health):
            return proc
        time.sleep(0.2)
    raise ComponentError(
        f"{c.name}: not ready after {timeout:.0f}s ({c.health.url}); log {layout.log(c.name)}:\n"
        f"{log_tail(layout, c.name)}"
    )


def stop(layout: Layout, name: str, grace: float = 10.0) -> bool:
    """Stop a component we started (its whole process group); True if it was running."""
    proc = running(layout, name)
    layout.pidfile(name).unlink(missing_ok=True)
    if proc is None:
        return False
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if _proc_start(proc.pid) != proc.started or _proc_state(proc.pid) in ("Z", "X"):
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return True
