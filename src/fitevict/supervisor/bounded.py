"""A shutdown step that cannot hang the door: awaited within a time limit, and when the limit passes, the log says
what the step was still waiting on (each task's name and where it was suspended) and shutdown goes on."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable

log = logging.getLogger("fitevict.shutdown")

STEP_SECONDS = 30.0  # a shutdown step's limit, beyond the timeouts its own parts keep (a stop's grace, say)


def where(task: asyncio.Future) -> str:
    """A task's name and the line it is suspended at (its innermost frame), for a log line."""
    if not isinstance(task, asyncio.Task):
        return repr(task)
    frames = task.get_stack()
    at = f" at {frames[-1].f_code.co_filename.rsplit('/', 2)[-1]}:{frames[-1].f_lineno}" if frames else ""
    return f"{task.get_name()} ({task.get_coro().__qualname__}){at}"


async def bounded(step: str, aw: Awaitable, limit: float, waiting_on: Iterable[asyncio.Future] = ()) -> bool:
    """Await ``aw`` for at most ``limit`` seconds; True when it ended in time. Past the limit it is cancelled and
    the log names ``step``, the limit and what it waited on (``waiting_on``, else ``aw`` itself)."""
    task = asyncio.ensure_future(aw)
    try:
        async with asyncio.timeout(limit):
            await asyncio.shield(task)
        return True
    except TimeoutError:
        waited = [where(t) for t in (list(waiting_on) or [task]) if not t.done()]
        log.warning("shutdown: %s did not end within %.1f s; going on without it (still waiting on: %s)", step,
                    limit, "; ".join(waited) or "nothing named")
        task.cancel()
        return False
