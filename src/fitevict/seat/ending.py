"""A seat's end, whatever ended it (an eviction, an unload, a failed or cancelled load, a crash, shutdown): its
process group stopped and its release verified (``release.stop_and_verify``), the seat taken off the table and its
store record removed. How the seat left (stopped, failed, crashed) and the event that says so are the caller's.

``Ending`` works with four parts: the seat table, the engine settings (stop grace, release timeout), the GPU reader
and the clock; and with the store's seat records and two callables: ``gone`` (the scheduler told that a seat's slot
is free) and ``changed`` (whoever waits for a change woken).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fitevict.config.records import EngineConfig
from fitevict.schedule.seats import SeatTable
from fitevict.seat.release import BeforeStop, StopResult, read_before_stop, stop_and_verify
from fitevict.seat.running import SeatState
from fitevict.seat.storing import SeatRecords

VERIFY_HOLD_S = 2.0  # a stop holds the next placement at most this long after its processes exited (see ``end``)


class Ending:
    def __init__(self, table: SeatTable, engine: EngineConfig, nvml: Any, clock: Callable[[], float], *,
                 records: SeatRecords, gone: Callable[[str], None], changed: Callable[[], None]) -> None:
        self.table, self.engine, self.nvml, self.clock = table, engine, nvml, clock
        self.records, self.gone, self.changed = records, gone, changed

    def read_before(self, seat: SeatState) -> asyncio.Future[BeforeStop]:
        """What ``seat``'s release is verified against (``release.read_before_stop``), read from now on off the event
        loop, so that the caller's own work before the stop (its prompts saved) runs beside the reading: ``end``
        awaits it before the SIGTERM."""
        return asyncio.ensure_future(asyncio.to_thread(read_before_stop, seat.pgid, self._own(seat), nvml=self.nvml,
                                                       gpu_held=seat.gpu_bytes))

    def _own(self, seat: SeatState) -> tuple[str, ...]:
        """The devices whose release is verified apart: a unified device's buffers are the host's."""
        return tuple(d for d in seat.config.devices if d not in seat.shared)

    async def end(self, seat: SeatState, *, free_slot: bool = False, forget: bool = True,
                  before: asyncio.Future[BeforeStop] | None = None) -> StopResult:
        """Stop ``seat``'s process group, verify the release, and forget the seat (``forget``: its store record too;
        a caller that records how the seat ended forgets the record itself, after that event, so that a front door
        killed in between finds the record at its restart and says so). ``free_slot``: if verifying the
        release takes longer than ``VERIFY_HOLD_S`` after the processes exited (another program growing at the same
        moment can hide it until the timeout), tell the scheduler the seat is gone then (``gone``), so that the next
        placement does not wait for it (``seat.slot_freed`` says so, and the stop's caller then leaves the scheduler
        alone). ``before``: the reading begun by ``read_before`` (else it is read now)."""
        seat.expected_exit = True
        hold: list[asyncio.TimerHandle] = []

        def free() -> None:
            if not seat.slot_freed and self.table.get(seat.key) is seat.seat:
                seat.slot_freed = True
                self.gone(seat.key)

        def exited() -> None:
            self.table.detach(seat.seat, seat)
            if free_slot:
                hold.append(asyncio.get_running_loop().call_later(VERIFY_HOLD_S, free))
            self.changed()

        res = await stop_and_verify(seat.key, seat.pgid, self._own(seat), proc=seat.proc,
                                    grace=self.engine.stop_grace_seconds,
                                    release_timeout=self.engine.release_timeout_seconds, nvml=self.nvml,
                                    clock=self.clock, gpu_held=seat.gpu_bytes, on_exit=exited, before=before)
        for h in hold:
            h.cancel()
        self.table.detach(seat.seat, seat)
        if forget:
            await self.forget(seat)
        return res

    async def forget(self, seat: SeatState) -> None:
        """``seat``'s store record removed: the seat has ended and its end is recorded."""
        await self.records.forget(seat)
