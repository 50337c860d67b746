"""The supervisor: the front door's one entry point to seats.

It joins the pure scheduler (``fitevict.schedule``: who runs next, what to start and stop) to the real world
(``effects.LiveEffects``: engine processes, measurement, release verification, the store). It builds the parts
those work with (``ports.Ports``: history, processes, planning, the desk, the seat table, ...) and hands them the
parts, never itself. Requests
come in through ``acquire`` (hold a seat for the length of a request) and ``load``/``unload`` (admin).
One event loop owns everything here; the scheduler is called synchronously from it.
"""

from __future__ import annotations

import asyncio
import logging
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from fitevict.phase import mark
from fitevict import planner as pl
from fitevict.engines import build_pricer, traits
from fitevict.config import Config
from fitevict.engines.base import Engine, LaunchSpec
from fitevict.engines.process import free_port
from fitevict.budget import Budget
from fitevict.host.budget import budget_from_config
from fitevict.host.devmem import DeviceMeters
from fitevict.pricing.gguf import PricingError
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.request.catalog import Catalog, CatalogEntry
from fitevict.request.ask import Ask, ask, passthrough_args
from fitevict.request.contract import Contract, seat_key
from fitevict.supervisor.loadreport import deferred_report, hit_report
from fitevict.store import Store
from fitevict.store.records import Event
from fitevict.supervisor.bounded import STEP_SECONDS, bounded
from fitevict.supervisor.desk import Desk
from fitevict.supervisor.effects import LiveEffects
from fitevict.supervisor.history import History
from fitevict.shrink import Need
from fitevict.schedule.errors import Busy, ModelUnreadable, Refused, SupervisorError
from fitevict.schedule.estimate import running
from fitevict.schedule.fair import Share
from fitevict.supervisor.kvkeep import PromptKeep
from fitevict.supervisor.pressure_watch import PressureWatch, holdings
from fitevict.supervisor.orphans import cleanup_orphans
from fitevict.supervisor.planning import Planning
from fitevict.supervisor.ports import Ports
from fitevict.seat.processes import Processes
from fitevict.supervisor.outgrowth import check_outgrowth, recycle
from fitevict.supervisor.pressure_relief import check_pressure
from fitevict.supervisor.shrink import resident_shrunk, shrunk_waiter
from fitevict.supervisor.views import queued_views, resident_views
from fitevict.prices.learned import plan_policy, prime_price_book
from fitevict.prices.book import PriceBook
from fitevict.prices.sheet import PriceSheet
from fitevict.seat.release import StopResult
from fitevict.schedule.scheduler import SchedPolicy, Scheduler, Waiter
from fitevict.schedule.seats import SERVING, SeatTable
from fitevict.seat.running import SeatState

log = logging.getLogger("fitevict.supervisor")

@dataclass(frozen=True, slots=True)
class ShutdownSummary:
    answered: int  # queued or loading requests answered 503 "shutting down"
    cut: int  # requests still in flight when the grace period ended
    stopped: int  # seats whose stop ran to its end
    seconds: float
    verified: int = 0  # of those, releases verified
    unverified: tuple[str, ...] = ()  # "<model>: <why>" for each stop whose release was not verified
    failed: tuple[str, ...] = ()  # "<model>: <error>" for each stop that raised

    def line(self) -> str:
        text = (f"fitevict stopped in {self.seconds:.2f} s: {self.answered} waiting request(s) answered 503 "
                f"(shutting down), {self.cut} in-flight request(s) cut after the grace period, "
                f"{self.stopped} seat(s) stopped, {self.verified} release(s) verified, "
                f"{len(self.unverified)} not verified, {len(self.failed)} failed")
        details = [*(f"not verified: {u}" for u in self.unverified), *(f"failed: {f}" for f in self.failed)]
        return text + "".join(f"\n  {d}" for d in details)


def _outcome(stop: asyncio.Future, limit: float) -> Any:
    """A shutdown stop's result, the error it raised, or why it has none."""
    if not stop.done():
        return TimeoutError(f"its stop did not end within {limit:.0f} s")
    if stop.cancelled():
        return asyncio.CancelledError("its stop was cancelled")
    return stop.exception() or stop.result()


