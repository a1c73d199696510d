"""Start, check and stop the local cluster's processes, and keep Pilotfish's running.

Each process runs in its own session (it outlives the `pilotfish dev up` that started it),
logs to `logs/<name>.log` and is remembered by a pid file holding its pid and start time, so
`down` stops exactly what `up` started and never a recycled pid.

Pilotfish's host processes run under `pilotfish dev supervise`, which restarts its child
whenever it exits, with the kubelet's crash-loop backoff scaled to a laptop (1 s doubling to
10 s): the operator exits on purpose when it loses its lease, and something must bring it
back unattended, as the kubelet does in a cluster. The supervisor and its child share one
process group, so stopping or killing the group (what `stop` does, and what a test's
"kill -9 the component" does) ends both; the supervisor's own pid file names the unit, a
second one (`<name>.child`) names the current child.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from pilotfish.devcluster.components import Component, Health, Layout

Clock = Callable[[], float]

log = logging.getLogger("pilotfish.supervise")


# How long a killed process may take to exit, and a stopped one's port to come free.
KILL_WAIT_SECONDS = 10.0
PORT_FREE_SECONDS = 30.0


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
    return _recorded(layout.pidfile(name))


def _recorded(path: Path) -> Running | None:
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


def _tls(h: Health) -> ssl.SSLContext | None:
    if not h.url.startswith("https://"):
        return None
    if h.ca is not None:
        ctx = ssl.create_default_context(cafile=str(h.ca))
    else:  # a component's self-signed loopback serving cert: liveness only
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if h.client_cert is not None:
        ctx.load_cert_chain(str(h.client_cert), str(h.client_key))
    return ctx


def healthy(h: Health, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(h.url, timeout=timeout, context=_tls(h)) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def fetch(h: Health, path: str, timeout: float = 5.0) -> str:
    """GET another path of a component (its /metrics, say) the way its health check is
    made: same scheme, CA and client certificate."""
    base = h.url.split("://", 1)
    url = f"{base[0]}://{base[1].split('/', 1)[0]}{path}"
    with urllib.request.urlopen(url, timeout=timeout, context=_tls(h)) as resp:
        return str(resp.read().decode())


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
            env={**os.environ, **dict(c.env), **(env or {})},
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
    if _gone_within(proc, grace):
        return True
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    # SIGKILL is delivered, not done: until the process has exited it still holds its
    # listening sockets, and a start right after would find its port taken.
    if not _gone_within(proc, KILL_WAIT_SECONDS):
        raise ComponentError(
            f"{name}: pid {proc.pid} still alive {KILL_WAIT_SECONDS:.0f}s after SIGKILL"
        )
    return True


def _gone_within(proc: Running, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _proc_start(proc.pid) != proc.started or _proc_state(proc.pid) in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def restart(
    layout: Layout, c: Component, ready_timeout: float = 120.0, grace: float = 10.0
) -> Running:
    """Stop `c` if it runs, wait until its port is free (a process that forked a listener
    can leave it behind for a moment), then start it afresh."""
    stop(layout, c.name, grace)
    deadline = time.monotonic() + PORT_FREE_SECONDS
    while port_in_use(c.port):
        if time.monotonic() > deadline:
            raise ComponentError(
                f"{c.name}: port 127.0.0.1:{c.port} still in use {PORT_FREE_SECONDS:.0f}s after "
                "it was stopped"
            )
        time.sleep(0.2)
    return start(layout, c, ready_timeout=ready_timeout)


# --- supervising one host process, as the kubelet restarts a container ----------------------

PR_SET_PDEATHSIG = 1


def child_pidfile(layout: Layout, name: str) -> Path:
    return layout.pidfile(f"{name}.child")


def child(layout: Layout, name: str) -> Running | None:
    """The current child of the supervised unit `name`, if one runs right now."""
    return _recorded(child_pidfile(layout, name))


def supervised(layout: Layout, name: str, argv: Sequence[str]) -> tuple[str, ...]:
    """`argv` run under `pilotfish dev supervise` for the cluster in `layout`."""
    return (
        sys.executable,
        "-m",
        "pilotfish.cli.main",
        "dev",
        "--state",
        str(layout.root),
        "supervise",
        "--name",
        name,
        "--",
        *argv,
    )


@dataclass
class Backoff:
    """The kubelet's crash-loop backoff, scaled down: the first restart after `initial`,
    doubling up to `cap`; a child that ran for `reset_after` starts the series afresh.
    `cap` bounds how long a part stays down once what it waited for is back."""

    initial: float = 1.0
    cap: float = 10.0
    reset_after: float = 60.0
    _next: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._next = self.initial

    def after_exit(self, ran_for: float) -> float:
        if ran_for >= self.reset_after:
            self._next = self.initial
        delay = self._next
        self._next = min(self.cap, self._next * 2)
        return delay


def describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
        return f"signal {-code}"
    return f"exit code {code}"


def _die_with_parent(parent: int) -> Callable[[], None]:
    """In the child, before exec: get SIGTERM when the supervisor dies, even by SIGKILL of
    the supervisor alone, so no orphan keeps the port."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def setup() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the supervisor died before prctl took effect
            os._exit(1)

    return setup


