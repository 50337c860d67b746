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
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fitevict import guard as guard_mod
from fitevict import planner as pl
from fitevict.contract import passthrough_args
from fitevict.loadreport import seat_load_report
from fitevict.pricing.footprint import HOST
from fitevict.store.records import Event, Measurement
from fitevict.supervisor.crash import RepackCrash, retry_without_repack
from fitevict.supervisor.kvkeep import keep_before_stop
from fitevict.supervisor.errors import Busy, LoadFailed, Refused, SupervisorError
from fitevict.engines.torch_seat import EXIT_NO_WEIGHTS
from fitevict.supervisor.measure import grown_overhead, host_overhead, mem_json, overhead_seen, read_seat
from fitevict.supervisor.release import StopResult, stop_and_verify
from fitevict.supervisor.scheduler import Waiter
from fitevict.supervisor.seat import BIND_FAILED, SeatPhase, SeatState, log_tail, spawn, wait_ready

if TYPE_CHECKING:
    from fitevict.supervisor.core import Supervisor

log = logging.getLogger("fitevict.supervisor")
VERIFY_HOLD_S = 2.0  # a stop holds the next placement at most this long after its processes exited (see _end)

# A new seat that was handed requests is read (its PSS, its log) once the first of them is answered, or after
# this long: the reading takes milliseconds of CPU that, on a small machine, would slow the engine's first answer.
FIRST_ANSWER_WAIT_S = 1.0