def _summary(answered: int, cut: int, seconds: float, keys: list[str], results: list[Any]) -> ShutdownSummary:
    """The shutdown as it went: each stop's result or the error it raised (logged once, with its traceback)."""
    failed: list[str] = []
    unverified: list[str] = []
    verified = 0
    for key, r in zip(keys, results):
        if isinstance(r, BaseException):
            log.error("stopping %s at shutdown failed", key, exc_info=r)
            failed.append(f"{key}: {type(r).__name__}: {r}")
        elif r.verified:
            verified += 1
        else:
            unverified.append(f"{key}: {r.note}")
    return ShutdownSummary(answered, cut, len(keys) - len(failed), seconds, verified, tuple(unverified), tuple(failed))


def sched_policy(config: Config) -> SchedPolicy:
    p = config.policy
    return SchedPolicy(max_turn_seconds=p.max_turn_seconds, max_wait_seconds=p.max_wait_seconds,
                       min_residency_seconds=p.min_residency_seconds, queue_timeout_seconds=p.queue_timeout_seconds,
                       max_queue=p.max_queue, engine_queue_depth=p.engine_queue_depth,
                       eviction=p.eviction)  # type: ignore[arg-type]


class Supervisor:
    def __init__(
        self,
        *,
        config: Config,
        catalog: Catalog,
        store: Store,
        engine_binary: Path,
        budget_fn: Callable[[], Budget] | None = None,
        nvml: Any = None,
        clock: Callable[[], float] = time.time,
        ports: Callable[[], int] = free_port,
    ) -> None:
        """``ports``: where a new seat's port comes from (the OS by default); ``nvml``: None for the real pynvml
        (when a driver exists), tests pass a fake at this edge; ``clock``: the one clock."""
        self.config, self.catalog, self.store, self.clock, self.nvml = config, catalog, store, clock, nvml
        self.meters = DeviceMeters(nvml)  # every device by its kind, once the engine's census is taken (``start``)
        self.engine_binary = Path(engine_binary)
        self.prices = PriceBook(store, self.engine_binary.parent, config.policy.default_alloc_mode)
        self.table = SeatTable()  # every seat's one record and state; the scheduler changes it
        self.seats: Mapping[str, SeatState] = self.table.running()  # the seats whose process runs, by key
        self.kv = PromptKeep(Path(config.data_dir) / "kv", min_tokens=config.policy.prompt_cache_min_tokens,
                             disk_budget=config.policy.prompt_cache_disk)
        self.pressure = PressureWatch(config)
        self.history = History(store)
        self.processes = Processes(config, catalog, self.engine_binary, ports, self.kv)
        self.planning = Planning(config, self.prices, self.pressure, budget_fn or self._measure_budget)
        self.desk = Desk()
        self.parts = Ports(clock=clock, config=config, catalog=catalog, store=store, prices=self.prices,
                           table=self.table, seats=self.seats, history=self.history, processes=self.processes, planning=self.planning,
                           desk=self.desk, kv=self.kv, pressure=self.pressure, nvml=nvml,
                           meters=self.meters)
        self.fx = LiveEffects(self.parts)
        self.scheduler = Scheduler(self.fx, sched_policy(config), idle_unload_seconds=config.policy.idle_unload_seconds,
                                   table=self.table, planning=plan_policy(config))
        self.fx.bind(self.scheduler)
        self.log_dir = self.processes.log_dir
        self.summary: ShutdownSummary | None = None
        self._shutdown: asyncio.Future | None = None
        self._hurry = asyncio.Event()
        self.prices_ahead: dict[str, int] = {"done": 0, "models": 0}  # read_prices_ahead's progress
        self._ahead: set[asyncio.Task] = set()

    @property
    def engine_overhead(self) -> dict[str, int]:
        return self.prices.engine_overhead

    @property
    def closed(self) -> bool:
        return self.desk.closed

    @property
    def on_event(self) -> list[Callable[[Event], None]]:
        """Called with each event once it is recorded."""
        return self.history.on_event

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> list[Event]:
        """Load what was learned about the engine, and deal with the seats and saved prompts a previous run left."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self.kv.sweep)  # a save cut short leaves no partial file (kvkeep)
        loop = asyncio.get_running_loop()  # a store renewed while running gets the live seats' records again
        self.store.renewed.append(lambda: loop.call_soon_threadsafe(self.fx.records.again, self.seats.values()))
        await asyncio.to_thread(prime_price_book, self.prices, self.store, self.engine_binary, calibrate=True)
        events = await cleanup_orphans(self.parts, self.fx.install)
        await asyncio.to_thread(self.take_census)  # after the orphans: the rpc-servers' baselines with no seat
        return events

    def take_census(self) -> None:
        """Ask the engine build which devices seats may use (with ``devices.rpc``), and read them from now on."""
        census = build_pricer().census(self.engine_binary, rpc=self.config.devices.rpc,
                                       declared=self.config.devices.uma)
        if census.reason:
            log.warning("the engine's devices: %s; seats use the host and NVML's GPUs", census.reason)
        self.meters.use(census)

    async def shutdown(self, grace: float | None = None) -> ShutdownSummary:
        """Take no new work; answer every waiting request 503; let requests in flight finish within ``grace``
        (``policy.shutdown_grace_seconds``), then cut them; stop every seat with its release verified.
        Every caller awaits the same shutdown; ``hurry`` ends the wait for requests in flight."""
        if self._shutdown is None:
            self._shutdown = asyncio.ensure_future(self._shutdown_now(grace))
        return await asyncio.shield(self._shutdown)

    def hurry(self) -> None:
        """A second signal: stop waiting for requests in flight (the seats are still stopped and verified)."""
        self._hurry.set()

    async def _shutdown_now(self, grace: float | None) -> ShutdownSummary:
        t0 = self.clock()
        grace = self.config.policy.shutdown_grace_seconds if grace is None else grace
        self.desk.closed = True
        for task in self._ahead:
            task.cancel()
        answered = len(self.scheduler.close("shutting down"))
        stop_limit = self.config.engine.stop_grace_seconds + STEP_SECONDS  # a stop's TERM, KILL and release check
        await bounded("the dry runs under way", self.prices.dry_runs_ended(), STEP_SECONDS)  # no engine left behind

        def idle() -> bool:
            return all(s.in_flight == 0 for s in self.scheduler.seats.values())

        async def drained() -> None:
            with contextlib.suppress(TimeoutError):
                await self.history.wait_until(idle, grace + 1.0)

        waits = [asyncio.ensure_future(drained()), asyncio.ensure_future(self._hurry.wait())]
        await asyncio.wait(waits, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
        for t in waits:
            t.cancel()
        cut = sum(s.in_flight for s in self.scheduler.seats.values())
        for task in list(self.fx.loader.loads.values()):
            task.cancel("fitevict is shutting down")
        under_way = dict(self.fx.stopper.under_way)  # stops begun before (an eviction, say): waited for, counted
        seats = [s for s in list(self.seats.values()) if s.state in SERVING and s.key not in under_way]
        stops = [asyncio.ensure_future(t) for t in under_way.values()] + [
            asyncio.ensure_future(self.fx.stopper.stop(s, "unload", "fitevict shutting down", None)) for s in seats]
        await bounded("stopping the seats", asyncio.wait(stops), stop_limit, stops) if stops else None
        results = [_outcome(t, stop_limit) for t in stops]
        while self.parts.tasks:  # records and stops that those started: all written before the store closes
            pending = list(self.parts.tasks)
            if not await bounded("the records and stops under way", asyncio.wait(pending), STEP_SECONDS, pending):
                break
        self.summary = _summary(answered, cut, self.clock() - t0, [*under_way, *(s.key for s in seats)], results)
        self.history.abandon()  # events the store never took are lost now: the log says which
        return self.summary

    def _measure_budget(self) -> Budget:
        """The machine now, with what fitevict's own seats hold counted as theirs, not someone else's."""
        return budget_from_config(self.config.budget, nvml=self.nvml, held=holdings(self.seats)[0],
                                  census=self.meters.census)

    # -- events ---------------------------------------------------------------------------------

    async def record(self, ev: Event) -> Event:
        return await self.history.record(ev)

    @property
    def recent_events(self) -> tuple[Event, ...]:
        """The events this supervisor recorded, the last 1,000 at most, oldest first."""
        return self.history.recent

    async def settle(self, timeout: float = 30.0) -> None:
        """Wait for load records still being written (they are written just after the first request got its seat),
        so that a history read sees every load that has served a request."""
        pending = list(self.fx.recording)
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    async def wait_for_event(self, predicate: Callable[[Event], bool], timeout: float) -> Event:
        """Await the first event (already recorded by this supervisor, or future) matching ``predicate``."""
        return await self.history.wait_for_event(predicate, timeout)

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> None:
        """Await a condition on the supervisor's state (seats, queue), re-checked at every change."""
        await self.history.wait_until(predicate, timeout)

    async def check_pressure(self, live: dict[str, int | None]) -> Any:
        """One reading of the seats' committed bytes (the memory sampler's): memory pressure from other programs is
        acted on (``pressure_relief``). Returns the relief decided, or None."""
        return await check_pressure(self.parts, live)

    def remeasured(self) -> None:
        """After the memory sampler's reading (and ``check_pressure``): what waits for memory is planned again."""
        self.scheduler.remeasured()

    async def check_outgrowth(self, now: float) -> list[Event]:
        """After the memory sampler's reading of every seat: the seats that now outgrow their price are marked, one
        ``outgrew`` event each (``outgrowth``), and with ``policy.recycle_outgrown`` drained and loaded again.
        Returns the events recorded."""
        events = await check_outgrowth(self.parts, now)
        if self.config.policy.recycle_outgrown:
            for ev in events:
                self.parts.spawn(recycle(self.parts, ev, self.load), f"fitevict-recycle-{ev.model}")
        return events

    # -- pricing and planning -------------------------------------------------------------------

    def engine_for(self, entry: CatalogEntry) -> Engine:
        return self.processes.engine_for(entry)

    def launch_spec(self, entry: CatalogEntry, path: Path, cfg: LoadConfig, port: int) -> LaunchSpec:
        """The argv and environment that start ``entry`` under ``cfg`` (the engine's one builder)."""
        return self.processes.launch_spec(entry, path, cfg, port)

    def path_for(self, request: pl.PlanRequest) -> Path:
        return self.planning.path_for(request)

    def ask(self, key: str, contract: Contract | None = None) -> Ask:
        """What a request for model ``key`` under ``contract`` asks of a seat (``request.ask``; the front door builds
        its own from the entry it resolved)."""
        return ask(self.catalog.resolve(key), contract, self.prices)

    async def _read_price(self, entry: CatalogEntry, request: pl.PlanRequest, *, resident: bool) -> PriceSheet:
        """The price sheet of ``request``, current, read off the event loop: the engine's dry run for the compute
        buffer first (once per file and configuration, cached on disk) unless the seat already runs. The sheet is
        the request's quote: immutable, one version of the price book."""
        path = self.path_for(request)
        self.prices.note_flags(entry, path)  # a transformers seat's own flags set what it costs
        if traits(entry.engine).dry_run and not resident:
            await self.prices.dry_run(entry, request.config, path, passthrough_args(entry))
        return await self.prices.sheet(path, request.config)

    async def read_price(self, key: str, contract: Contract | None = None) -> None:
        """Read ``key``'s price now, off the event loop, so that a plan or a first request for it reads nothing."""
        asked = self.ask(key, contract)
        await self._read_price(asked.entry, asked.request, resident=seat_key(asked.entry) in self.seats)

    async def read_prices_ahead(self, keys: Iterable[str]) -> None:
        """Each model's price read ahead at its default configuration, one at a time and never beside a load (its
        dry run would take the engine's cores: ``Loader.quiet``), so that a first request waits for none of it. A
        model that cannot be priced is left to its first request, which reports why."""
        self.prices_ahead["models"] += len(todo := list(keys))
        for key in todo:
            await self.fx.loader.quiet()
            if self.closed:
                return
            try:
                await self.read_price(key)
            except (OSError, PricingError, SupervisorError, ValueError) as e:
                log.info("price of %s not read ahead: %s: %s", key, type(e).__name__, e)
            self.prices_ahead["done"] += 1

    def read_ahead(self, keys: Iterable[str]) -> None:
        """``read_prices_ahead`` in a task of its own (cancelled at shutdown)."""
        task = asyncio.get_running_loop().create_task(self.read_prices_ahead(list(keys)), name="fitevict-read-ahead")
        self._ahead.add(task)
        task.add_done_callback(self._ahead.discard)

    async def plan_read(self, key: str, contract: Contract | None = None, *, now: float | None = None) -> pl.Plan:
        """``plan`` with the model's price read first, off the event loop (the engine's dry run the first time)."""
        await self.read_price(key, contract)
        return self.plan(key, contract, now=now)

    def plan(self, key: str, contract: Contract | None = None, *, now: float | None = None) -> pl.Plan:
        """A dry run: the Plan a load would follow now. Changes nothing."""
        req = self.ask(key, contract).request
        if contract is not None and contract != Contract():
            req = replace(req, fixed=None)  # a dry run with a contract asks for exactly this configuration
        return self.scheduler.plan(req, now)

    def budget(self) -> Budget:
        """The budget as the planner would see it now (a fresh reading; under memory pressure, with the margin)."""
        return self.planning.budget()

    @property
    def last_budget(self) -> Budget | None:
        """The budget reading the last plan was made against (None before the first plan)."""
        return self.planning.last_budget

    def last_budget_json(self) -> dict | None:
        """The budget snapshot the last plan was made against, with every figure's source."""
        return self.last_budget.to_json() if self.last_budget is not None else None

    # -- the front door's entry points ------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def acquire(self, asked: Ask, *, request_id: str | None = None, timing: dict | None = None,
                      need: Need | None = None, origin: Mapping[str, str] | None = None,
                      share: Share | None = None, max_tokens: int | None = None) -> AsyncIterator[SeatState]:
        """Hold a seat for what ``asked`` asks (loading it if needed) for the block. ``timing`` (if given) gets
        ``queue_s`` and ``load_s``: the wait, split into queueing and waiting for a load of this model.
        ``need``: the tokens the request may need (``fitevict.shrink``); with ``policy.shrink_ctx`` a contract
        whose context does not fit loads at the largest context that does when one slot of it holds them
        (``timing["ctx_shrunk"]`` says so). ``origin``: where the request came from (its route, the name it asked
        by), kept in the history of the load it causes. ``share``: who asks, for fairness (``schedule.fair``); a
        request that waits gets its estimated wait in ``timing["wait_estimate"]`` (``schedule.estimate``), from the
        ``max_tokens`` of those ahead; its seconds on the seat are measured with ``timing["generated_tokens"]``
        (set by the caller) and the requests running meanwhile (``schedule.measured``).

        Cancelling the task while it waits takes the request out of the queue at once; a load that nobody
        waits for any more is cancelled (see ``Scheduler.cancel``)."""
        entry = asked.entry
        if need is not None:  # policy.shrink_ctx: a seat already shrunk for this contract serves it
            asked = resident_shrunk(self.parts, asked, need, timing)
        mark(entry.key, "asked")
        w = Waiter(asked.request, self.clock(), request_id, keep_alive=asked.keep_alive, origin=origin,
                   share=share if share is not None else Share(), max_tokens=max_tokens)
        got = self.scheduler.fast(w)
        hit = got is not None
        if got is None:
            try:
                got = await self._wait(w, entry, timing)
            except Refused as e:
                w = shrunk_waiter(self.parts, e, w, asked, need, timing)
                got = await self._wait(w, entry, timing)
        elif timing is not None:
            timing["queue_s"], timing["load_s"] = 0.0, 0.0
        seat = self.seats[got]
        t_seat: float | None = None
        try:
            if timing is not None:  # what loading cost this request (an adapter is served by its base's seat),
                # built once the request went to the engine (``report_headers``)
                timing["load_report"] = (partial(hit_report, self.parts, entry, seat) if hit else await deferred_report(
                    self.parts, entry, seat, w.arrived, request_id, evicting=self.fx.stopper.evicted_for(request_id)))
            t_seat, busy = self.clock(), running(self.scheduler)
            mark(entry.key, "seat held")
            yield seat
        finally:
            seat.answered.set()
            if t_seat is not None:  # its time on a slot, tokens and concurrency: the wait estimate's inputs
                on_slot = self.scheduler.measured.slot_since(got, w)
                self.scheduler.measured.served(got, self.clock() - (t_seat if on_slot is None else on_slot),
                                               (timing or {}).get("generated_tokens"),
                                               round((busy + running(self.scheduler)) / 2))
            self.scheduler.finished(got, w)
            if self.closed:
                await self.history.changed()

    async def _wait(self, w: Waiter, entry: CatalogEntry, timing: dict | None = None) -> str:
        if self.closed:
            raise Busy(f"{w.key}: fitevict is shutting down; retry later", retry_after=5)
        # its price, read off the event loop before it is queued: the scheduler's plan prices without I/O
        try:  # priced once, here: the quote rides with the request through the plan to the seat's prediction
            w.request = replace(w.request, quote=await self._read_price(entry, w.request, resident=w.key in self.seats))
        except (PricingError, OSError) as e:  # its file changed since the request was read (truncated, gone)
            raise self.unreadable(w.key, e) from None
        fut = asyncio.get_running_loop().create_future()
        self.desk.futures[w] = fut
        t0 = self.clock()
        self.scheduler.submit(w)
        try:
            if timing is not None:  # the wait stated up front, once the plan's own effects (a load it started) have
                await asyncio.sleep(0)  # taken their first step: the estimate reads the seat they placed
                if w in self.scheduler.queue:
                    timing["wait_estimate"] = self.scheduler.estimate(w)
            got = await fut
        except asyncio.CancelledError:
            if not self.scheduler.cancel(w) and fut.done() and not fut.cancelled() and fut.exception() is None:
                self.scheduler.finished(fut.result(), w)  # handed a seat in the same instant it left
            raise
        finally:
            self.desk.futures.pop(w, None)
        if timing is not None:
            total = self.clock() - t0
            seat = self.seats.get(got)
            loaded_at = seat.ready_at if seat is not None and seat.ready_at is not None else t0
            load = max(0.0, min(total, loaded_at - max(t0, seat.started_at if seat else t0)))
            timing["queue_s"], timing["load_s"] = total - load, load
        return got

    async def load(self, key: str, contract: Contract | None = None, *, request_id: str | None = None) -> SeatState:
        """Make ``key`` resident (an admin load): queued like a request, but it holds nothing once ready."""
        asked = self.ask(key, contract)
        w = Waiter(asked.request, self.clock(), request_id, hold=False, keep_alive=asked.keep_alive)
        got = await self._wait(w, asked.entry)
        await self.settle()  # an admin load answers with the seat measured and its load recorded
        return self.seats[got]

    def unreadable(self, key: str, why: object) -> ModelUnreadable:
        """The error for seat ``key``'s model, whose file cannot be read any more; its seat, if one runs, is stopped
        once its requests in flight end: no request for it can be priced, and a seat that maps a file cut short
        dies of SIGBUS at its next read of the lost part."""
        if key in self.seats:
            self.scheduler.unload(key, f"{key}: stopped: its model file cannot be read any more ({why}); no request "
                                       "for it can be priced until the file is replaced")
        return ModelUnreadable(key, why)

    async def unload(self, key: str, *, reason: str = "unloaded on request") -> StopResult | None:
        """Stop ``key`` once its requests in flight finish; returns the verified stop, or None if not resident."""
        target = seat_key(self.catalog.resolve(key))  # an adapter's seat is its base's
        fut = self.desk.stop_future(target)
        if not self.scheduler.unload(target, reason):
            self.desk.forget_stop_future(target, fut)
            return None
        return await fut

    def queue_view(self) -> dict[str, int]:
        """Requests waiting for a seat, per model."""
        out: dict[str, int] = {}
        for w in self.scheduler.queue:
            out[w.key] = out.get(w.key, 0) + 1
        return out

    def queued_views(self) -> list[dict]:
        """Every waiting request with its estimated wait (supervisor.views)."""
        return queued_views(self.parts)

    def resident_views(self) -> list[dict]:
        """Every seat as the API, dashboard and ``ps`` show it (supervisor.views)."""
        return resident_views(self.parts)