class Supervisor:
    """Run `argv` until told to stop, restarting it with backoff whenever it exits."""

    def __init__(
        self,
        layout: Layout,
        name: str,
        argv: Sequence[str],
        *,
        backoff: Backoff | None = None,
        clock: Clock = time.monotonic,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        if not argv:
            raise ValueError(f"{name}: nothing to supervise (no command after --)")
        self.layout = layout
        self.name = name
        self.argv = tuple(argv)
        self.backoff = backoff or Backoff()
        self.clock = clock
        self.stopping = False
        self.restarts = 0
        self.child: subprocess.Popen[bytes] | None = None
        self._wake_r, self._wake_w = os.pipe()
        self.sleep = sleep or self._sleep

    def _sleep(self, seconds: float) -> None:
        """Sleep, but wake at once when a stop is requested (the handler writes the pipe)."""
        select.select([self._wake_r], [], [], seconds)

    def request_stop(self, signum: int = signal.SIGTERM, _frame: FrameType | None = None) -> None:
        """Signal handler: stop restarting and pass the signal on to the child."""
        self.stopping = True
        current = self.child
        if current is not None and current.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                current.send_signal(signum)
        with contextlib.suppress(OSError):  # the pipe is gone once run() has returned
            os.write(self._wake_w, b"\0")

    def spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent(os.getpid()),  # noqa: PLW1509 (no threads here)
        )

    def _run_once(self, pidfile: Path) -> int:
        """Start the child and wait for it; its exit code (127: it could not be started)."""
        try:
            self.child = self.spawn()
        except OSError as e:  # as a kubelet retries a container that cannot be created
            log.error(f"{self.name} cannot be started: {e}", extra={"component": self.name})
            return 127
        if self.stopping:  # asked to stop while it was being spawned
            self.child.terminate()
        begun = _proc_start(self.child.pid)
        if begun is not None:
            pidfile.parent.mkdir(parents=True, exist_ok=True)
            pidfile.write_text(f"{self.child.pid} {begun}\n")
        return self.child.wait()

    def run(self) -> int:
        """Until stopped: start the child, wait for it, log its exit, back off, again."""
        previous = {
            sig: signal.signal(sig, self.request_stop)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        }
        pidfile = child_pidfile(self.layout, self.name)
        try:
            while not self.stopping:
                started = self.clock()
                code = self._run_once(pidfile)
                ran_for = self.clock() - started
                if self.stopping:
                    break
                delay = self.backoff.after_exit(ran_for)
                self.restarts += 1
                log.warning(
                    f"{self.name} exited ({describe_exit(code)}) after {ran_for:.1f}s; "
                    f"restarting in {delay:.1f}s",
                    extra={
                        "component": self.name,
                        "exit_code": code,
                        "ran_for": round(ran_for, 3),
                        "restart_in": delay,
                        "restarts": self.restarts,
                    },
                )
                self.sleep(delay)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            pidfile.unlink(missing_ok=True)
            os.close(self._wake_r)
            os.close(self._wake_w)
        log.info("stopped", extra={"component": self.name, "restarts": self.restarts})
        return 0
