"""The real ``Effects``: the scheduler's commands, carried out on engine processes.

``start`` hands the load to the ``seat.loading.Loader``; ``stop`` cancels a load that is not ready yet, or hands a
serving seat to the ``seat.stopping.Stopper``; ``dispatch``/``reject`` answer the waiting requests (a refusal
recorded as a ``refuse`` event); ``wake_at`` sets the scheduler's next tick; ``install`` takes in a seat adopted
from an earlier fitevict. Each call returns at once (the work runs in a task) and its completion goes back to the
scheduler as an input. Every stop, whatever ended the seat (eviction, unload, idle, a failed load, a crash, a
cancelled load, shutdown), goes through ``seat.ending.Ending`` (``seat.release.stop_and_verify``) and is recorded
with what came back.

The collaborators are built once the scheduler exists (``bind``: the scheduler is built over these effects), each
with the few parts it works with, never the whole ``Ports``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from fitevict import planner as pl
from fitevict.budget import Budget
from fitevict.host.pagecache import read_ahead
from fitevict.schedule.errors import Busy, Refused, SupervisorError
from fitevict.schedule.scheduler import Scheduler, Waiter
from fitevict.schedule.seats import Exit
from fitevict.store.records import Event
from fitevict.seat.ending import Ending
from fitevict.supervisor.kvkeep import keep_before_stop
from fitevict.seat.launching import Launcher
from fitevict.seat.learning import Learning
from fitevict.seat.loading import Loader
from fitevict.seat.loadrecord import LoadRecorder
from fitevict.supervisor.loadreport import seat_load_report
from fitevict.seat.measure import Meter
from fitevict.supervisor.ports import Ports
from fitevict.seat.readiness import Readiness
from fitevict.seat.release import StopResult
from fitevict.seat.running import SeatState
from fitevict.seat.price import SeatPrices
from fitevict.seat.stopping import Stopper
from fitevict.seat.storing import SeatRecords
from fitevict.seat.watching import CrashWatch

log = logging.getLogger("fitevict.supervisor")


class LiveEffects:
    def __init__(self, ports: Ports) -> None:
        self.parts = ports  # the supervisor's parts, named (supervisor.ports): never the supervisor itself
        # the two readings a plan needs are the planning part's (the scheduler plans over its own seats, whose
        # records read what each process holds now: schedule.seats.Holds)
        self.budget: Callable[[], Budget] = ports.planning.plan_budget
        self.prices: Callable[[pl.PlanRequest], pl.FootprintFn] = ports.planning.footprints
        self.recording: set[asyncio.Future] = set()  # load records still being written (history readers settle)
        self._wake: asyncio.TimerHandle | None = None
        self.handed = 0  # requests handed a seat by ``dispatch`` (a load reads its seat after the first answer)
        # seconds the front door has waited for the next byte from the seat on a port (None: it waits for none);
        # the server sets it from its connection pool, so that a stuck seat can be told from a slow client
        self.silent_for: Callable[[int], float | None] = lambda port: None
        self.records = SeatRecords(ports.store)  # the store's record of each live seat

    def bind(self, scheduler: Scheduler) -> None:
        """The scheduler, built over these effects: the collaborators that tell it what happened are built now."""
        p = self.parts
        p.scheduler = scheduler
        self.ending = Ending(p.table, p.config.engine, p.meters, p.clock, records=self.records, gone=scheduler.stopped,
                             changed=self._changed)
        self.stopper = Stopper(p.clock, p.history, p.processes, p.planning, ending=self.ending, records=self.records,
                               save_prompts=partial(keep_before_stop, p.kv, enabled=p.config.policy.prompt_cache,
                                                    machine=p.prices.machine, clock=p.clock),
                               stopped=self._stopped, freed=scheduler.stopped)
        self.watch = CrashWatch(p.clock, p.history, p.processes, p.config.engine, ending=self.ending,
                                spawn=self._spawn_task, crashed=scheduler.ending, stopped=self._stopped,
                                silent_for=lambda port: self.silent_for(port))
        prices = SeatPrices(p.prices, p.catalog, p.planning)
        self.loader = Loader(
            p.clock, p.history, p.processes, scheduler, prices=prices,
            launcher=Launcher(p.processes, p.table, p.clock, p.config.engine, prices=prices, ending=self.ending,
                              records=self.records, spawned=scheduler.spawned, changed=p.history.changed),
            ending=self.ending, readiness=Readiness(p.desk.shrinks, p.kv, p.config, p.prices),
            meter=Meter(p.meters, p.clock, p.processes),
            recorder=LoadRecorder(p.clock, p.history, p.planning,
                                  learning=Learning(p.prices, p.store, p.processes, p.clock),
                                  report=lambda seat, plan, rid: seat_load_report(
                                      seat, plan, p.planning.last_budget, p.seats, p.history.recent, rid).to_json()),
            watch=self.watch, spawn=self._spawn_task, closed=lambda: p.desk.closed, handed=lambda: self.handed,
            recording=self.recording)

    # -- the protocol ---------------------------------------------------------------------------

    def now(self) -> float:
        return self.parts.clock()

    def start(self, waiter: Waiter, plan: pl.Plan) -> None:
        self.loader.start(waiter, plan)

    def stop(self, key: str, event: str, reason: str, request_id: str | None) -> None:
        if self.loader.cancel(key, f"{event}: {reason}"):  # the load's own handler stops the process and records it
            return
        seat = self.parts.seats.get(key)
        if seat is None:
            self.parts.scheduler.stopped(key)
            return
        self._spawn_task(self.stopper.stop(seat, event, reason, request_id), f"stop-{key}")

    def dispatch(self, waiter: Waiter, key: str) -> None:
        fut = self.parts.desk.futures.pop(waiter, None)
        if fut is not None and not fut.done():
            fut.set_result(key)
            self.handed += waiter.hold
        elif waiter.hold:  # it left in the same instant: give the slot back
            asyncio.get_running_loop().call_soon(self.parts.scheduler.finished, key)

    def reject(self, waiter: Waiter, error: SupervisorError) -> None:
        refused = error if isinstance(error, Refused) else None
        if refused is not None and self.parts.pressure.under:  # it may fit once other programs let go: 503, retry
            relief = self.parts.pressure.last
            error = Busy(f"{refused.plan.reason}; under memory pressure from other programs "
                         f"({relief.reason() if relief else 'free memory below the reserve'}): retry once they let "
                         f"go of it", retry_after=10)
        fut = self.parts.desk.futures.pop(waiter, None)
        if fut is not None and not fut.done():
            fut.set_exception(error)
            fut.exception()  # retrieved here: a waiter that already left must not log "never retrieved"
        if refused is not None:
            plan = refused.plan
            needed = sum(plan.needed_bytes.values()) if plan.needed_bytes else None
            parts = self.parts
            task = self._spawn_task(parts.history.record(Event(
                time=parts.clock(), event="refuse", model=waiter.key, engine=parts.processes.engine_name(waiter.key),
                reason=plan.reason, request_id=waiter.request_id, predicted_bytes=needed,
                details={"plan": plan.to_json(), "under_pressure": sorted(parts.pressure.under),
                         **({"origin": dict(waiter.origin)} if waiter.origin else {})})), "record-refuse")
            self.recording.add(task)  # history and metrics readers settle it
            task.add_done_callback(self.recording.discard)

    def wake_at(self, when: float) -> None:
        if self._wake is not None:
            self._wake.cancel()
        loop = asyncio.get_running_loop()
        self._wake = loop.call_later(max(0.0, when - self.parts.clock()), self.parts.scheduler.tick)

    def prefetch(self, path: str) -> None:
        """``path`` read into the page cache off the event loop (``host.pagecache.read_ahead``) while its victims
        stop; a file that cannot be read is the load's to report, so a failure here is only logged."""
        async def ahead() -> None:
            try:
                files, n = await asyncio.to_thread(read_ahead, path)
            except OSError as e:
                log.info("%s not read ahead: %s", path, e)
                return
            log.debug("read ahead %s: %d file(s), %d bytes asked for (page cache: reclaimable, never budgeted)",
                      path, files, n)

        self._spawn_task(ahead(), "prefetch")

    # -- work -----------------------------------------------------------------------------------

    def _spawn_task(self, coro: Any, name: str) -> asyncio.Task:
        return self.parts.spawn(coro, name, _report_failure)

    def _changed(self) -> None:
        """Something observable changed (a seat's processes exited): whoever waits for a change is woken."""
        self._spawn_task(self.parts.history.changed(), "seat-exited")

    def _stopped(self, key: str, res: StopResult, *, slot_freed: bool = False, how: Exit = Exit.STOPPED) -> None:
        """A stop finished: the scheduler and whoever waits for it are told, and the change is announced."""
        self.parts.desk.stopped(self.parts.scheduler, key, res, slot_freed=slot_freed, how=how)
        self._spawn_task(self.parts.history.changed(), "seat-stopped")

    def install(self, seat: SeatState) -> None:
        """A seat that runs already (adopted from an earlier fitevict, its record READY): into the table, with its
        process, and watched."""
        self.parts.scheduler.adopt(seat.seat)
        self.parts.table.attach(seat.seat, seat)
        self.watch.watch_adopted(seat)


def _report_failure(task: asyncio.Task) -> None:
    """No swallowed exceptions: a supervisor task that failed says so in the server log, with its traceback."""
    if not task.cancelled() and task.exception() is not None:
        log.error("supervisor task %s failed", task.get_name(), exc_info=task.exception())
