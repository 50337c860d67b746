"""What the supervisor did, as it happens: every event written to the store (its one writer), the last 1,000 kept for
readers that settle on them, hooks called with each, and one condition that wakes whoever waits for a change."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from fitevict.store import Store
from fitevict.store.records import Event

KEPT = 1000  # events kept in memory for readers (the store holds every one)


class History:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._events: list[Event] = []
        self._changed = asyncio.Condition()
        self.on_event: list[Callable[[Event], None]] = []  # called with each event once it is recorded

    async def record(self, ev: Event) -> Event:
        """Write ``ev`` (off the event loop), keep it, call the hooks, wake the waiters. Returns it with its id."""
        ev = replace(ev, id=await asyncio.to_thread(self.store.record_event, ev))
        self._events.append(ev)
        del self._events[:-KEPT]
        for hook in self.on_event:
            hook(ev)
        await self.changed()
        return ev

    @property
    def recent(self) -> tuple[Event, ...]:
        """The events recorded here, the last 1,000 at most, oldest first."""
        return tuple(self._events)

    async def changed(self) -> None:
        """Something observable changed (a seat spawned or exited, an event recorded): wake every waiter."""
        async with self._changed:
            self._changed.notify_all()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> None:
        """Await a condition, re-checked at every change."""
        async def _wait() -> None:
            async with self._changed:
                await self._changed.wait_for(predicate)
        await asyncio.wait_for(_wait(), timeout)

    async def wait_for_event(self, predicate: Callable[[Event], bool], timeout: float) -> Event:
        """Await the first event (already recorded, or future) matching ``predicate``."""
        async def _wait() -> Event:
            async with self._changed:
                while True:
                    for ev in self._events:
                        if predicate(ev):
                            return ev
                    await self._changed.wait()
        return await asyncio.wait_for(_wait(), timeout)
