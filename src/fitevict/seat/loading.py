"""A load the scheduler started (``Effects.start``), from its price to its record. Each load runs in a task of its
own: the seat's prediction (``price.SeatPrices``), its engine process launched until healthy
(``launching.Launcher``), what it starts with (``readiness.Readiness``), its exit watched (``watching.CrashWatch``),
then the scheduler told it is loaded (its waiters get it at once). What follows is off their path: the seat is read
(``measure.Meter``) once the first request handed to it was answered (or after ``FIRST_ANSWER_WAIT_S``), and its
load recorded (``loadrecord.LoadRecorder``). A load that fails for good records a ``fail`` with the seat's own
account of why (an engine killed before it was ready: by the kernel's OOM killer when the kernel says so, else
``killed``); one cancelled (every waiter left, or shutdown) at any step before its seat is ready, its prediction
included, is ended and recorded as an ``unload`` naming that step; whatever else goes wrong in it (a bug included)
ends as a failed load, so that no request waits for a load that will never finish and no process outlives it.

``Loader`` works with four parts: the clock, the history, the processes (the entry's engine, the seat's log) and the
scheduler; and with the collaborators above, the ending, and callables: ``spawn`` (background work), ``closed``
(fitevict is shutting down), ``handed`` (requests handed a seat so far); ``recording`` holds the load records still
being written (readers that settle wait for them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from fitevict.phase import mark
from fitevict import guard as guard_mod
from fitevict import planner as pl
from fitevict.engines.base import NO_WEIGHTS
from fitevict.host.oomkill import oom_evidence
from fitevict.pricing.footprint import HOST
from fitevict.schedule.errors import LoadFailed
from fitevict.schedule.scheduler import Scheduler, Waiter
from fitevict.schedule.seats import PLACING
from fitevict.store.records import Event
from fitevict.seat.accounts import engine_failure
from fitevict.seat.crash import exit_cause, exit_words
from fitevict.seat.ending import Ending
from fitevict.seat.launching import Attempt, Failed, Launcher
from fitevict.seat.loadrecord import LoadRecorder
from fitevict.seat.measure import Meter
from fitevict.seat.parts import EventLog
from fitevict.seat.price import SeatPrices
from fitevict.seat.processes import Processes
from fitevict.seat.readiness import Readiness
from fitevict.seat.running import SeatState, log_tail
from fitevict.seat.watching import CrashWatch

log = logging.getLogger("fitevict.seat")

# A new seat that was handed requests is read (its PSS, its log) once the first of them is answered, or after
# this long: the reading takes milliseconds of CPU that, on a small machine, would slow the engine's first answer.
FIRST_ANSWER_WAIT_S = 1.0
READY = "ready"  # the step of a load whose seat answered: a cancel from then on is no longer the load's


class Loader:
    def __init__(self, clock: Callable[[], float], history: EventLog, processes: Processes, scheduler: Scheduler, *,
                 prices: SeatPrices, launcher: Launcher, ending: Ending, readiness: Readiness, meter: Meter,
                 recorder: LoadRecorder, watch: CrashWatch,
                 spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task], closed: Callable[[], bool],
                 handed: Callable[[], int], recording: set[asyncio.Future]) -> None:
        self.clock, self.history, self.processes, self.scheduler = clock, history, processes, scheduler
        self.prices, self.launcher, self.ending, self.readiness = prices, launcher, ending, readiness
        self.meter, self.recorder, self.watch = meter, recorder, watch
        self.spawn, self.closed, self.handed, self.recording = spawn, closed, handed, recording
        self.loads: dict[str, asyncio.Task] = {}  # loads not ready yet, by key: a stop cancels them

    def start(self, waiter: Waiter, plan: pl.Plan) -> None:
        self.loads[waiter.key] = self.spawn(self.load(waiter, plan), f"load-{waiter.key}")

    async def quiet(self) -> None:
        """Until no load is under way (each load's task ended, its record included): work that can wait, the prices
        read ahead, leaves the cores to the engines that load. Their dry runs took 0.9-2.2 s of CPU each for a 1B
        model on a 2-core machine (measured), which a load beside them on the same cores waits for."""
        while pending := {t for t in self.loads.values() if not t.done()}:
            await asyncio.wait(pending)

    def cancel(self, key: str, why: str) -> bool:
        """Cancel ``key``'s load if it is not ready yet (its own handler stops the process and records it)."""
        task = self.loads.pop(key, None)
        if task is not None and not task.done():
            task.cancel(why)
            return True
        return False

    async def load(self, waiter: Waiter, plan: pl.Plan) -> None:
        """One load; a cancel at any step before it is ready ends as a cancelled load, whatever else goes wrong in it
        (a bug included) as a failed load."""
        attempt, t0 = Attempt(), self.clock()
        try:
            try:
                await self.launcher.prune_logs()  # within [logs]
                await self._load(waiter, plan, attempt)
            except asyncio.CancelledError as e:  # nobody waits for this load any more, or fitevict is shutting down
                if attempt.step == READY:
                    raise  # a seat that serves: its stop is the stopper's
                await self._cancelled(waiter, attempt, e.args[0] if e.args else "load cancelled", t0)
        except Exception as e:
            refused = isinstance(e, LoadFailed)  # refused before its engine started (its binary changed): no bug
            if not refused:
                log.error("loading %s failed unexpectedly", waiter.key, exc_info=e)
            seat = attempt.seat
            if seat is not None and seat.proc is not None and not seat.expected_exit:
                await self.ending.end(seat)
            record = self.scheduler.seats.get(waiter.key)
            if record is not None and record.status in PLACING:
                await self.history.record(Event(
                    time=self.clock(), event="fail", model=waiter.key,
                    engine=self.processes.engine_name(waiter.key),
                    reason=str(e) if refused else f"{waiter.key}: the load failed inside fitevict: {type(e).__name__}: "
                                                  f"{e}",
                    request_id=waiter.request_id, details={"error": repr(e)}))
                self.scheduler.load_failed(waiter.key, e if refused else LoadFailed(
                    f"{waiter.key}: the load failed inside fitevict: {type(e).__name__}: {e}; see the server log"))

    async def _load(self, waiter: Waiter, plan: pl.Plan, attempt: Attempt) -> None:
        key = waiter.key
        attempt.step = "pricing the seat (its prediction, a GPU placement's dry run first)"
        mark(key, "load begins")
        entry, path = self.prices.asked(waiter)
        assert plan.config is not None
        predicted = await self.prices.predicted(waiter, entry, plan.config, path)
        attempt.step = "starting its engine (until its first healthy answer)"
        mark(key, "priced")
        t0 = self.clock()
        failed = await self.launcher.launch(attempt, entry, plan.config, path, predicted, plan)
        if failed is not None:
            self.loads.pop(key, None)  # its end is being recorded: no cancel from now on
            await self._fail(waiter, plan, attempt, failed, t0)
            return
        seat, cfg = attempt.seat, attempt.config
        assert seat is not None and cfg is not None and attempt.spec is not None
        self.loads.pop(key, None)
        attempt.step = READY
        load_seconds = self.clock() - t0
        mark(key, "healthy")
        await self.readiness.ready(seat, attempt.crash)
        self.watch.watch(seat)
        held = {HOST: seat.bytes_on(HOST), **{d: seat.bytes_on(d) for d in cfg.devices}}
        recorded = asyncio.get_running_loop().create_future()  # readers that settle wait for the record below
        self.recording.add(recorded)
        recorded.add_done_callback(self.recording.discard)
        try:
            handed = self.handed()
            self.scheduler.loaded(key, bytes=held, bytes_source=seat.source_on(HOST), load_seconds=load_seconds,
                                  config=cfg)  # the waiters get the seat now: what follows is off their path
            mark(key, "handed to its waiters")
            if self.handed() > handed:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(seat.answered.wait(), FIRST_ANSWER_WAIT_S)
            self.meter.read(seat)
            await self.recorder.record(seat, plan, waiter, attempt.spec.notes)
        finally:
            recorded.set_result(None)

    async def _cancelled(self, waiter: Waiter, attempt: Attempt, why: str, t0: float) -> None:
        """A load nobody waits for any more (every client left), or cut by shutdown, at whatever step it was (its
        prediction, its engine's start): its process ended if it had one, an ``unload`` recorded with the step it
        was cut at, and the scheduler told."""
        seat, res = attempt.seat, None
        if seat is not None and (not seat.expected_exit or (seat.proc is not None and seat.proc.returncode is None)):
            res = await self.ending.end(seat)
        await self.history.record(Event(
            time=self.clock(), event="unload", model=waiter.key,
            engine=seat.engine if seat is not None else self.processes.engine_name(waiter.key),
            seconds=res.exit_seconds if res is not None else None,
            reason=("no one waiting: every request for this load left before it finished"
                    if not self.closed() else "fitevict is shutting down: load cancelled"),
            request_id=waiter.request_id, freed_bytes=res.freed_bytes if res is not None else None,
            details={"cancelled_after_seconds": self.clock() - t0, "cancelled_at": attempt.step, "note": str(why),
                     "engine_started": seat is not None, **(res.details() if res is not None else {})}))
        if seat is not None:
            self.processes.done_with_log(seat.log_path)
        self.scheduler.stopped(waiter.key)

    async def _fail(self, waiter: Waiter, plan: pl.Plan, attempt: Attempt, failed: Failed, t0: float) -> None:
        """A load that failed for good: recorded with the seat's own account of why (both attempts named after a
        repack-crash retry), and its waiters told."""
        seat, key, e, res, crash = attempt.seat, waiter.key, failed.error, failed.res, attempt.crash
        assert seat is not None and attempt.spec is not None
        details = {"log": str(seat.log_path), "argv": list(attempt.spec.argv), "pid": seat.pid, **res.details()}
        killed = None
        if failed.code is not None:  # it exited on its own before it was ready: how, in the kernel's words too
            ended, killed = await self._ended(seat, failed.code)
            details.update(ended)
            if killed is not None:  # a kill is the cause, whatever its log says
                e = LoadFailed(f"{key}: {killed}; log {seat.log_path}:\n{log_tail(seat.log_path)}")
        if crash is not None:
            details["repack_crash"] = crash.to_json()
            e = LoadFailed(f"{key}: llama-server died by {crash.signal} with repacking on, and the retry "
                           f"with -nr failed too: {e}")
        engine = self.processes.engine_for(seat.entry)
        why = engine_failure(engine, seat.log_path) if killed is None else None
        if why is not None:  # the seat's own account (a transformers walk that found no weights, ...)
            no_weights = seat.proc is not None and engine.exit_meaning(seat.proc.returncode) == NO_WEIGHTS
            verdict = guard_mod.check_walk(None, reason=why) if no_weights else None
            details["guard"] = ({"accepted": False, "check": verdict.check, "reason": verdict.reason}
                                if verdict is not None else None)
            e = LoadFailed(f"{key}: {verdict.reason if verdict is not None else why}")
        await self.history.record(Event(
            time=self.clock(), event="fail", model=key, engine=seat.engine, seconds=self.clock() - t0,
            strategy=plan.action, reason=str(e), request_id=waiter.request_id,
            predicted_bytes=seat.predicted.whole_bytes, buffers_predicted_bytes=seat.predicted.total_bytes,
            freed_bytes=res.freed_bytes, details=details))
        self.processes.done_with_log(seat.log_path)
        self.scheduler.load_failed(key, e)

    async def _ended(self, seat: SeatState, code: int) -> tuple[dict[str, Any], str | None]:
        """How an engine that exited before it was ready ended (``crash.exit_cause``), the kernel asked whether a
        SIGKILL was its OOM killer's (``host.oomkill.oom_evidence``, from what it said of the process while it
        loaded): the details, and for a kill the words that say so (None for another end: its log's account
        stands)."""
        oom = (await asyncio.to_thread(oom_evidence, seat.pid, seat.kernel_seen)
               if code == -signal.SIGKILL and seat.pid is not None else None)
        cause = exit_cause(code, oom)
        details = {"exit_code": code, "cause": cause, "oom": oom}
        if cause not in ("oom-killer", "killed"):
            return details, None
        return details, (f"{exit_words(seat.engine, code, oom)} while loading {seat.model_path.name}, before it "
                         f"was ready (cause: {cause})")