class LiveEffects:
    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.loads: dict[str, asyncio.Task] = {}
        self.tasks: set[asyncio.Task] = set()
        self.recording: set[asyncio.Future] = set()  # load records still being written (history readers settle)
        self._wake: asyncio.TimerHandle | None = None
        self.handed = 0  # requests handed a seat by ``dispatch`` (a load reads its seat after the first answer)

    # -- the protocol ---------------------------------------------------------------------------

    def now(self) -> float:
        return self.sup.clock()

    def plan(self, request: pl.PlanRequest, residents: list[pl.Resident]) -> pl.Plan:
        sup = self.sup
        live = []
        for r in residents:  # the scheduler's view, with what each seat really holds (measured where it can be)
            seat = sup.seats.get(r.key)
            if seat is not None:
                held = {HOST: seat.bytes_on(HOST), **{d: seat.bytes_on(d) for d in seat.config.devices}}
                r = replace(r, bytes=held, bytes_source=seat.source_on(HOST))
            live.append(r)
        return sup.plan_now(request, live)

    def start(self, waiter: Waiter, plan: pl.Plan) -> None:
        self.loads[waiter.key] = self._spawn_task(self._load(waiter, plan), f"load-{waiter.key}")

    def stop(self, key: str, event: str, reason: str, request_id: str | None) -> None:
        task = self.loads.pop(key, None)
        if task is not None and not task.done():
            task.cancel(f"{event}: {reason}")  # the load's own handler stops the process and records it
            return
        seat = self.sup.seats.get(key)
        if seat is None:
            self.sup.scheduler.stopped(key)
            return
        self._spawn_task(self.stop_seat(seat, event, reason, request_id), f"stop-{key}")

    def dispatch(self, waiter: Waiter, key: str) -> None:
        fut = self.sup.futures.pop(waiter, None)
        if fut is not None and not fut.done():
            fut.set_result(key)
            self.handed += waiter.hold
        elif waiter.hold:  # it left in the same instant: give the slot back
            asyncio.get_running_loop().call_soon(self.sup.scheduler.finished, key)

    def reject(self, waiter: Waiter, error: SupervisorError) -> None:
        refused = error if isinstance(error, Refused) else None
        if refused is not None and self.sup.pressure.under:  # it may fit once other programs let go: 503, retry
            relief = self.sup.pressure.last
            error = Busy(f"{refused.plan.reason}; under memory pressure from other programs "
                         f"({relief.reason() if relief else 'free memory below the reserve'}): retry once they let "
                         f"go of it", retry_after=10)
        fut = self.sup.futures.pop(waiter, None)
        if fut is not None and not fut.done():
            fut.set_exception(error)
            fut.exception()  # retrieved here: a waiter that already left must not log "never retrieved"
        if refused is not None:
            plan = refused.plan
            needed = sum(plan.needed_bytes.values()) if plan.needed_bytes else None
            task = self._spawn_task(self.sup.record(Event(
                time=self.sup.clock(), event="refuse", model=waiter.key, engine=self.sup.engine_name(waiter.key),
                reason=plan.reason, request_id=waiter.request_id, predicted_bytes=needed,
                details={"plan": plan.to_json(), "under_pressure": sorted(self.sup.pressure.under)})),
                "record-refuse")
            self.recording.add(task)  # history and metrics readers settle it
            task.add_done_callback(self.recording.discard)

    def wake_at(self, when: float) -> None:
        if self._wake is not None:
            self._wake.cancel()
        loop = asyncio.get_running_loop()
        self._wake = loop.call_later(max(0.0, when - self.sup.clock()), self.sup.scheduler.tick)

    # -- work -----------------------------------------------------------------------------------

    def _spawn_task(self, coro: Any, name: str) -> asyncio.Task:
        task = asyncio.create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        task.add_done_callback(_report_failure)
        return task

    async def _load(self, waiter: Waiter, plan: pl.Plan) -> None:
        """One load; whatever goes wrong in it (a bug included) ends as a failed load, so no request waits for a
        load that will never finish and no process outlives it."""
        try:
            await self._load_seat(waiter, plan)
        except Exception as e:
            log.error("loading %s failed unexpectedly", waiter.key, exc_info=e)
            seat = self.sup.seats.get(waiter.key)
            if seat is not None and seat.state is SeatPhase.STARTING:
                await self._end(seat, SeatPhase.FAILED)
            slot = self.sup.scheduler.slots.get(waiter.key)
            if slot is not None and slot.phase.value == "loading":
                await self.sup.record(Event(
                    time=self.sup.clock(), event="fail", model=waiter.key, engine=self.sup.engine_name(waiter.key),
                    reason=f"{waiter.key}: the load failed inside fitevict: {type(e).__name__}: {e}",
                    request_id=waiter.request_id, details={"error": repr(e)}))
                self.sup.scheduler.load_failed(waiter.key, LoadFailed(
                    f"{waiter.key}: the load failed inside fitevict: {type(e).__name__}: {e}; see the server log"))

    async def _load_seat(self, waiter: Waiter, plan: pl.Plan) -> None:
        sup, key = self.sup, waiter.key
        entry = sup.catalog.resolve(key)
        assert plan.config is not None
        cfg, path = plan.config, sup.path_for(waiter.request)
        if cfg.devices and entry.engine == "llama-server" and not sup.prices.has_dry_run(path, cfg):
            # a GPU placement: its compute buffers come from the engine's own dry run of that placement (cached)
            await sup.prices.dry_run(entry, cfg, path, passthrough_args(entry))
        predicted = sup.prices.footprint(path, cfg)
        engine = sup.engine_for(entry)
        t0 = sup.clock()
        seat: SeatState | None = None
        crash: RepackCrash | None = None
        try:
            for attempt in (1, 2, 3):
                # The port is free when chosen but another process may take it first; the engine then fails to
                # bind at once, before it reads a weight, and one retry on a new port is enough.
                seat = self._new_seat(key, entry, cfg, path, predicted, plan)
                spec = sup.launch_spec(entry, path, cfg, seat.port)
                sup.seats[key] = seat
                await spawn(seat, spec)
                await sup.changed()
                self._spawn_task(asyncio.to_thread(sup.store.seat_upsert, sup.seat_record(seat)), "seat-record")
                try:
                    await wait_ready(seat, clock=sup.clock, health_timeout=sup.config.engine.health_timeout_seconds,
                                     stall_seconds=sup.config.engine.stall_seconds, health_path=spec.health_path)
                    break
                except LoadFailed as e:
                    code = seat.proc.returncode if seat.proc is not None else None
                    res = await self._end(seat, SeatPhase.FAILED)
                    if attempt == 1 and BIND_FAILED in log_tail(seat.log_path, 200):
                        continue
                    sig = retry_without_repack(entry.engine, cfg, code) if crash is None else None
                    if sig is not None:  # once, with no extra CPU buffer types, priced for that configuration
                        crash = RepackCrash(sig, sup.clock() - t0, str(seat.log_path), predicted.total_bytes,
                                            res.freed_bytes, sup.prices.host.label())
                        log.warning("%s: llama-server died by %s with repacking on; loading it again with -nr", key, sig)
                        cfg = cfg.with_(repack=False)
                        sup.prices.no_repack(path)
                        predicted = sup.prices.footprint(path, cfg)
                        continue
                    await self._fail_load(waiter, plan, seat, list(spec.argv), res, e, crash, t0)
                    return
        except asyncio.CancelledError as e:
            # nobody waits for this load any more (every client left), or fitevict is shutting down
            why = e.args[0] if e.args else "load cancelled"
            if seat is not None and seat.state is SeatPhase.STARTING:
                res = await self._end(seat, SeatPhase.STOPPED)
                await sup.record(Event(
                    time=sup.clock(), event="unload", model=key, engine=entry.engine, seconds=res.exit_seconds,
                    reason=("no one waiting: every request for this load left before it finished"
                            if not sup.closed else "fitevict is shutting down: load cancelled"),
                    request_id=waiter.request_id, freed_bytes=res.freed_bytes,
                    details={"cancelled_after_seconds": sup.clock() - t0, "note": str(why), **res.details()}))
            sup.scheduler.stopped(key)
            return
        assert seat is not None
        self.loads.pop(key, None)
        await self._ready(seat, crash, t0)
        held = {HOST: seat.bytes_on(HOST), **{d: seat.bytes_on(d) for d in cfg.devices}}
        recorded = asyncio.get_running_loop().create_future()  # readers that settle wait for the record below
        self.recording.add(recorded)
        recorded.add_done_callback(self.recording.discard)
        try:
            handed = self.handed
            sup.scheduler.loaded(key, bytes=held, bytes_source=seat.source_on(HOST), load_seconds=seat.load_seconds,
                                 config=cfg)  # the waiters get the seat now: what follows is off their path
            if self.handed > handed:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(seat.answered.wait(), FIRST_ANSWER_WAIT_S)
            read_seat(seat, engine, sup.nvml)
            await self._record_load(seat, plan, waiter.request_id, spec.notes)
        finally:
            recorded.set_result(None)


    async def _ready(self, seat: SeatState, crash: RepackCrash | None, t0: float) -> None:
        """A seat that answered its health check: ready, with what it starts with (its saved prompts, its shrink, the
        engine overhead it is counted with) and a watcher for its exit."""
        sup, cfg = self.sup, seat.config
        seat.load_seconds = sup.clock() - t0
        seat.repack_crash = crash
        seat.ready_at = sup.clock()
        seat.state = SeatPhase.READY
        seat.shrunk_from = sup.shrinks.pop((seat.key, cfg.n_ctx), None)
        if seat.engine == "llama-server" and sup.config.policy.prompt_cache:
            seat.kv_candidates = await asyncio.to_thread(sup.kv.matching, seat.signature)
        seat.overhead = host_overhead(seat.predicted, sup.prices.engine_overhead)
        seat.gpu_overhead = {d: n for d, n in sup.prices.engine_overhead.items() if d in cfg.devices}
        seat.watcher = self._spawn_task(self._watch(seat), f"watch-{seat.key}")

    def _new_seat(self, key: str, entry: Any, cfg: Any, path: Path, predicted: Any, plan: pl.Plan) -> SeatState:
        """The record of a seat about to start: a fresh port and log, its price and signature."""
        sup = self.sup
        return SeatState(
            id=uuid.uuid4().hex[:12], key=key, entry=entry, engine=entry.engine, config=cfg, model_path=path,
            port=sup.ports(), log_path=sup.log_dir / f"{key.replace('/', '_')}-{uuid.uuid4().hex[:8]}.log",
            started_at=sup.clock(), predicted=predicted, signature=sup.prices.signature(path, cfg),
            strategy=plan.action, split=plan.split, pinned=entry.pinned,
            predicted_overhead=sup.prices.torch_overhead_for(cfg.loras) if path.is_dir() else None)

    async def _fail_load(self, waiter: Waiter, plan: pl.Plan, seat: SeatState, argv: list[str], res: StopResult,
                         e: LoadFailed, crash: RepackCrash | None, t0: float) -> None:
        """A load that failed for good: recorded with the seat's own account of why (both attempts named after a
        repack-crash retry), and its waiters told."""
        sup, key = self.sup, waiter.key
        details = {"log": str(seat.log_path), "argv": argv, "pid": seat.pid, **res.details()}
        if crash is not None:
            details["repack_crash"] = crash.to_json()
            e = LoadFailed(f"{key}: llama-server died by {crash.signal} with repacking on, and the retry "
                           f"with -nr failed too: {e}")
        why = _engine_failure(sup.engine_for(seat.entry), seat.log_path)
        if why is not None:  # the seat's own account (a transformers walk that found no weights, ...)
            no_weights = seat.proc is not None and seat.proc.returncode == EXIT_NO_WEIGHTS
            verdict = guard_mod.check_walk(None, reason=why) if no_weights else None
            details["guard"] = ({"accepted": False, "check": verdict.check, "reason": verdict.reason}
                                if verdict is not None else None)
            e = LoadFailed(f"{key}: {verdict.reason if verdict is not None else why}")
        await sup.record(Event(
            time=sup.clock(), event="fail", model=key, engine=seat.engine, seconds=sup.clock() - t0,
            strategy=plan.action, reason=str(e), request_id=waiter.request_id,
            predicted_bytes=seat.predicted.total_bytes, freed_bytes=res.freed_bytes, details=details))
        sup.scheduler.load_failed(key, e)

    async def _record_load(self, seat: SeatState, plan: pl.Plan, request_id: str | None, notes: Any) -> None:
        """Learn the overhead, guard the measurement, store it if accepted, record a ``load`` (or ``reject``)."""
        sup = self.sup
        log_text = seat.log_path.read_text(errors="replace")
        walk = _seat_document(sup.engine_for(seat.entry), log_text)
        if walk is not None and seat.host_mem is not None and seat.host_mem.host_bytes is not None:
            # a transformers seat: its own process (Python, torch and their libraries, as the budget counts them:
            # PSS) is what it holds beyond its priced model, cache and activations; the largest seen is kept
            priced = seat.predicted.bytes_on(HOST) - int(seat.predicted_overhead or 0)
            await sup.learn_torch_overhead(seat.host_mem.host_bytes - priced, adapters=bool(seat.config.loras))
        else:
            grown = grown_overhead(sup.prices.engine_overhead, overhead_seen(seat, sup.prices.engine_overhead))
            if grown:
                await sup.learn_overhead(grown)
        measured_total = seat.measured.total_bytes if seat.measured else None
        previous = await asyncio.to_thread(sup.store.last_measurement, seat.signature)
        verdict = guard_mod.check_walk(walk["walk"].get("weight_bytes")) if walk is not None else None
        if verdict is None or verdict.accepted:
            # the 1 MiB floor is llama.cpp's (its buffers alone exceed it); a walk that found weights is the proof
            # of a load for a transformers seat, so only the ratio against the same signature applies there
            floor = 0 if walk is not None else guard_mod.IMPLAUSIBLE_FLOOR_BYTES
            verdict = guard_mod.check_measurement(measured_total, file_bytes=_file_bytes(seat.model_path),
                                                  previous=previous.total_bytes if previous else None,
                                                  floor_bytes=floor)
        details: dict[str, Any] = {
            "port": seat.port, "pid": seat.pid, "log": str(seat.log_path), "config": seat.config.to_json(),
            "predicted": seat.predicted.to_json(),
            "measured": seat.measured.to_json() if seat.measured else seat.measured_note,
            "host_pss": mem_json(seat.host_mem),
            "guard": {"accepted": verdict.accepted, "check": verdict.check, "reason": verdict.reason},
            "notes": list(notes), "compute_source": sup.prices.compute_source(seat.model_path, seat.config),
            "previous_measured_bytes": previous.total_bytes if previous else None,
            "load_report": seat_load_report(sup, seat, plan).to_json(),
        }
        if seat.repack_crash is not None:  # kept with the file and machine: the next load starts with -nr
            st = seat.model_path.stat()
            details["repack_crash"] = {**seat.repack_crash.to_json(), "machine": sup.prices.machine,
                                       "file": {"path": str(seat.model_path), "size": st.st_size,
                                                "mtime_ns": st.st_mtime_ns}}
        if measured_total:
            details["prediction_error"] = (seat.predicted.total_bytes - measured_total) / measured_total
        learnable = walk is None and seat.entry.mmproj is None and seat.measured is not None
        if learnable:  # the file this load measured: its error corrects the same file's price at other settings
            st = seat.model_path.stat()
            details["file"] = {"path": str(seat.model_path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        if verdict.accepted and seat.measured is not None:
            await asyncio.to_thread(sup.store.put_measurement, Measurement(
                signature=seat.signature, model=seat.key, engine=seat.engine, measured_at=sup.clock(),
                footprint=seat.measured.to_json(),
                host_committed_bytes=seat.host_mem.committed_bytes if seat.host_mem else None,
                host_mapped_bytes=seat.host_mem.mapped_bytes if seat.host_mem else None, total_bytes=measured_total))
            sup.prices.forget()  # a new measurement overrides the priced figure for its signature
            if learnable:
                sup.prices.learn(seat.model_path, seat.config, seat.measured)
        gpu = sup.gpu_figure(seat)
        reason = plan.reason or None
        if seat.repack_crash is not None:
            reason = "; ".join(r for r in (seat.repack_crash.reason(seat.key), reason) if r)
        if not verdict.accepted:
            reason = (f"loaded, but its measurement was rejected by the {verdict.check} check and not stored: "
                      f"{verdict.reason}")
        await sup.record(Event(  # dated when the seat became ready, not when this record was written
            time=seat.ready_at or sup.clock(), event="load" if verdict.accepted else "reject", model=seat.key,
            engine=seat.engine,
            seconds=seat.load_seconds, vram_bytes=gpu, host_bytes=seat.bytes_on(HOST),
            offloaded_bytes=sup.spilled(seat), strategy=_strategy(plan), request_id=request_id, reason=reason,
            predicted_bytes=seat.predicted.total_bytes, measured_bytes=measured_total, details=details))

    async def _end(self, seat: SeatState, final: SeatPhase, *, free_slot: bool = False) -> StopResult:
        """Stop ``seat``'s process group, verify the release, and forget the seat. ``free_slot``: if verifying the
        release takes longer than ``VERIFY_HOLD_S`` after the processes exited (another program growing at the same
        moment can hide it until the timeout), tell the scheduler the seat is gone then, so that the next placement
        does not wait for it (``Supervisor.stopped`` then leaves the scheduler alone)."""
        sup = self.sup
        seat.expected_exit = True
        seat.state = SeatPhase.STOPPING
        hold: list[asyncio.TimerHandle] = []

        def free() -> None:
            if not seat.slot_freed:
                seat.slot_freed = True
                sup.scheduler.stopped(seat.key)

        def exited() -> None:
            if sup.seats.get(seat.key) is seat:
                sup.seats.pop(seat.key)
            if free_slot:
                hold.append(asyncio.get_running_loop().call_later(VERIFY_HOLD_S, free))
            self._spawn_task(sup.changed(), "seat-exited")

        res = await stop_and_verify(seat.key, seat.pgid, seat.config.devices, proc=seat.proc,
                                    grace=sup.config.engine.stop_grace_seconds,
                                    release_timeout=sup.config.engine.release_timeout_seconds, nvml=sup.nvml,
                                    clock=sup.clock, gpu_held=seat.gpu_bytes, on_exit=exited)
        for h in hold:
            h.cancel()
        seat.state = final
        if sup.seats.get(seat.key) is seat:
            sup.seats.pop(seat.key)
        await asyncio.to_thread(sup.store.seat_remove, seat.id)
        return res

    async def stop_seat(self, seat: SeatState, event: str, reason: str, request_id: str | None) -> StopResult:
        sup = self.sup
        kept = await keep_before_stop(self.sup, seat, event)
        res = await self._end(seat, SeatPhase.STOPPED, free_slot=True)
        engine = sup.engine_for(seat.entry)
        report = engine.teardown(seat.log_path.read_text(errors="replace")) if hasattr(engine, "teardown") else None
        await sup.record(Event(
            time=sup.clock(), event=event, model=seat.key, engine=seat.engine, seconds=res.exit_seconds,
            host_bytes=seat.bytes_on(HOST), vram_bytes=sup.gpu_figure(seat), reason=reason,
            freed_bytes=res.freed_bytes, request_id=request_id,
            details={"pid": seat.pid, **_timings(seat),
                     "host_source": f"{seat.source_on(HOST)}: what the seat held when it stopped",
                     "vram_source": (f"{seat.source_on(seat.config.devices[0])}: what the seat held on its GPUs"
                                     if seat.config.devices else None), **res.details(),
                     **({"leak_check": leak_check(report, res)} if hasattr(engine, "teardown") else {}), **kept}))
        await self._record_teardown(seat, report, request_id)
        sup.stopped(seat.key, res, slot_freed=seat.slot_freed)
        return res

    async def _record_teardown(self, seat: SeatState, report: dict | None, request_id: str | None) -> None:
        """A transformers seat's leak breaker reports on its way out: every tensor still alive after its model was
        deleted is named as this model's leak (memory glibc kept, with every tensor gone, is retention, not a leak)."""
        if not report or not report.get("leaks"):
            return
        leaks = report["leaks"]
        held = sum(int(x.get("bytes") or 0) for x in leaks)
        names = ", ".join(f"{x.get('path')} ({x.get('bytes')} B)" for x in leaks[:8])
        await self.sup.record(Event(
            time=self.sup.clock(), event="leak", model=seat.key, engine=seat.engine, host_bytes=held,
            reason=f"{len(leaks)} tensor(s) still alive after the model was deleted: {names}",
            request_id=request_id, details={"teardown": report, "host_source": "measured: the leak breaker's weakrefs"}))

    async def _watch(self, seat: SeatState) -> None:
        assert seat.proc is not None
        rc = await seat.proc.wait()
        if seat.expected_exit or seat.state is not SeatPhase.READY:
            return
        sup = self.sup
        res = await self._end(seat, SeatPhase.FAILED)
        await sup.record(Event(
            time=sup.clock(), event="crash", model=seat.key, engine=seat.engine, freed_bytes=res.freed_bytes,
            reason=f"{seat.engine} exited unexpectedly with code {rc}; the next request reloads it",
            details={"exit_code": rc, "pid": seat.pid, "log": str(seat.log_path), **_timings(seat),
                     "log_tail": log_tail(seat.log_path, 10), **res.details()}))
        sup.stopped(seat.key, res)

    def watch_adopted(self, seat: SeatState) -> None:
        """An adopted seat is not our child: its exit is seen through a pidfd."""
        async def watch() -> None:
            from fitevict.engines.process import wait_pid_gone

            assert seat.pid is not None
            await wait_pid_gone(seat.pid, None)
            if seat.expected_exit or seat.state is not SeatPhase.READY:
                return
            res = await self._end(seat, SeatPhase.FAILED)
            await self.sup.record(Event(
                time=self.sup.clock(), event="crash", model=seat.key, engine=seat.engine, freed_bytes=res.freed_bytes,
                reason="adopted seat exited unexpectedly (not a child of this fitevict: exit code unknown)",
                details={"pid": seat.pid, **_timings(seat), **res.details()}))
            self.sup.stopped(seat.key, res)

        seat.watcher = self._spawn_task(watch(), f"watch-{seat.key}")


def leak_check(report: dict | None, res: StopResult) -> str:
    """What a transformers seat's leak breaker said on its way out: "clean", how many tensors it found alive, or
    that it did not run and why (a missing report is never "no leak")."""
    if report is None:
        return (f"did not run: the seat wrote no teardown report before it exited ({res.note}; exit after "
                f"{res.exit_seconds:.2f} s: killed after the grace period, or its teardown failed; see its log)")
    leaks = report.get("leaks") or []
    return f"{len(leaks)} tensor(s) still alive after the model was deleted" if leaks else "clean"


def _timings(seat: SeatState) -> dict:
    """The engine's own timings over the seat's answers, for the event that ends it (nothing if none had any)."""
    t = seat.timings.to_json()
    return {"engine_timings": t} if t is not None else {}


def _report_failure(task: asyncio.Task) -> None:
    """No swallowed exceptions: a supervisor task that failed says so in the server log, with its traceback."""
    if not task.cancelled() and task.exception() is not None:
        log.error("supervisor task %s failed", task.get_name(), exc_info=task.exception())


def _seat_document(engine: Any, log_text: str) -> dict | None:
    """A transformers seat's footprint document (its object walk and process baseline), from its log."""
    document = getattr(engine, "document", None)
    return document(log_text) if document is not None else None


def _engine_failure(engine: Any, log_path: Path) -> str | None:
    failure = getattr(engine, "failure", None)
    if failure is None:
        return None
    try:
        return failure(log_path.read_text(errors="replace"))
    except OSError:
        return None


def _file_bytes(path: Path) -> int | None:
    """The model's bytes on disk, or None when they cannot be read (the guard then says its file check could not
    run; never a 0 that turns the check off)."""
    try:
        return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    except OSError:
        return None


def _strategy(plan: pl.Plan) -> str:
    c = plan.config
    base = {"load": "full", "partial": "partial", "ram": "ram-only"}.get(plan.action, plan.action)
    if c is None:
        return base
    return f"{base} (ngl={c.n_gpu_layers}, n_cpu_moe={c.n_cpu_moe}, ctx={c.n_ctx})"
