"""A stop the scheduler asked for (an eviction, an unload, an idle unload, shutdown) of a seat that serves: its
record marked ``stopping:<event>`` first (a restart knows the stop was under way), its long prompts saved before an
eviction or idle unload (``save_prompts``: ``kvkeep.keep_before_stop``; not from a process that has exited) while
what its release is verified against is read beside them (``Ending.read_before``, off the event loop), the
seat ended (``ending.Ending``), and the scheduler told at once that the seat holds nothing any more (``freed``: its
release is verified by then, so what waited for its bytes is placed now, while the rest of the stop is written).
Then, off that path: the engine's teardown report read from its log (only from an engine that writes one, and only
what it wrote since the stop began, off the event loop), the stop
recorded as one event with what came back (and a ``leak`` event when the teardown names tensors still alive), the
seat's store record forgotten, and whoever waits for the stop told once (``stopped``).

The event says whether the seat was draining when its stop began (``draining``: its turn over, or an unload waiting
for its requests in flight). A seat whose process had ended on its own before the stop (killed while it drained,
say) ends as this stop all the same, never as a crash beside it: the event says how the process ended as a crash
would (``accounts.died``: ``exit_code``, ``cause``, ``oom``, ``log_tail``), in its details and its reason.

``Stopper`` works with four parts: the clock, the history, the processes (the seat's engine, its log) and the
planning part (what the seat held on GPUs, as the history counts it); ``asked_by`` holds the event and request of
each stop not finished yet (a load report names the seats evicted for its request before their events are written).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from fitevict.phase import mark
from fitevict.host.procmem import exiting
from fitevict.pricing.footprint import HOST
from fitevict.schedule.seats import Exit
from fitevict.store.records import Event
from fitevict.seat.accounts import died, leak_check, leak_event, timings
from fitevict.seat.ending import Ending
from fitevict.seat.processes import Processes
from fitevict.seat.release import StopResult
from fitevict.seat.running import SeatState, log_size, log_text
from fitevict.seat.parts import EventLog, SeatFigures
from fitevict.seat.storing import STOPPING, SeatRecords


class Stopped(Protocol):
    """A seat's stop finished: the scheduler (unless ``slot_freed``: it was told when the processes exited) and
    whoever waits for the stop are told (``Desk.stopped``), and the change announced."""

    def __call__(self, key: str, res: StopResult, *, slot_freed: bool = ..., how: Exit = ...) -> None: ...


class Stopper:
    def __init__(self, clock: Callable[[], float], history: EventLog, processes: Processes, planning: SeatFigures, *,
                 ending: Ending, records: SeatRecords,
                 save_prompts: Callable[[SeatState, str], Awaitable[dict[str, Any]]], stopped: Stopped,
                 freed: Callable[[str], None]) -> None:
        self.clock, self.history, self.processes, self.planning = clock, history, processes, planning
        self.ending, self.records, self.save_prompts, self.stopped = ending, records, save_prompts, stopped
        self.freed = freed  # the scheduler told that a seat holds nothing any more (``Scheduler.stopped``)
        self.under_way: dict[str, asyncio.Task] = {}  # the task of each stop not finished yet, by seat key
        self.asked_by: dict[str, tuple[str, str | None]] = {}  # (event, request id) of each stop under way, by key

    async def stop(self, seat: SeatState, event: str, reason: str, request_id: str | None) -> StopResult:
        """Stop ``seat`` (run as a task of its own: it is in ``under_way`` until it ends, so that shutdown can wait
        for a stop already under way and count it)."""
        task = asyncio.current_task()
        assert task is not None
        self.under_way[seat.key] = task
        self.asked_by[seat.key] = (event, request_id)
        try:
            return await self._stop(seat, event, reason, request_id)
        finally:
            if self.under_way.get(seat.key) is task:
                del self.under_way[seat.key]
                self.asked_by.pop(seat.key, None)

    def evicted_for(self, request_id: str | None) -> tuple[str, ...]:
        """The seats whose eviction for ``request_id`` is under way: their events are not recorded yet."""
        return tuple(k for k, (ev, rid) in self.asked_by.items()
                     if ev == "evict" and rid == request_id) if request_id else ()

    async def _stop(self, seat: SeatState, event: str, reason: str, request_id: str | None) -> StopResult:
        mark(seat.key, "stop begins")
        since = log_size(seat.log_path)  # its teardown report, if it writes one, comes after this point
        self.records.keep(seat, STOPPING + event)  # a restart knows this stop was under way
        exited = seat.pid is not None and exiting(seat.pid)  # killed while it drained, say: nothing to save
        # what its release is verified against, read off the event loop while its prompts are saved
        reading = None if exited else self.ending.read_before(seat)
        try:
            kept = {} if exited else await self.save_prompts(seat, event)
        except BaseException:
            if reading is not None:
                reading.cancel()
            raise
        mark(seat.key, "prompts saved")
        res = await self.ending.end(seat, free_slot=True, forget=False,  # the record goes once the stop is recorded
                                    before=reading)
        mark(seat.key, "release verified")
        if not seat.slot_freed:  # its release is verified: what waits for its bytes is placed now, not after the
            seat.slot_freed = True  # records below (their writes are no part of anyone's wait)
            self.freed(seat.key)
        try:
            await self._record(seat, event, reason, request_id, res, kept, since)
        finally:  # whoever waits for the stop is told once it is recorded, even if its record failed
            mark(seat.key, "stop recorded")
            self.processes.done_with_log(seat.log_path)
            self.stopped(seat.key, res, slot_freed=True)
        return res

    async def _record(self, seat: SeatState, event: str, reason: str, request_id: str | None, res: StopResult,
                      kept: dict[str, Any], since: int) -> None:
        """The stop's event (how the process ended, its figures, its leak check), then the seat's record forgotten.
        ``since``: where the seat's log stood when the stop began (its teardown report is written after it)."""
        engine = self.processes.engine_for(seat.entry)
        report = (engine.teardown(await asyncio.to_thread(log_text, seat.log_path, since))
                  if engine.traits.reports_teardown else None)
        drained = seat.seat.drained
        account: dict[str, Any] = {}
        if res.ended == "exited":  # it ended on its own before the stop: say how, as a crash would
            words, account = await died(seat, res.exit_code, engine)
            reason = f"{reason}; it ended on its own {'while it drained' if drained else 'before its stop'}: {words}"
        await self.history.record(Event(
            time=self.clock(), event=event, model=seat.key, engine=seat.engine, seconds=res.exit_seconds,
            host_bytes=seat.bytes_on(HOST), vram_bytes=self.planning.gpu_figure(seat), reason=reason,
            freed_bytes=res.freed_bytes, request_id=request_id,
            details={"pid": seat.pid, "draining": drained, **account, **timings(seat),
                     "host_source": f"{seat.source_on(HOST)}: what the seat was counted at when it stopped",
                     "vram_source": (f"{seat.source_on(seat.config.devices[0])}: what the seat held on its GPUs"
                                     if seat.config.devices else None), **res.details(),
                     **({"leak_check": leak_check(report, res)} if engine.traits.reports_teardown else {}), **kept}))
        await self.ending.forget(seat)
        if (leaked := leak_event(seat, report, request_id, self.clock())) is not None:
            await self.history.record(leaked)
