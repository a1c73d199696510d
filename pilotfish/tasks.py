"""Every long-running task of a process, spawned and guarded in one place.

An informer whose task died leaves its view frozen while the process still answers health
checks; a controller whose loop ended stops converging without a word. Either is worse than
exiting: the supervisor (the kubelet, or `pilotfish dev supervise`) restarts the process
and it rebuilds every view from the API. So when any guarded task ends, for any reason,
the rest are cancelled and `TaskDied` names the one that ended.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from typing import Any, NoReturn

log = logging.getLogger("pilotfish.tasks")


class TaskDied(RuntimeError):
    def __init__(self, name: str, cause: BaseException | None) -> None:
        why = f"{type(cause).__name__}: {cause}" if cause else "ended without an error"
        super().__init__(f"task {name!r} stopped: {why}")
        self.name = name
        self.cause = cause


async def run_guarded(coroutines: Mapping[str, Coroutine[Any, Any, Any]]) -> NoReturn:
    """Run every named coroutine until cancelled or until one ends; then cancel the rest,
    wait for them, and raise TaskDied for the first that ended."""
    tasks = {asyncio.ensure_future(c): name for name, c in coroutines.items()}
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        first = min(done, key=lambda t: list(tasks).index(t))
        cause = None if first.cancelled() else first.exception()
        log.error("a guarded task stopped", extra={"task": tasks[first], "error": str(cause)})
        raise TaskDied(tasks[first], cause) from cause
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def root_cause(died: BaseException) -> BaseException | None:
    """The innermost cause of nested TaskDied errors (guarded tasks that guard tasks)."""
    cause: BaseException | None = died
    while isinstance(cause, TaskDied):
        cause = cause.cause
    return cause
