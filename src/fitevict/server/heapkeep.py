"""The door's heap kept to what it holds: every ``server.heap_trim_seconds``, malloc's free pages go back to the
kernel (``host.heap.trim``). Each round reads the door's RSS before and after (``/proc/self/statm``), so ``/health``
says what the last round gave back, measured, and how long it took."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fitevict.host import heap
from fitevict.host.procmem import rss_bytes

log = logging.getLogger("fitevict.heap")


class HeapKeep:
    def __init__(self, every: float) -> None:
        self.every = every  # 0: never trimmed
        self.rounds = 0
        self.released = 0  # bytes the rounds gave back, by the RSS read around each
        self.last: dict[str, Any] | None = None
        self._task: asyncio.Task | None = None

    def round(self) -> dict[str, Any]:
        """One trim, with the RSS read before and after it."""
        before, t0 = rss_bytes(), time.perf_counter()
        done = heap.trim()
        after = rss_bytes()
        gave = before - after if before is not None and after is not None else None
        self.rounds += 1
        self.released += max(0, gave or 0)
        self.last = {"at": time.time(), "seconds": round(time.perf_counter() - t0, 6),
                     "trimmed": done, "rss_before_bytes": before, "rss_after_bytes": after,
                     "released_bytes": gave if gave is not None else "unavailable, because /proc/self/statm could "
                                                                     "not be read"}
        return self.last

    def start(self) -> None:
        if self.every > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="fitevict-heap-trim")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every)  # a period, not a wait for an event: nothing announces free pages
            try:
                self.round()  # milliseconds, on the loop: malloc's heaps are locked while it runs anyway
            except Exception as e:  # a failed round must not end the loop
                log.warning("heap trim failed: %s", e)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def to_json(self) -> dict[str, Any]:
        return {"allocator": heap.allocator(), "arenas": heap.arenas(),
                "trim_seconds": self.every or "never (server.heap_trim_seconds = 0)", "rounds": self.rounds,
                "released_bytes": self.released, "last": self.last, "held": heap.held()}


__all__ = ["HeapKeep"]
