"""The real ``Effects``: what the scheduler's decisions do to the world.

``start`` spawns an engine process and waits for it to be healthy; ``stop`` stops one and verifies that
its memory came back; ``dispatch``/``reject`` answer the waiting requests. Each call returns at once
(the work runs in a task) and its completion goes back to the scheduler as an input. Every stop, whatever
ended the seat (eviction, unload, idle, a failed load, a crash, a cancelled load, shutdown), goes through
``supervisor.release.stop_and_verify`` and is recorded with what came back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fitevict import guard as guard_mod
from fitevict import planner as pl
from fitevict.engines import traits
from fitevict.budget import Budget
from fitevict.pricing.footprint import HOST, Footprint
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.request.catalog import CatalogEntry
from fitevict.request.ask import passthrough_args
from fitevict.supervisor.loadreport import seat_load_report
from fitevict.store.records import Event, Measurement
from fitevict.supervisor.accounts import engine_failure, file_bytes, leak_check, leak_event, strategy, timings
from fitevict.host.oomkill import oom_evidence
from fitevict.supervisor.crash import RepackCrash, exit_cause, exit_reason, retry_without_repack
from fitevict.supervisor.frozen import watch_frozen
from fitevict.supervisor.kvkeep import keep_before_stop
from fitevict.prices.learned import learn_engine_overhead, learn_torch_overhead
from fitevict.supervisor.ports import Ports
from fitevict.schedule.errors import Busy, LoadFailed, Refused, SupervisorError
from fitevict.engines.torch_seat import EXIT_NO_WEIGHTS
from fitevict.supervisor.measure import mem_json, overhead_seen, read_seat
from fitevict.prices.overhead import grown_overhead, host_overhead, overhead_label
from fitevict.supervisor.release import StopResult, stop_and_verify
from fitevict.supervisor.storing import STOPPING, SeatRecords, last_measurement, store_measurement
from fitevict.schedule.scheduler import Waiter
from fitevict.schedule.seats import PLACING, SERVING, Exit
from fitevict.supervisor.seat import BIND_FAILED, SeatState, file_changed, log_tail, spawn, wait_ready

log = logging.getLogger("fitevict.supervisor")
VERIFY_HOLD_S = 2.0  # a stop holds the next placement at most this long after its processes exited (see _end)

# A new seat that was handed requests is read (its PSS, its log) once the first of them is answered, or after
# this long: the reading takes milliseconds of CPU that, on a small machine, would slow the engine's first answer.
FIRST_ANSWER_WAIT_S = 1.0


class LiveEffects:
    def __init__(self, ports: Ports) -> None:
        self.parts = ports  # the supervisor's parts, named (supervisor.ports): never the supervisor itself
        # the two readings a plan needs are the planning part's (the scheduler plans over its own seats, whose
        # records read what each process holds now: schedule.seats.Holds)
        self.budget: Callable[[], Budget] = ports.planning.plan_budget
        self.prices: Callable[[pl.PlanRequest], pl.FootprintFn] = ports.planning.footprints
        self.loads: dict[str, asyncio.Task] = {}
        self.recording: set[asyncio.Future] = set()  # load records still being written (history readers settle)
        self._wake: asyncio.TimerHandle | None = None
        self.handed = 0  # requests handed a seat by ``dispatch`` (a load reads its seat after the first answer)
        self.frozen: dict[SeatState, str] = {}  # seats killed because they were stopped or stuck (supervisor.frozen)
        # seconds the front door has waited for the next byte from the seat on a port (None: it waits for none);
        # the server sets it from its connection pool, so that a stuck seat can be told from a slow client
        self.silent_for: Callable[[int], float | None] = lambda port: None
        self.records = SeatRecords(ports.store)  # the store's record of each live seat

    # -- the protocol ---------------------------------------------------------------------------

    def now(self) -> float:
        return self.parts.clock()

    def start(self, waiter: Waiter, plan: pl.Plan) -> None:
        self.loads[waiter.key] = self._spawn_task(self._load(waiter, plan), f"load-{waiter.key}")

    def stop(self, key: str, event: str, reason: str, request_id: str | None) -> None:
        task = self.loads.pop(key, None)
        if task is not None and not task.done():
            task.cancel(f"{event}: {reason}")  # the load's own handler stops the process and records it
            return
        seat = self.parts.seats.get(key)
        if seat is None:
            self.parts.scheduler.stopped(key)
            return
        self._spawn_task(self.stop_seat(seat, event, reason, request_id), f"stop-{key}")

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

    # -- work -----------------------------------------------------------------------------------

    def _spawn_task(self, coro: Any, name: str) -> asyncio.Task:
        return self.parts.spawn(coro, name, _report_failure)

    def _stopped(self, key: str, res: StopResult, *, slot_freed: bool = False, how: Exit = Exit.STOPPED) -> None:
        """A stop finished: the scheduler and whoever waits for it are told, and the change is announced."""
        self.parts.desk.stopped(self.parts.scheduler, key, res, slot_freed=slot_freed, how=how)
        self._spawn_task(self.parts.history.changed(), "seat-stopped")

    def install(self, seat: SeatState) -> None:
        """A seat that runs already (adopted from an earlier fitevict, its record READY): into the table, with its
        process, and watched."""
        self.parts.scheduler.adopt(seat.seat)
        self.parts.table.attach(seat.seat, seat)
        self.watch_adopted(seat)

    async def _load(self, waiter: Waiter, plan: pl.Plan) -> None:
        """One load; whatever goes wrong in it (a bug included) ends as a failed load, so no request waits for a
        load that will never finish and no process outlives it."""
        try:
            await self.parts.processes.prune_logs(self.parts.seats.values())  # within [logs]
            await self._load_seat(waiter, plan)
        except Exception as e:
            refused = isinstance(e, LoadFailed)  # refused before its engine started (its binary changed): no bug
            if not refused:
                log.error("loading %s failed unexpectedly", waiter.key, exc_info=e)
            seat = self.parts.seats.get(waiter.key)
            if seat is not None and not seat.expected_exit:
                await self._end(seat)
            record = self.parts.scheduler.seats.get(waiter.key)
            if record is not None and record.status in PLACING:
                await self.parts.history.record(Event(
                    time=self.parts.clock(), event="fail", model=waiter.key,
                    engine=self.parts.processes.engine_name(waiter.key),
                    reason=str(e) if refused else f"{waiter.key}: the load failed inside fitevict: {type(e).__name__}: "
                                                  f"{e}",
                    request_id=waiter.request_id, details={"error": repr(e)}))
                self.parts.scheduler.load_failed(waiter.key, e if refused else LoadFailed(
                    f"{waiter.key}: the load failed inside fitevict: {type(e).__name__}: {e}; see the server log"))

    async def _load_seat(self, waiter: Waiter, plan: pl.Plan) -> None:
        parts, key = self.parts, waiter.key
        entry = parts.catalog.resolve(key)
        assert plan.config is not None
        cfg, path = plan.config, parts.planning.path_for(waiter.request)
        predicted = await self._predicted(waiter, entry, cfg, path)
        engine = parts.processes.engine_for(entry)
        t0 = parts.clock()
        seat: SeatState | None = None
        crash: RepackCrash | None = None
        try:
            for attempt in (1, 2, 3):
                # The port is free when chosen but another process may take it first; the engine then fails to
                # bind at once, before it reads a weight, and one retry on a new port is enough.
                seat = self._new_seat(key, entry, cfg, path, predicted, plan, after=seat)
                spec = parts.processes.launch_spec(entry, path, cfg, seat.port)
                await spawn(seat, spec)
                parts.table.attach(seat.seat, seat)
                parts.scheduler.spawned(key, cfg)
                await parts.history.changed()
                self.records.keep(seat)  # a restart finds it, and that its load had not ended (``storing``)
                try:
                    await wait_ready(seat, clock=parts.clock, health_timeout=parts.config.engine.health_timeout_seconds,
                                     stall_seconds=parts.config.engine.stall_seconds, health_path=spec.health_path)
                    break
                except LoadFailed as e:
                    code = seat.proc.returncode if seat.proc is not None else None
                    res = await self._end(seat)
                    if attempt == 1 and BIND_FAILED in log_tail(seat.log_path, 200):
                        continue
                    sig = retry_without_repack(traits(entry.engine).repacks, cfg, code) if crash is None else None
                    if sig is not None:  # once, with no extra CPU buffer types, priced for that configuration
                        crash = RepackCrash(sig, parts.clock() - t0, str(seat.log_path), predicted.whole_bytes,
                                            res.freed_bytes, parts.prices.host.label())
                        log.warning("%s: llama-server died by %s with repacking on; loading it again with -nr",
                                    key, sig)
                        cfg = cfg.with_(repack=False)
                        parts.prices.no_repack(path)
                        predicted = (await parts.prices.sheet(path, cfg)).footprint(cfg)
                        continue
                    await self._fail_load(waiter, plan, seat, list(spec.argv), res, e, crash, t0)
                    return
        except asyncio.CancelledError as e:
            # nobody waits for this load any more (every client left), or fitevict is shutting down
            why = e.args[0] if e.args else "load cancelled"
            if seat is not None and not seat.expected_exit:
                res = await self._end(seat)
                await parts.history.record(Event(
                    time=parts.clock(), event="unload", model=key, engine=entry.engine, seconds=res.exit_seconds,
                    reason=("no one waiting: every request for this load left before it finished"
                            if not parts.desk.closed else "fitevict is shutting down: load cancelled"),
                    request_id=waiter.request_id, freed_bytes=res.freed_bytes,
                    details={"cancelled_after_seconds": parts.clock() - t0, "note": str(why), **res.details()}))
                parts.processes.done_with_log(seat.log_path)
            parts.scheduler.stopped(key)
            return
        assert seat is not None
        self.loads.pop(key, None)
        self.records.keep(seat, "ready")
        load_seconds = parts.clock() - t0
        await self._ready(seat, crash)
        held = {HOST: seat.bytes_on(HOST), **{d: seat.bytes_on(d) for d in cfg.devices}}
        recorded = asyncio.get_running_loop().create_future()  # readers that settle wait for the record below
        self.recording.add(recorded)
        recorded.add_done_callback(self.recording.discard)
        try:
            handed = self.handed
            parts.scheduler.loaded(key, bytes=held, bytes_source=seat.source_on(HOST), load_seconds=load_seconds,
                                   config=cfg)  # the waiters get the seat now: what follows is off their path
            if self.handed > handed:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(seat.answered.wait(), FIRST_ANSWER_WAIT_S)
            read_seat(seat, engine, parts.nvml, parts.clock())
            await self._record_load(seat, plan, waiter, spec.notes)
        finally:
            recorded.set_result(None)

    async def _predicted(self, waiter: Waiter, entry: CatalogEntry, cfg: LoadConfig, path: Path) -> Footprint:
        """The seat's prediction: the request's quote, unless the book or its file changed since it was quoted (a
        GPU placement's dry run, run first, lands as a new version of the book, never a changed quote)."""
        parts = self.parts
        if cfg.devices and traits(entry.engine).dry_run and not parts.prices.has_dry_run(path, cfg):
            await parts.prices.dry_run(entry, cfg, path, passthrough_args(entry))  # its compute buffers (cached)
        quote = waiter.request.quote
        if quote is None or not parts.prices.holds(quote):
            quote = await parts.prices.sheet(path, cfg)
        return quote.footprint(cfg)

    async def _ready(self, seat: SeatState, crash: RepackCrash | None) -> None:
        """A seat that answered its health check: what it starts with (its saved prompts, its shrink, the engine
        overhead it is counted with) and a watcher for its exit; the scheduler marks it ready next."""
        parts, cfg = self.parts, seat.config
        seat.repack_crash = crash
        seat.shrunk_from = parts.desk.shrinks.pop((seat.key, cfg.n_ctx), None)
        if traits(seat.engine).keeps_prompts and parts.config.policy.prompt_cache:
            seat.kv_candidates = await asyncio.to_thread(parts.kv.matching, seat.signature)
        fixed = parts.prices.engine_overhead.get(HOST, 0)
        if traits(seat.engine).overhead == "calibrated":
            seat.overhead = host_overhead(seat.predicted, parts.prices.engine_overhead)
        else:  # a seat whose process is its own (a torch seat's), never the llama-server build's calibration
            seat.overhead = int(seat.predicted_overhead or 0)
        seat.overhead_label = overhead_label(seat.engine, fixed, parts.prices.overhead_origin, seat.predicted_overhead)
        seat.gpu_overhead = {d: n for d, n in parts.prices.engine_overhead.items() if d in cfg.devices}
        seat.watcher = self._spawn_task(self._watch(seat), f"watch-{seat.key}")
        self._spawn_task(watch_frozen(seat, parts.config.engine.stall_seconds, self.frozen.__setitem__,
                                      lambda port: self.silent_for(port)), f"frozen-{seat.key}")

    def _new_seat(self, key: str, entry: Any, cfg: Any, path: Path, predicted: Any, plan: pl.Plan,
                  after: SeatState | None) -> SeatState:
        """The record of a seat about to start: a fresh port and log, its price and signature (``after``: the
        attempt before, which failed and was read: its log may go)."""
        parts = self.parts
        if after is not None:
            parts.processes.done_with_log(after.log_path)
        record = parts.table.get(key)
        assert record is not None, f"{key}: a load without its seat in the table"
        return SeatState(
            id=uuid.uuid4().hex[:12], seat=record, entry=entry, engine=entry.engine, model_path=path,
            port=parts.processes.next_port(), log_path=parts.processes.log_path(key),
            started_at=parts.clock(), predicted=predicted, signature=parts.prices.signature(path, cfg),
            strategy=plan.action, split=plan.split,
            predicted_overhead=parts.prices.torch_overhead_for(cfg.loras) if path.is_dir() else None)

    async def _fail_load(self, waiter: Waiter, plan: pl.Plan, seat: SeatState, argv: list[str], res: StopResult,
                         e: LoadFailed, crash: RepackCrash | None, t0: float) -> None:
        """A load that failed for good: recorded with the seat's own account of why (both attempts named after a
        repack-crash retry), and its waiters told."""
        parts, key = self.parts, waiter.key
        details = {"log": str(seat.log_path), "argv": argv, "pid": seat.pid, **res.details()}
        if crash is not None:
            details["repack_crash"] = crash.to_json()
            e = LoadFailed(f"{key}: llama-server died by {crash.signal} with repacking on, and the retry "
                           f"with -nr failed too: {e}")
        why = engine_failure(parts.processes.engine_for(seat.entry), seat.log_path)
        if why is not None:  # the seat's own account (a transformers walk that found no weights, ...)
            no_weights = seat.proc is not None and seat.proc.returncode == EXIT_NO_WEIGHTS
            verdict = guard_mod.check_walk(None, reason=why) if no_weights else None
            details["guard"] = ({"accepted": False, "check": verdict.check, "reason": verdict.reason}
                                if verdict is not None else None)
            e = LoadFailed(f"{key}: {verdict.reason if verdict is not None else why}")
        await parts.history.record(Event(
            time=parts.clock(), event="fail", model=key, engine=seat.engine, seconds=parts.clock() - t0,
            strategy=plan.action, reason=str(e), request_id=waiter.request_id,
            predicted_bytes=seat.predicted.whole_bytes, buffers_predicted_bytes=seat.predicted.total_bytes,
            freed_bytes=res.freed_bytes, details=details))
        parts.processes.done_with_log(seat.log_path)
        parts.scheduler.load_failed(key, e)

    async def _record_load(self, seat: SeatState, plan: pl.Plan, waiter: Waiter, notes: Any) -> None:
        """Learn the overhead, guard the measurement, store it if accepted, record a ``load`` (or ``reject``)."""
        parts, request_id = self.parts, waiter.request_id
        log_text = seat.log_path.read_text(errors="replace")
        walk = parts.processes.engine_for(seat.entry).document(log_text)
        mem = seat.load_mem  # the reading right after the load (the sampler's later ones are the live figure)
        if walk is not None and mem is not None and mem.host_bytes is not None:
            # a transformers seat: its own process (Python, torch and their libraries, as the budget counts them:
            # PSS) is what it holds beyond its priced model, cache and activations; the largest seen is kept
            priced = seat.predicted.bytes_on(HOST) - int(seat.predicted_overhead or 0)
            await learn_torch_overhead(parts.prices, parts.store, mem.host_bytes - priced,
                                       adapters=bool(seat.config.loras))
        else:
            grown = grown_overhead(parts.prices.engine_overhead, overhead_seen(seat, parts.prices.engine_overhead))
            if grown:
                await learn_engine_overhead(parts.prices, parts.store, parts.processes.engine_binary, grown)
        measured_total = seat.measured.total_bytes if seat.measured else None
        previous = await last_measurement(parts.store, seat.signature)
        verdict = guard_mod.check_walk(walk["walk"].get("weight_bytes")) if walk is not None else None
        if verdict is None or verdict.accepted:
            # the 1 MiB floor is llama.cpp's (its buffers alone exceed it); a walk that found weights is the proof
            # of a load for a transformers seat, so only the ratio against the same signature applies there
            floor = 0 if walk is not None else guard_mod.IMPLAUSIBLE_FLOOR_BYTES
            verdict = guard_mod.check_measurement(measured_total, file_bytes=file_bytes(seat.model_path),
                                                  previous=previous.total_bytes if previous else None,
                                                  floor_bytes=floor)
        details: dict[str, Any] = {
            "port": seat.port, "pid": seat.pid, "log": str(seat.log_path), "config": seat.config.to_json(),
            "machine": parts.prices.machine,  # what was learned here prices this machine only
            "predicted": seat.predicted.to_json(),
            "measured": seat.measured.to_json() if seat.measured else seat.measured_note,
            "host_pss": mem_json(mem),
            "guard": {"accepted": verdict.accepted, "check": verdict.check, "reason": verdict.reason},
            "notes": list(notes), "compute_source": parts.prices.compute_source(seat.model_path, seat.config),
            "previous_measured_bytes": previous.total_bytes if previous else None,
            "load_report": seat_load_report(seat, plan, parts.planning.last_budget, parts.seats).to_json(),
            **({"origin": dict(waiter.origin)} if waiter.origin else {}),
        }
        if seat.repack_crash is not None:  # kept with the file and machine: the next load starts with -nr
            st = seat.model_path.stat()
            details["repack_crash"] = {**seat.repack_crash.to_json(), "machine": parts.prices.machine,
                                       "file": {"path": str(seat.model_path), "size": st.st_size,
                                                "mtime_ns": st.st_mtime_ns}}
        if measured_total:
            details["prediction_error"] = (seat.predicted.total_bytes - measured_total) / measured_total
        learnable = walk is None and seat.entry.mmproj is None and seat.measured is not None
        if learnable:  # the file this load measured: its error corrects the same file's price at other settings
            st = seat.model_path.stat()
            details["file"] = {"path": str(seat.model_path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        if verdict.accepted and seat.measured is not None:
            details["measurement_stored"] = await store_measurement(parts.store, Measurement(
                signature=seat.signature, model=seat.key, engine=seat.engine, measured_at=parts.clock(),
                footprint=seat.measured.to_json(),
                host_committed_bytes=mem.committed_bytes if mem else None,
                host_mapped_bytes=mem.mapped_bytes if mem else None, total_bytes=measured_total))
            parts.prices.forget()  # a new measurement overrides the priced figure for its signature
            if learnable:
                parts.prices.learn(seat.model_path, seat.config, seat.measured)
        gpu = parts.planning.gpu_figure(seat)
        reason = plan.reason or None
        if seat.repack_crash is not None:
            reason = "; ".join(r for r in (seat.repack_crash.reason(seat.key), reason) if r)
        if not verdict.accepted:
            reason = (f"loaded, but its measurement was rejected by the {verdict.check} check and not stored: "
                      f"{verdict.reason}")
        await parts.history.record(Event(  # dated when the seat became ready, not when this record was written
            time=seat.ready_at or parts.clock(), event="load" if verdict.accepted else "reject", model=seat.key,
            engine=seat.engine,
            seconds=seat.load_seconds, vram_bytes=gpu, host_bytes=seat.bytes_on(HOST),
            offloaded_bytes=parts.planning.spilled(seat), strategy=strategy(plan), request_id=request_id,
            reason=reason,
            predicted_bytes=seat.predicted.whole_bytes, buffers_predicted_bytes=seat.predicted.total_bytes,
            engine_reported_bytes=measured_total, details=details))

    async def _end(self, seat: SeatState, *, free_slot: bool = False) -> StopResult:
        """Stop ``seat``'s process group, verify the release, and forget the seat. ``free_slot``: if verifying the
        release takes longer than ``VERIFY_HOLD_S`` after the processes exited (another program growing at the same
        moment can hide it until the timeout), tell the scheduler the seat is gone then, so that the next placement
        does not wait for it (``Supervisor.stopped`` then leaves the scheduler alone). How the seat left (stopped,
        failed, crashed) is the scheduler's to record, when it is told."""
        parts = self.parts
        seat.expected_exit = True
        hold: list[asyncio.TimerHandle] = []

        def free() -> None:
            if not seat.slot_freed and parts.table.get(seat.key) is seat.seat:
                seat.slot_freed = True
                parts.scheduler.stopped(seat.key)

        def exited() -> None:
            parts.table.detach(seat.seat, seat)
            if free_slot:
                hold.append(asyncio.get_running_loop().call_later(VERIFY_HOLD_S, free))
            self._spawn_task(parts.history.changed(), "seat-exited")

        res = await stop_and_verify(seat.key, seat.pgid, seat.config.devices, proc=seat.proc,
                                    grace=parts.config.engine.stop_grace_seconds,
                                    release_timeout=parts.config.engine.release_timeout_seconds, nvml=parts.nvml,
                                    clock=parts.clock, gpu_held=seat.gpu_bytes, on_exit=exited)
        for h in hold:
            h.cancel()
        parts.table.detach(seat.seat, seat)
        await self.records.forget(seat)
        return res

    async def stop_seat(self, seat: SeatState, event: str, reason: str, request_id: str | None) -> StopResult:
        parts = self.parts
        self.records.keep(seat, STOPPING + event)  # a restart knows this stop was under way
        kept = await keep_before_stop(parts.kv, seat, event, enabled=parts.config.policy.prompt_cache,
                                      machine=parts.prices.machine, clock=parts.clock)
        res = await self._end(seat, free_slot=True)
        engine = parts.processes.engine_for(seat.entry)
        report = engine.teardown(seat.log_path.read_text(errors="replace"))
        await parts.history.record(Event(
            time=parts.clock(), event=event, model=seat.key, engine=seat.engine, seconds=res.exit_seconds,
            host_bytes=seat.bytes_on(HOST), vram_bytes=parts.planning.gpu_figure(seat), reason=reason,
            freed_bytes=res.freed_bytes, request_id=request_id,
            details={"pid": seat.pid, **timings(seat),
                     "host_source": f"{seat.source_on(HOST)}: what the seat was counted at when it stopped",
                     "vram_source": (f"{seat.source_on(seat.config.devices[0])}: what the seat held on its GPUs"
                                     if seat.config.devices else None), **res.details(),
                     **({"leak_check": leak_check(report, res)} if engine.traits.reports_teardown else {}), **kept}))
        if (leaked := leak_event(seat, report, request_id, parts.clock())) is not None:
            await parts.history.record(leaked)
        parts.processes.done_with_log(seat.log_path)
        self._stopped(seat.key, res, slot_freed=seat.slot_freed)
        return res

    async def _watch(self, seat: SeatState) -> None:
        assert seat.proc is not None
        rc = await seat.proc.wait()
        if seat.expected_exit or seat.state not in SERVING:
            return
        parts = self.parts
        parts.scheduler.ending(seat.key)  # it serves nothing more while its stop is verified
        res = await self._end(seat)
        frozen = self.frozen.pop(seat, None)
        oom = await asyncio.to_thread(oom_evidence, seat.pid, seat.kernel_seen) if rc == -9 and not frozen else None
        changed = file_changed(seat)  # a seat whose mapped file was cut short dies of SIGBUS: say so
        await parts.history.record(Event(
            time=parts.clock(), event="crash", model=seat.key, engine=seat.engine, freed_bytes=res.freed_bytes,
            reason=(frozen or exit_reason(seat.engine, rc, oom)) + (f"; {changed}" if changed else ""),
            details={"exit_code": rc, "pid": seat.pid, "log": str(seat.log_path), **timings(seat),
                     "cause": "frozen" if frozen else exit_cause(rc, oom), "oom": oom, "file_changed": changed,
                     "log_tail": log_tail(seat.log_path, 10), **res.details()}))
        parts.processes.done_with_log(seat.log_path)
        self._stopped(seat.key, res, how=Exit.CRASHED)

    def watch_adopted(self, seat: SeatState) -> None:
        """An adopted seat is not our child: its exit is seen through a pidfd."""
        async def watch() -> None:
            from fitevict.engines.process import wait_pid_gone

            assert seat.pid is not None
            await wait_pid_gone(seat.pid, None)
            if seat.expected_exit or seat.state not in SERVING:
                return
            self.parts.scheduler.ending(seat.key)
            res = await self._end(seat)
            await self.parts.history.record(Event(
                time=self.parts.clock(), event="crash", model=seat.key, engine=seat.engine, freed_bytes=res.freed_bytes,
                reason="adopted seat exited unexpectedly (not a child of this fitevict: exit code unknown)",
                details={"pid": seat.pid, **timings(seat), **res.details()}))
            self._stopped(seat.key, res, how=Exit.CRASHED)

        seat.watcher = self._spawn_task(watch(), f"watch-{seat.key}")


def _report_failure(task: asyncio.Task) -> None:
    """No swallowed exceptions: a supervisor task that failed says so in the server log, with its traceback."""
    if not task.cancelled() and task.exception() is not None:
        log.error("supervisor task %s failed", task.get_name(), exc_info=task.exception())
