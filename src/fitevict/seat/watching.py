"""A serving seat's process watched until it exits. An exit that no stop asked for (``seat.expected_exit`` unset) is
told to the scheduler (``crashed``, its ``ending``). A seat that was draining ends as the stop it drained for (an
unload that waited for it, or the eviction for the request that waited for its memory): the scheduler begins that
stop, and the stop's event says the seat was draining and how its process ended (``stopping.Stopper``). Any other is
a crash: it serves nothing more, the seat is ended (``ending.Ending``), one ``crash`` event says why
(``accounts.died``: its exit code read as a cause, the OOM killer as the kernel reported it, a kill, a signal, an
exit; a seat killed because it was stopped or stuck, ``frozen.watch_frozen``; a model file changed under it) with its
log's tail, and then the scheduler and whoever waits for the seat told once (``stopped``, how: crashed). A seat
adopted from an earlier fitevict is not a child: its exit is seen through a pidfd, and its exit code is unknown.

``CrashWatch`` works with four parts: the clock, the history, the processes (the seat's log) and the engine settings
(``stall_seconds``); and with callables: ``spawn`` (background work), ``crashed`` (the scheduler's ``ending``: True
when a draining seat's stop took its end over), ``stopped`` and ``silent_for`` (how long the front door has waited
for the seat's next byte).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from fitevict.config.records import EngineConfig
from fitevict.engines.process import wait_pid_gone
from fitevict.schedule.seats import SERVING, Exit
from fitevict.store.records import Event
from fitevict.seat.accounts import died, timings
from fitevict.seat.ending import Ending
from fitevict.seat.frozen import watch_frozen
from fitevict.seat.processes import Processes
from fitevict.seat.running import SeatState
from fitevict.seat.parts import EventLog
from fitevict.seat.stopping import Stopped

ADOPTED_EXIT = "adopted seat exited unexpectedly (not a child of this fitevict: exit code unknown)"


class CrashWatch:
    def __init__(self, clock: Callable[[], float], history: EventLog, processes: Processes, engine: EngineConfig, *,
                 ending: Ending, spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task],
                 crashed: Callable[[str], bool], stopped: Stopped,
                 silent_for: Callable[[int], float | None]) -> None:
        self.clock, self.history, self.processes, self.engine = clock, history, processes, engine
        self.ending, self.spawn, self.crashed, self.stopped = ending, spawn, crashed, stopped
        self.silent_for = silent_for

    def watch(self, seat: SeatState) -> None:
        """A seat that just became ready: its exit watched, and whether it is stopped or stuck."""
        seat.watcher = self.spawn(self._watch(seat), f"watch-{seat.key}")
        self.spawn(watch_frozen(seat, self.engine.stall_seconds, killed_for, self.silent_for), f"frozen-{seat.key}")

    def watch_adopted(self, seat: SeatState) -> None:
        """An adopted seat is not our child: its exit is seen through a pidfd."""
        seat.watcher = self.spawn(self._watch_adopted(seat), f"watch-{seat.key}")

    async def _watch(self, seat: SeatState) -> None:
        assert seat.proc is not None
        rc = await seat.proc.wait()
        if seat.expected_exit or seat.state not in SERVING:
            return
        if self.crashed(seat.key):  # it was draining: the stop it drained for records its end
            return
        res = await self.ending.end(seat, forget=False)  # the record goes once the crash is recorded
        words, account = await died(seat, rc, self.processes.engine_for(seat.entry))
        await self.history.record(Event(
            time=self.clock(), event="crash", model=seat.key, engine=seat.engine, freed_bytes=res.freed_bytes,
            reason=f"{words}; the next request reloads it",
            details={"pid": seat.pid, "log": str(seat.log_path), **timings(seat), **account, **res.details()}))
        await self.ending.forget(seat)
        self.processes.done_with_log(seat.log_path)
        self.stopped(seat.key, res, how=Exit.CRASHED)

    async def _watch_adopted(self, seat: SeatState) -> None:
        assert seat.pid is not None
        await wait_pid_gone(seat.pid, None)
        if seat.expected_exit or seat.state not in SERVING or self.crashed(seat.key):
            return
        res = await self.ending.end(seat)
        await self.history.record(Event(
            time=self.clock(), event="crash", model=seat.key, engine=seat.engine, freed_bytes=res.freed_bytes,
            reason=ADOPTED_EXIT, details={"pid": seat.pid, **timings(seat), **res.details()}))
        self.stopped(seat.key, res, how=Exit.CRASHED)


def killed_for(seat: SeatState, why: str) -> None:
    """The stuck-seat watch kills ``seat`` for ``why``: its end says so."""
    seat.killed_for = why
