"""What the supervisor stores besides its history, none of which a refusing store may stop (its disk full, its file
locked or corrupt): each refusal is logged with the store's reason, and the work goes on.

The store's record of each live seat is kept as the seat changes, so that a restarted fitevict knows what an earlier
one left and what it was doing with it: ``loading`` from its spawn, ``ready`` once it answered its health check, and
``stopping:<event>`` from the moment its stop begins (the prompt save before an eviction included), and removed once
the stop ends (``SeatRecords``). The records go to the store's one writer in the order they are made, and nothing
waits for them but the removal: a record the store refuses is logged with the reason, and the seat runs (or stops)
all the same."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from fitevict.store.faults import STORE_FAULTS, reason
from fitevict.store.queries import op_seat_upsert
from fitevict.store.records import Measurement, SeatRecord

log = logging.getLogger("fitevict.seat")
STOPPING = "stopping:"  # a record's state while its stop runs: followed by the stop's event (evict, unload, ...)
LOADING = ("starting", "loading")  # a record's states before its seat answered its health check


def seat_record(seat: Any) -> SeatRecord:
    """The store's record of a live seat."""
    return SeatRecord(seat_id=seat.id, model=seat.key, engine=seat.engine, state=str(seat.state),
                      started_at=seat.started_at, fitevict_pid=os.getpid(), pid=seat.pid, pgid=seat.pgid,
                      port=seat.port, log_path=str(seat.log_path), config=seat.config.to_json())


class SeatRecords:
    """The store's record of each live seat, kept as the seat changes (the store is its one part)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def keep(self, seat: Any, state: str | None = None) -> None:
        """Queue ``seat``'s record (its own state, or ``state``) to the store's writer; a refusal is logged."""
        rec = seat_record(seat)
        if state is not None:
            rec = replace(rec, state=state)
        try:
            fut = self.store.submit(op_seat_upsert(rec))
        except RuntimeError as e:  # the store is closed (fitevict is stopping)
            log.warning("%s: seat record %s (%s) not stored: %s", seat.key, seat.id, rec.state, e)
            return

        def done(f: Future) -> None:
            if (err := f.exception()) is not None:
                log.warning("%s: seat record %s (%s) not stored: %s", seat.key, seat.id, rec.state, reason(err))

        fut.add_done_callback(done)

    async def forget(self, seat: Any) -> None:
        """Remove a stopped seat's record; a refusal is logged (the stop stands, and a restart forgets the stale
        record as an orphan)."""
        try:
            await self.store.aio.seat_remove(seat.id)
        except STORE_FAULTS as e:
            log.warning("%s: seat record %s not removed from the store: %s", seat.key, seat.id, e)

    def again(self, seats: Iterable[Any]) -> None:
        """The store was renewed (its file found corrupt and moved aside): every live seat's record written again."""
        for seat in list(seats):
            self.keep(seat)


def interrupted(rec: SeatRecord) -> str | None:
    """What the fitevict that left ``rec`` was doing with that seat when it ended: ``load`` (the seat never said
    ready), the stop's event (``unload``, ``evict``, ``idle-unload``, ...), or None (the seat served)."""
    if rec.state.startswith(STOPPING):
        return rec.state[len(STOPPING):]
    return "load" if rec.state in LOADING else None


async def store_measurement(store: Any, m: Measurement) -> bool | str:
    """Store an accepted measurement: True, or why the store refused it (the load's record says so)."""
    try:
        await store.aio.put_measurement(m)
    except STORE_FAULTS as e:
        log.warning("%s: its measurement not stored: %s; its next load is priced without it", m.model, reason(e))
        return f"not stored, because the store refused it: {reason(e)}"
    return True


async def last_measurement(store: Any, signature: str) -> Measurement | None:
    """The newest stored measurement of ``signature``; None when there is none or the store cannot be read (logged)."""
    try:
        return await store.aio.last_measurement(signature)
    except STORE_FAULTS as e:
        log.warning("the stored measurement of %s could not be read: %s", signature, reason(e))
        return None
