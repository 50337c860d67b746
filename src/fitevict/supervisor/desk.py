"""The waiting room between the front door and the scheduler: each waiting request's future (the scheduler's
``dispatch``/``reject`` resolve it), whoever waits for a seat's stop, what ``policy.shrink_ctx`` decided per load,
and whether fitevict still takes work."""

from __future__ import annotations

import asyncio
from typing import Any

from fitevict.schedule.scheduler import Scheduler, Waiter
from fitevict.schedule.seats import Exit
from fitevict.seat.release import StopResult


class Desk:
    def __init__(self) -> None:
        self.futures: dict[Waiter, asyncio.Future] = {}
        self.shrinks: dict[tuple[str, int], dict[str, Any]] = {}  # (model, ctx loaded) -> what shrink_ctx decided
        self.closed = False  # shutting down: no new work
        self._stop_waiters: dict[str, list[asyncio.Future]] = {}

    def stop_future(self, key: str) -> asyncio.Future:
        """A future that gets ``key``'s StopResult when its next stop finishes."""
        fut = asyncio.get_running_loop().create_future()
        self._stop_waiters.setdefault(key, []).append(fut)
        return fut

    def forget_stop_future(self, key: str, fut: asyncio.Future) -> None:
        self._stop_waiters.get(key, []).remove(fut)

    def stopped(self, scheduler: Scheduler, key: str, result: StopResult, *, slot_freed: bool = False,
                how: Exit = Exit.STOPPED) -> None:
        """A seat's stop finished: tell the scheduler (unless it was told when the processes exited: a new seat of the
        same model may be loading by now), and whoever waits for it."""
        if not slot_freed:
            scheduler.stopped(key, how)
        for fut in self._stop_waiters.pop(key, []):
            if not fut.done():
                fut.set_result(result)
