"""What the supervisor did, as it happens: every event written to the store (its one writer), the last 200 kept
for readers that settle on them (a load event with its report is ~4 kB of JSON, more as objects: the store holds
every one, and a door that runs for days keeps a few MiB here, not tens), hooks called with each, and one
condition that wakes whoever waits for a change.

An event the store refuses (its database locked by another writer past the busy timeout, its disk full, its server
gone) is kept here and still announced, the server log says which and why, and it is written, in order, before the
next event, or by a retry ``RETRY_S`` after the refusal, whichever comes first: a store that fails loses no history
and stops nothing (a stop that cannot be recorded is still a stop). Events still held when fitevict stops are lost,
and the log counts them (``abandon``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fitevict.store import Store
from fitevict.store.faults import STORE_FAULTS, reason
from fitevict.store.records import Event

KEPT = 200  # events kept in memory for readers (the store holds every one)
RETRY_S = 2.0  # after a refused write, the held events are tried again this long after it
log = logging.getLogger("fitevict.supervisor")


class History:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._events: list[Event] = []
        self._changed = asyncio.Condition()
        self.on_event: list[Callable[[Event], None]] = []  # called with each event once it is recorded
        self.unstored: list[Event] = []  # refused by the store, oldest first: written before the next event
        self._writing = asyncio.Lock()
        self._retry: asyncio.TimerHandle | None = None
        self._flushes: set[asyncio.Task] = set()

    async def record(self, ev: Event) -> Event:
        """Write ``ev`` (off the event loop), keep it, call the hooks, wake the waiters. Returns it with its id (none
        while the store refuses it)."""
        async with self._writing:
            self.unstored.append(ev)
            stored = await self._write_unstored()
        self._events.append(ev)
        self._took(stored)
        ev = stored.get(id(ev), ev)
        for hook in self.on_event:
            hook(ev)
        await self.changed()
        return ev

    def _took(self, stored: dict[int, Event]) -> None:
        """The kept events with the ids the store gave those just written; a retry if some are still held."""
        self._events = [stored.get(id(e), e) for e in self._events]
        del self._events[:-KEPT]
        if self.unstored and self._retry is None:
            self._retry = asyncio.get_running_loop().call_later(RETRY_S, self._start_flush)

    def _start_flush(self) -> None:
        self._retry = None
        task = asyncio.get_running_loop().create_task(self.flush(), name="fitevict-history-retry")
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def flush(self) -> int:
        """Write the held events now, in order (the retry). Returns how many are still held."""
        async with self._writing:
            held = len(self.unstored)
            stored = await self._write_unstored()
        self._took(stored)
        if stored:
            log.warning("history: %d held event(s) written, in order; %d still held", len(stored), held - len(stored))
            await self.changed()
        return len(self.unstored)

    def abandon(self) -> list[dict[str, Any]]:
        """fitevict stops with events the store never took: each is said in the log, and they are lost."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        lost = [{"event": e.event, "model": e.model, "time": e.time} for e in self.unstored]
        if lost:
            log.error("history: %d event(s) never stored, lost as fitevict stops (the store refused them): %s",
                      len(lost), ", ".join(f"{e['event']} of {e['model']}" for e in lost))
        return lost

    async def _write_unstored(self) -> dict[int, Event]:
        """Write the events the store has not taken yet, oldest first, until one is refused: those written, with their
        ids, by the identity of the event kept."""
        done: dict[int, Event] = {}
        while self.unstored:
            ev = self.unstored[0]
            try:
                done[id(ev)] = replace(ev, id=await self.store.aio.record_event(ev))
            except STORE_FAULTS as e:
                why = reason(e)
                log.warning("history: %d event(s) not stored yet, kept and written before the next one (the store "
                            "refused %s of %s: %s)", len(self.unstored), ev.event, ev.model, why)
                break
            self.unstored.pop(0)
        return done

    @property
    def recent(self) -> tuple[Event, ...]:
        """The events recorded here, the last ``KEPT`` at most, oldest first."""
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
