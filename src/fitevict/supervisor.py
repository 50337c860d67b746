"""The supervisor executes Plans: it starts and stops engine processes, measures them, guards
measurements, verifies that memory came back, and records every outcome in the store.

One state machine per seat: starting -> ready -> stopping -> stopped | failed.

Concurrency model (asyncio, one event loop):
- one placement at a time (``_placement``), so load time and memory are attributable to one model;
- a request for a resident, ready model never takes the placement lock (``acquire`` fast path);
- the read of state that gates an eviction (in-flight counts) happens under the placement lock in
  the same synchronous stretch that marks the victims ``stopping``, so a request cannot slip onto a
  seat that is about to be stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from fitevict import guard as guard_mod
from fitevict import planner as pl
from fitevict.catalog import Catalog, CatalogEntry
from fitevict.config import Config
from fitevict.engines import engine_class
from fitevict.engines.process import alive as _alive
from fitevict.engines.process import cmdline as _cmdline
from fitevict.engines.process import die_with_parent, free_port
from fitevict.engines.process import group_alive as _group_alive
from fitevict.engines.dryrun import Unavailable as DryRunUnavailable
from fitevict.engines.dryrun import dry_run
from fitevict.host import procmem
from fitevict.host.budget import Budget, measure_budget
from fitevict.host.nvml import read_gpus
from fitevict.pricing import price as pricing
from fitevict.pricing.footprint import HOST, DeviceFootprint, Footprint, Term
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.kv import resolve_context
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.store import Store
from fitevict.store.records import Event, Measurement, Seat as SeatRecord, measurement_signature
from fitevict.units import MiB, format_size

STATES = ("starting", "ready", "stopping", "stopped", "failed")  # a seat's life, in order
BIND_FAILED = "couldn't bind HTTP server socket"  # llama-server's words when its port was taken


class SupervisorError(RuntimeError):
    """Base for errors the front door maps onto HTTP statuses."""

    status = 500


class LoadFailed(SupervisorError):
    status = 502


class Refused(SupervisorError):
    status = 507  # Insufficient Storage: the model does not fit the budget

    def __init__(self, plan: Any, message: str) -> None:
        super().__init__(message)
        self.plan = plan


class Busy(SupervisorError):
    """The queue for a model is full, or a wait ran past its bound. The client should retry."""

    status = 503

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


# --- process helpers ---------------------------------------------------------------------------


def _log_tail(path: Path, n: int = 25) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(log unavailable: {e})"
    return "\n".join(lines[-n:])


# --- seats -------------------------------------------------------------------------------------


@dataclass
class SeatState:
    """A live seat. Mutable, owned by the supervisor's event loop."""

    id: str
    key: str
    entry: CatalogEntry
    engine: str
    config: LoadConfig
    model_path: Path
    port: int
    log_path: Path
    started_at: float
    predicted: Footprint
    signature: str
    strategy: str
    state: str = "starting"
    proc: asyncio.subprocess.Process | None = None
    pid: int | None = None
    pgid: int | None = None
    ready_at: float | None = None
    load_seconds: float | None = None
    last_used: float | None = None  # None: never used (idle unload leaves it alone)
    in_flight: int = 0
    reserved: int = 0  # queued requests this seat was loaded for, not yet in flight
    overhead: int = 0  # the engine process's own host memory beyond its buffers (measured estimate)
    gpu_overhead: dict[str, int] = field(default_factory=dict)  # the same per GPU (CUDA context), measured
    draining: bool = False  # a placement waits for its requests to finish: new ones queue instead
    measured: Footprint | None = None
    measured_note: str = ""
    host_mem: procmem.ProcessMemory | None = None
    gpu_bytes: dict[str, int] = field(default_factory=dict)
    pinned: bool = False
    expected_exit: bool = False
    watcher: asyncio.Task | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def bytes_on(self, device: str) -> int:
        """What the planner counts for this seat on ``device``: measured where we have it."""
        if device == HOST:
            # The engine's own buffers (from its log) are what the seat grows to as its context fills;
            # PSS is what it touches now plus the process itself. Count the larger: both are measured.
            # The process itself (binary, heap) is the measured engine overhead on top of the buffers.
            pss = self.host_mem.host_bytes if self.host_mem is not None else None
            logged = self.measured.bytes_on(HOST) + self.overhead if self.measured is not None else None
            if pss is None and logged is None:
                return self.predicted.bytes_on(HOST)
            return max(pss or 0, logged or 0)
        if device in self.gpu_bytes:
            return self.gpu_bytes[device]
        if self.measured is not None and self.measured.device(device) is not None:
            return self.measured.bytes_on(device) + self.gpu_overhead.get(device, 0)
        return self.predicted.bytes_on(device)

    def source_on(self, device: str) -> str:
        if device == HOST:
            measured = (self.host_mem is not None and self.host_mem.host_bytes is not None) or self.measured is not None
            return "measured" if measured else _pred_source(self.predicted, HOST)
        if device in self.gpu_bytes or (self.measured is not None and self.measured.device(device)):
            return "measured"
        return "formula"


@dataclass(slots=True)
class _Claim:
    """One queued request's claim on the seat being loaded for it."""

    seat: SeatState | None = None


@dataclass(frozen=True, slots=True)
class StopResult:
    key: str
    freed_bytes: int | None
    exit_seconds: float
    release_seconds: float | None
    verified: bool
    note: str


@dataclass(frozen=True, slots=True)
class Contract:
    """A per-request load contract (the ``fitevict`` object of a request body), already validated."""

    ctx: int | None = None
    kv_cache_type: str | None = None
    flash_attn: bool | None = None
    alloc_mode: str | None = None
    gguf_file: str | None = None
    n_gpu_layers: int | None = None
    n_cpu_moe: int | None = None
    parallel: int | None = None


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
        self.config = config
        self.catalog = catalog
        self.store = store
        self.engine_binary = Path(engine_binary)
        self._engine = engine_class("llama-server")(self.engine_binary)
        self.clock = clock
        self._ports = ports  # where a new seat's port comes from (the OS by default)
        self._nvml = nvml  # None: the real pynvml (when a driver exists); tests pass a fake at this edge
        self._budget_fn = budget_fn or self._measure_budget
        self.seats: dict[str, SeatState] = {}
        self._placement = asyncio.Lock()
        self._loading: dict[str, asyncio.Future] = {}
        self._waiting: dict[str, int] = {}
        self._claims: dict[str, list[_Claim]] = {}
        self._changed = asyncio.Condition()
        self._events: list[Event] = []
        self._idle_task: asyncio.Task | None = None
        self._footprints: dict[tuple, Footprint] = {}
        self._last_budget: Budget | None = None
        # bytes a seat's process holds beyond its buffers, per device (measured, see _learn_overhead)
        self.engine_overhead: dict[str, int] = {}
        st = self.engine_binary.stat() if self.engine_binary.exists() else None
        self._overhead_key = f"engine-overhead:{self.engine_binary}:{st.st_size if st else 0}:{st.st_mtime_ns if st else 0}"
        self._quant: dict[tuple[str, int, int], str] = {}
        self._compute: dict[tuple[str, LoadConfig], dict[str, int]] = {}
        self._dry_run_notes: dict[tuple[str, LoadConfig], str] = {}
        self._dry_context: dict[tuple[str, LoadConfig], Any] = {}  # caches the dry run sized (unknown archs)
        self.log_dir = Path(config.data_dir) / "seats"
        self.closed = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> list[Event]:
        """Clean up orphans a previous run left, then start the idle-unload watch."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        known = await asyncio.to_thread(self.store.compute_get, self._overhead_key)
        if known:
            self.engine_overhead = {k: int(v) for k, v in known.items()}
        orphans = await self._cleanup_orphans()
        self._idle_task = asyncio.create_task(self._idle_loop(), name="fitevict-idle-unload")
        return orphans

    async def shutdown(self) -> None:
        """Stop every seat (used on SIGTERM / lifespan shutdown)."""
        self.closed = True
        if self._idle_task:
            self._idle_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._idle_task
        async with self._placement:
            for seat in list(self.seats.values()):
                await self._stop_seat(seat, event="unload", reason="fitevict shutting down")

    def _measure_budget(self) -> Budget:
        """The machine now, with what fitevict's own seats hold counted as theirs, not someone else's."""
        b = self.config.budget
        held: dict[str, int] = {}
        for s in self.seats.values():
            if s.host_mem is not None and s.host_mem.committed_bytes is not None:
                held[HOST] = held.get(HOST, 0) + s.host_mem.committed_bytes
            for dev, n in s.gpu_bytes.items():
                held[dev] = held.get(dev, 0) + n
        return measure_budget(ram_limit=b.ram_limit, gpu_limit=b.gpu_limit, ram_reserve=b.ram_reserve,
                              gpu_reserve=b.gpu_reserve, nvml=self._nvml, held=held)

    # -- events ---------------------------------------------------------------------------------

    async def record(self, ev: Event) -> Event:
        ev = replace(ev, id=await asyncio.to_thread(self.store.record_event, ev))
        self._events.append(ev)
        del self._events[:-1000]
        async with self._changed:
            self._changed.notify_all()
        return ev

    async def wait_for_event(self, predicate: Callable[[Event], bool], timeout: float) -> Event:
        """Await the first event (already recorded by this supervisor, or future) matching ``predicate``."""
        async def _wait() -> Event:
            async with self._changed:
                while True:
                    for ev in self._events:
                        if predicate(ev):
                            return ev
                    await self._changed.wait()
        return await asyncio.wait_for(_wait(), timeout)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- configuration ---------------------------------------------------------------------------

    def config_for(self, entry: CatalogEntry, contract: Contract | None) -> tuple[LoadConfig, str, Path]:
        cfg, mode, path = load_config_for(entry, contract, self.config.policy.default_alloc_mode)
        if cfg.n_ctx == 0:
            # Seats start with --fit off, under which "-c 0" means something other than under the
            # engine's default --fit on; start them with the explicit context the price was made for.
            cfg = cfg.with_(n_ctx=resolve_context(self._structure(path), cfg).n_ctx)
        return cfg, mode, path

    def signature(self, path: Path, cfg: LoadConfig) -> str:
        st = path.stat()
        quant = self._quant.get((str(path), st.st_size, st.st_mtime_ns))
        if quant is None:
            quant = self._quant[(str(path), st.st_size, st.st_mtime_ns)] = _dominant_type(self._structure(path))
        return measurement_signature(path=str(path.resolve()), size=st.st_size, mtime_ns=st.st_mtime_ns,
                                     quantization=quant, config=cfg.to_json())

    def _structure(self, path: Path):
        return load_structure(path)

    def footprint(self, path: Path, cfg: LoadConfig) -> Footprint:
        """Measured footprint for this signature if one was accepted, else the priced one.

        Both are cached in memory by (file identity, configuration): the planner prices many
        candidate configurations per plan, and a stored measurement changes only when a load records one.
        """
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns, cfg)
        hit = self._footprints.get(key)
        if hit is not None:
            return hit
        sig = self.signature(path, cfg)
        m = self.store.last_measurement(sig)
        if m is not None:
            fp = footprint_from_json(m.footprint)
        else:
            fp = pricing.price(self._structure(path), cfg, compute=self._compute_cache(path, cfg),
                               context=self._dry_context.get((str(path), cfg))).footprint
        fp = with_engine_overhead(fp, self.engine_overhead)
        if len(self._footprints) > 4096:
            self._footprints.clear()
        self._footprints[key] = fp
        return fp

    def _compute_cache(self, path: Path, cfg: LoadConfig) -> dict[str, int] | None:
        return self._compute.get((str(path), cfg))

    async def _dry_run(self, entry: CatalogEntry, contract: Contract | None) -> None:
        """Price the compute buffer of the configuration a load starts from with the engine's own dry run.

        Runs once per file and configuration (cached on disk by ``dry_run_compute``); a dry run that
        gives no figure leaves the labelled formula in place and says why in the load event.
        """
        cfg, _mode, path = self.config_for(entry, contract)
        if (str(path), cfg) in self._compute:
            return
        got = await asyncio.to_thread(dry_run, self.engine_binary.parent, path, cfg,
                                      extra_args=tuple(entry.settings.extra_args))
        if isinstance(got, DryRunUnavailable):
            self._dry_run_notes[(str(path), cfg)] = got.reason
        else:
            self._compute[(str(path), cfg)] = got.compute
            if got.context is not None:
                self._dry_context[(str(path), cfg)] = got.context
            self._footprints.clear()

    # -- planning -------------------------------------------------------------------------------

    def _residents(self) -> list[pl.Resident]:
        out = []
        for s in self.seats.values():
            if s.state not in ("starting", "ready"):
                continue
            devices = {HOST: s.bytes_on(HOST), **{d: s.bytes_on(d) for d in s.config.devices}}
            out.append(pl.Resident(
                key=s.key, config=s.config, bytes=devices,
                last_used=s.last_used if s.last_used is not None else s.ready_at or s.started_at,
                bytes_source=s.source_on(HOST), pinned=s.pinned, protected=False, in_flight=s.in_flight + s.reserved,
                loading=s.state == "starting",
            ))
        return out

    def plan(self, key: str, contract: Contract | None = None, *, now: float | None = None) -> pl.Plan:
        """A dry run: the Plan a load would follow now. Changes nothing."""
        entry = self.catalog.resolve(key)
        cfg, mode, path = self.config_for(entry, contract)
        request = plan_request(entry, cfg, mode, self._structure(path))
        policy = pl.Policy(exclusive_fraction=self.config.policy.exclusive_fraction)
        budget = self._budget_fn()
        self._last_budget = budget
        return pl.plan(request, self._residents(), budget,
                       lambda _k, c: self.footprint(path, c), policy, now if now is not None else self.clock())

    def budget(self) -> Budget:
        """The budget as the planner would see it now (a fresh reading)."""
        return self._budget_fn()

    def last_budget_json(self) -> dict | None:
        """The budget snapshot the last plan was made against, with every figure's source."""
        return self._last_budget.to_json() if self._last_budget is not None else None

    # -- the front door's entry points ------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def acquire(self, key: str, contract: Contract | None = None, *,
                      request_id: str | None = None) -> AsyncIterator[SeatState]:
        """Make ``key`` resident (loading it if needed) and hold it in flight for the block."""
        entry = self.catalog.resolve(key)
        seat = self._ready_seat(entry, contract)
        if seat is not None:
            seat.in_flight += 1  # no await between the check and this: the seat cannot be evicted in between
        else:
            seat = await self._queue_for_load(entry, contract, request_id)
        seat.last_used = self.clock()
        try:
            yield seat
        finally:
            seat.in_flight -= 1
            seat.last_used = self.clock()
            await self._notify()

    def _ready_seat(self, entry: CatalogEntry, contract: Contract | None) -> SeatState | None:
        seat = self.seats.get(entry.key)
        if seat is None or seat.state != "ready" or seat.draining:
            return None
        if contract is not None and contract != Contract():
            cfg, _mode, path = self.config_for(entry, contract)
            if not _compatible(seat, cfg, path, contract):
                return None
        return seat

    async def _queue_for_load(self, entry: CatalogEntry, contract: Contract | None,
                              request_id: str | None) -> SeatState:
        """Wait (bounded) for ``entry`` to be loaded; return its seat with this request already in flight.

        The loader reserves the new seat for every queued request before it lets go of the placement
        lock, so another model's placement cannot evict it before its waiters get to use it.
        """
        pol = self.config.policy
        waiting = self._waiting.get(entry.key, 0)
        if waiting >= pol.max_queue:
            raise Busy(f"{entry.key}: {waiting} requests already wait for this model (max_queue={pol.max_queue}); "
                       f"retry later or raise policy.max_queue", retry_after=5)
        self._waiting[entry.key] = waiting + 1
        claim = _Claim()
        self._claims.setdefault(entry.key, []).append(claim)
        try:
            async with asyncio.timeout(pol.queue_timeout_seconds):
                while True:
                    seat = await self.load(entry.key, contract, request_id=request_id)
                    reserved, claim.seat = claim.seat, None
                    if reserved is not None:
                        reserved.reserved -= 1
                    if seat.state == "ready" and self._ready_seat(entry, contract) is seat:
                        seat.in_flight += 1
                        return seat
                    # evicted before it could be used, or loaded under another request's contract: go again
        except TimeoutError:
            raise Busy(f"{entry.key}: not ready within policy.queue_timeout_seconds="
                       f"{pol.queue_timeout_seconds:g}; retry later", retry_after=10) from None
        finally:
            self._waiting[entry.key] -= 1
            self._claims[entry.key].remove(claim)
            if claim.seat is not None:
                claim.seat.reserved -= 1

    async def load(self, key: str, contract: Contract | None = None, *, request_id: str | None = None) -> SeatState:
        """Load ``key`` (one load at a time; concurrent callers share it)."""
        entry = self.catalog.resolve(key)
        existing = self._ready_seat(entry, contract)
        if existing is not None:
            return existing
        fut = self._loading.get(entry.key)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._loading[entry.key] = fut
            task = asyncio.create_task(self._load_locked(entry, contract, request_id, fut))
            task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)
        return await asyncio.shield(fut)

    async def unload(self, key: str, *, reason: str = "unloaded on request") -> StopResult | None:
        entry = self.catalog.resolve(key)
        async with self._placement:
            seat = self.seats.get(entry.key)
            if seat is None:
                return None
            if seat.in_flight:
                await self._drain([seat.key])
            return await self._stop_seat(seat, event="unload", reason=reason)

    # -- placement ------------------------------------------------------------------------------

    async def _load_locked(self, entry: CatalogEntry, contract: Contract | None, request_id: str | None,
                           fut: asyncio.Future) -> None:
        try:
            async with self._placement:
                seat = await self._place(entry, contract, request_id)
                for claim in self._claims.get(entry.key, ()):
                    if claim.seat is None:
                        claim.seat = seat
                        seat.reserved += 1
            fut.set_result(seat)
        except BaseException as e:  # the waiters get the failure; nothing is swallowed
            if not fut.done():
                fut.set_exception(e)
            if isinstance(e, (asyncio.CancelledError, KeyboardInterrupt, SystemExit)):
                raise
        finally:
            self._loading.pop(entry.key, None)

    async def _place(self, entry: CatalogEntry, contract: Contract | None, request_id: str | None) -> SeatState:
        drain_deadline = self.clock() + self.config.policy.drain_timeout_seconds
        await self._dry_run(entry, contract)
        while True:
            existing = self._ready_seat(entry, contract)
            if existing is not None:
                return existing
            plan = self.plan(entry.key, contract)
            if plan.action == "hit":
                seat = self.seats.get(entry.key)
                if seat is not None and seat.state == "ready":
                    return seat
            if plan.action == "wait":
                remaining = drain_deadline - self.clock()
                if remaining <= 0:
                    raise Busy(f"{entry.key} needs {', '.join(plan.wait_for)} evicted, but they still have requests "
                               f"in flight after policy.drain_timeout_seconds="
                               f"{self.config.policy.drain_timeout_seconds:g}; retry later", retry_after=5)
                await self._drain(list(plan.wait_for), timeout=remaining)
                continue
            if plan.action == "refuse":
                await self.record(Event(time=self.clock(), event="refuse", model=entry.key, engine=entry.engine,
                                        reason=plan.reason, request_id=request_id,
                                        predicted_bytes=_plan_needed(plan),
                                        details={"plan": plan_to_json(plan)}))
                raise Refused(plan, plan.reason)
            # Evict: mark the victims in the same synchronous stretch that read their in-flight counts.
            victims = [self.seats[v.key] for v in plan.evict if v.key in self.seats]
            busy = [v.key for v in victims if v.in_flight or v.reserved]
            if busy:
                continue  # a request slipped in since the plan; re-plan (it will say wait)
            for v in victims:
                v.state = "stopping"
            old = self.seats.get(entry.key)
            for v in victims:
                await self._stop_seat(v, event="evict", reason=_evict_reason(plan, v.key, entry.key),
                                      request_id=request_id)
            if old is not None and old.state in ("ready", "starting") and old not in victims:
                # a reload under a different contract replaces the resident seat
                if old.in_flight or old.reserved:
                    await self._drain([old.key], timeout=max(0.0, drain_deadline - self.clock()))
                await self._stop_seat(old, event="unload", reason="reload with a different load contract",
                                      request_id=request_id)
            _cfg, _mode, path = self.config_for(entry, contract)
            return await self._start_seat(entry, plan, path, request_id)

    async def _drain(self, keys: Sequence[str], timeout: float | None = None) -> None:
        timeout = self.config.policy.drain_timeout_seconds if timeout is None else timeout

        def drained() -> bool:
            return all(self.seats.get(k) is None or self.seats[k].in_flight + self.seats[k].reserved == 0
                       for k in keys)

        # New requests for a draining seat queue behind this placement instead of keeping it busy forever.
        draining = [self.seats[k] for k in keys if k in self.seats]
        for seat in draining:
            seat.draining = True
        try:
            async with self._changed:
                await asyncio.wait_for(self._changed.wait_for(drained), timeout)
        except asyncio.TimeoutError:
            raise Busy(f"requests to {', '.join(keys)} did not drain within {timeout:.0f} s; retry later",
                       retry_after=5) from None
        finally:
            for seat in draining:
                seat.draining = False

    # -- start ----------------------------------------------------------------------------------

    async def _start_seat(self, entry: CatalogEntry, plan: pl.Plan, path: Path, request_id: str | None) -> SeatState:
        cfg = plan.config
        predicted = self.footprint(path, cfg)
        t0 = time.monotonic()
        for attempt in (1, 2):
            # The port is free when chosen but another process may take it first; the engine then fails to
            # bind at once, before it reads a weight, and one retry on a new port is enough.
            seat, spec = await self._spawn(entry, plan, path, predicted)
            try:
                await self._wait_ready(seat)
                break
            except LoadFailed as e:
                seat.expected_exit = True
                await self._kill_group(seat)
                seat.state = "failed"
                self.seats.pop(entry.key, None)
                await asyncio.to_thread(self.store.seat_remove, seat.id)
                if attempt == 1 and BIND_FAILED in _log_tail(seat.log_path, 200):
                    continue
                await self.record(Event(time=self.clock(), event="fail", model=entry.key, engine=entry.engine,
                                        seconds=time.monotonic() - t0, strategy=plan.action, reason=str(e),
                                        request_id=request_id, predicted_bytes=predicted.total_bytes,
                                        details={"log": str(seat.log_path), "argv": list(spec.argv),
                                                 "pid": seat.pid}))
                await self._notify()
                raise
        seat.load_seconds = time.monotonic() - t0
        seat.ready_at = self.clock()
        seat.state = "ready"
        seat.watcher = asyncio.create_task(self._watch(seat), name=f"watch-{seat.key}")
        await asyncio.to_thread(self.store.seat_upsert, self._seat_record(seat))
        await self._measure_and_record(seat, plan, request_id, spec.notes)
        await self._notify()
        return seat

    async def _spawn(self, entry: CatalogEntry, plan: pl.Plan, path: Path,
                     predicted: Footprint) -> tuple[SeatState, Any]:
        """Start the engine process for a new seat (own process group, own log file) and record its pid."""
        cfg = plan.config
        port = self._ports()
        seat_id = uuid.uuid4().hex[:12]
        log_path = self.log_dir / f"{entry.key.replace('/', '_')}-{seat_id}.log"
        seat = SeatState(
            id=seat_id, key=entry.key, entry=entry, engine=entry.engine, config=cfg, model_path=path, port=port,
            log_path=log_path, started_at=self.clock(), predicted=predicted, signature=self.signature(path, cfg),
            strategy=plan.action, pinned=entry.pinned,
        )
        spec = self._engine.launch_spec(path, cfg, port, extra_args=tuple(entry.settings.extra_args),
                                        embeddings=bool(entry.settings.embeddings))
        self.seats[entry.key] = seat
        with log_path.open("wb") as log:
            seat.proc = await asyncio.create_subprocess_exec(
                *spec.argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
                env=dict(spec.env), start_new_session=True, preexec_fn=die_with_parent,
            )
        seat.pid = seat.pgid = seat.proc.pid
        await asyncio.to_thread(self.store.seat_upsert, self._seat_record(seat))
        return seat, spec

    async def _wait_ready(self, seat: SeatState) -> None:
        eng = self.config.engine
        hard_deadline = time.monotonic() + eng.health_timeout_seconds
        last_mem: int | None = None
        last_progress = time.monotonic()
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                assert seat.proc is not None
                if seat.proc.returncode is not None:
                    raise LoadFailed(f"{seat.key}: llama-server exited with code {seat.proc.returncode} while "
                                     f"loading {seat.model_path.name}; log {seat.log_path}:\n{_log_tail(seat.log_path)}")
                try:
                    r = await client.get(seat.base_url + "/health")
                    if r.status_code == 200:
                        return
                except httpx.TransportError:
                    pass  # not listening yet: the stall and deadline checks below bound this
                now = time.monotonic()
                mem = procmem.read_tree(seat.pid)
                total = mem.committed_bytes + mem.mapped_bytes if mem.source != "unavailable" else None
                if total is not None and total != last_mem:
                    last_mem, last_progress = total, now
                if now - last_progress > eng.stall_seconds:
                    raise LoadFailed(f"{seat.key}: load stalled: no change in process memory for "
                                     f"{eng.stall_seconds:g} s (engine.stall_seconds) and /health not ready; "
                                     f"log {seat.log_path}:\n{_log_tail(seat.log_path)}")
                if now > hard_deadline:
                    raise LoadFailed(f"{seat.key}: not healthy within engine.health_timeout_seconds="
                                     f"{eng.health_timeout_seconds:g}; log {seat.log_path}:\n{_log_tail(seat.log_path)}")
                try:
                    await asyncio.wait_for(asyncio.shield(seat.proc.wait()), 0.1)
                except asyncio.TimeoutError:
                    pass  # still running: poll /health again

    async def _measure_and_record(self, seat: SeatState, plan: pl.Plan, request_id: str | None,
                                  notes: Sequence[str]) -> None:
        log_text = seat.log_path.read_text(errors="replace")
        try:
            seat.measured = self._engine.measured_footprint(log_text)
        except ValueError as e:
            seat.measured, seat.measured_note = None, f"unavailable, because the load log could not be parsed: {e}"
        seat.host_mem = procmem.read_tree(seat.pid)
        if seat.config.devices:
            gpus = read_gpus(self._nvml)
            for dev, n in gpus.used_by(set(seat.host_mem.pids) or {seat.pid}).items():
                if n is not None and dev in seat.config.devices:
                    seat.gpu_bytes[dev] = n
        await self._learn_overhead(seat)
        seat.overhead = self.engine_overhead.get(HOST, 0)
        seat.gpu_overhead = {d: n for d, n in self.engine_overhead.items() if d in seat.config.devices}
        measured_total = seat.measured.total_bytes if seat.measured else None
        file_bytes = seat.model_path.stat().st_size
        previous = self.store.last_measurement(seat.signature)
        verdict = guard_mod.check_measurement(measured_total, file_bytes=file_bytes,
                                              previous=previous.total_bytes if previous else None)
        details: dict[str, Any] = {
            "port": seat.port, "pid": seat.pid, "log": str(seat.log_path), "config": seat.config.to_json(),
            "predicted": seat.predicted.to_json(),
            "measured": seat.measured.to_json() if seat.measured else seat.measured_note,
            "host_pss": _mem_json(seat.host_mem),
            "guard": {"accepted": verdict.accepted, "check": verdict.check, "reason": verdict.reason},
            "notes": list(notes),
            "compute_source": ("dry-run" if (str(seat.model_path), seat.config) in self._compute else
                               f"formula, because the dry run gave no figure: "
                               f"{self._dry_run_notes.get((str(seat.model_path), seat.config), 'not run for this configuration')}"),
        }
        if seat.measured is not None and measured_total is not None:
            err = (seat.predicted.total_bytes - measured_total) / measured_total if measured_total else None
            details["prediction_error"] = err
        if verdict.accepted and seat.measured is not None:
            m = Measurement(signature=seat.signature, model=seat.key, engine=seat.engine, measured_at=self.clock(),
                            footprint=seat.measured.to_json(),
                            host_committed_bytes=seat.host_mem.committed_bytes if seat.host_mem else None,
                            host_mapped_bytes=seat.host_mem.mapped_bytes if seat.host_mem else None,
                            total_bytes=measured_total)
            await asyncio.to_thread(self.store.put_measurement, m)
            self._footprints.clear()  # a new measurement overrides the priced figure for its signature
        has_gpu = self._last_budget is not None and bool(self._last_budget.gpu_names)
        gpu = _gpu_bytes(seat) if has_gpu else None  # no GPU on this machine: not applicable, not 0
        await self.record(Event(
            time=self.clock(), event="load", model=seat.key, engine=seat.engine, seconds=seat.load_seconds,
            vram_bytes=gpu, host_bytes=seat.bytes_on(HOST),
            offloaded_bytes=self._spilled(seat), strategy=_strategy(plan), request_id=request_id,
            reason=plan.reason or None, predicted_bytes=seat.predicted.total_bytes, measured_bytes=measured_total,
            details=details,
        ))

    def _spilled(self, seat: SeatState) -> int | None:
        """Model weights a load put in host RAM although the machine has a GPU (partial or RAM-only
        loads): the history's ``offloaded`` figure. None on a machine without a GPU: nothing was offloaded."""
        if self._last_budget is None or not self._last_budget.gpu_names:
            return None
        fp = seat.measured or seat.predicted
        cpu = fp.device(HOST)
        return cpu.model.bytes if cpu is not None else 0

    async def _learn_overhead(self, seat: SeatState) -> None:
        """Estimate the engine process's own memory per device: what was measured minus the buffers its log
        reports. Host: PSS; a GPU: NVML's bytes for the process (its CUDA context is the difference).

        A measurement never exceeds overhead + buffers (untouched pages are not resident), so each load gives
        a lower bound; the largest seen is kept per engine binary and added to every price.
        """
        if seat.measured is None:
            return
        seen: dict[str, int] = {}
        if seat.host_mem is not None and seat.host_mem.host_bytes is not None:
            seen[HOST] = seat.host_mem.host_bytes - seat.measured.bytes_on(HOST)
        for dev, n in seat.gpu_bytes.items():
            if seat.measured.device(dev) is not None:
                seen[dev] = n - seat.measured.bytes_on(dev)
        grown = {d: n for d, n in seen.items() if n > self.engine_overhead.get(d, 0)}
        if grown:
            self.engine_overhead.update(grown)
            self._footprints.clear()
            await asyncio.to_thread(self.store.compute_put, self._overhead_key, dict(self.engine_overhead))

    # -- stop -----------------------------------------------------------------------------------

    async def _kill_group(self, seat: SeatState) -> float:
        """SIGTERM the group, wait the grace period, then SIGKILL it. Returns seconds to exit."""
        t0 = time.monotonic()
        if seat.pgid is None:
            return 0.0
        with contextlib.suppress(ProcessLookupError):
            os.killpg(seat.pgid, signal.SIGTERM)
        grace = self.config.engine.stop_grace_seconds
        if seat.proc is not None:
            try:
                await asyncio.wait_for(asyncio.shield(seat.proc.wait()), grace)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(seat.pgid, signal.SIGKILL)
                await seat.proc.wait()
        else:
            await _wait_pid_gone(seat.pgid, grace)
            if _group_alive(seat.pgid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(seat.pgid, signal.SIGKILL)
                await _wait_pid_gone(seat.pgid, 10.0)
        # other members of the group (none expected for llama-server) get the same end
        if _group_alive(seat.pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(seat.pgid, signal.SIGKILL)
        return time.monotonic() - t0

    async def _stop_seat(self, seat: SeatState, *, event: str, reason: str,
                         request_id: str | None = None) -> StopResult:
        seat.state = "stopping"
        seat.expected_exit = True
        held: dict[str, int | None] = {
            HOST: seat.host_mem.committed_bytes if seat.host_mem is not None else None,
            **{d: seat.gpu_bytes.get(d) for d in seat.config.devices},
        }
        before = self._free_now(seat.config.devices)
        exit_s = await self._kill_group(seat)
        seat.state = "stopped"
        if self.seats.get(seat.key) is seat:
            self.seats.pop(seat.key)
        await asyncio.to_thread(self.store.seat_remove, seat.id)
        release = await self._verify_release(before, held, seat.config.devices)
        mem_available_delta = release.freed_by_device.get("MemAvailable")
        await self.record(Event(
            time=self.clock(), event=event, model=seat.key, engine=seat.engine, seconds=exit_s,
            host_bytes=seat.bytes_on(HOST), vram_bytes=_gpu_bytes(seat) or None, reason=reason,
            freed_bytes=release.freed_bytes, request_id=request_id,
            details={"release_verified": release.verified, "exit_seconds": exit_s,
                     "release_seconds": release.release_seconds, "held_committed_bytes": held[HOST],
                     "held_bytes": held, "freed_by_device": release.freed_by_device,
                     "release_note": release.note, "pid": seat.pid,
                     "mem_available_delta_bytes": mem_available_delta,
                     "freed_source": "measured: /proc/meminfo AnonPages+Shmem fall (host), NVML free (GPU)"},
        ))
        await self._notify()
        return StopResult(seat.key, release.freed_bytes, exit_s, release.release_seconds, release.verified,
                          release.note)

    def _free_now(self, devices: Sequence[str]) -> dict[str, int]:
        """Bytes not held by any process, as the kernel and the driver count them.

        Host: MemTotal - (AnonPages + Shmem), the committed memory every process holds. MemAvailable is
        recorded beside it but does not gate the check: on some kernels (virtio-balloon free page
        reporting, for one) freed pages reach MemFree seconds later or not at all, while AnonPages drops
        the moment the process's memory is unmapped. GPU: NVML free.
        """
        mem = procmem.read_meminfo()
        host = mem.total_bytes - mem.committed_bytes if mem.committed_bytes is not None else mem.available_bytes
        free = {HOST: host, "MemAvailable": mem.available_bytes}
        if devices:
            gpus = read_gpus(self._nvml)
            for d in devices:
                g = gpus.device(d)
                if g is not None:
                    free[d] = g.free_bytes
        return free

    async def _verify_release(self, before: dict[str, int], held: dict[str, int | None],
                              devices: Sequence[str]) -> Release:
        """Poll until the memory the seat held is back on every device, or the timeout passes."""
        t0 = time.monotonic()
        timeout = self.config.engine.release_timeout_seconds
        while True:
            elapsed = time.monotonic() - t0
            r = release_check(held, before, self._free_now(devices), elapsed=elapsed, timed_out=elapsed > timeout)
            if r.verified or r.final:
                return r
            await asyncio.sleep(0.05)  # polling kernel and driver counters: there is no event to await

    # -- crash detection and idle unload --------------------------------------------------------

    async def _watch(self, seat: SeatState) -> None:
        if seat.proc is not None:
            rc: int | str = await seat.proc.wait()
        else:  # an adopted seat is not our child: watch it through a pidfd
            assert seat.pid is not None
            await _wait_pid_gone(seat.pid, None)
            rc = "unknown (not a child of this fitevict)"
        if seat.expected_exit or seat.state in ("stopping", "stopped"):
            return
        seat.state = "failed"
        if self.seats.get(seat.key) is seat:
            self.seats.pop(seat.key)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(seat.pgid, signal.SIGKILL)
        await asyncio.to_thread(self.store.seat_remove, seat.id)
        await self.record(Event(time=self.clock(), event="crash", model=seat.key, engine=seat.engine,
                                reason=f"llama-server exited unexpectedly with code {rc}; the next request reloads it",
                                details={"exit_code": rc, "pid": seat.pid, "log": str(seat.log_path),
                                         "log_tail": _log_tail(seat.log_path, 10)}))

    async def _idle_loop(self) -> None:
        ttl = self.config.policy.idle_unload_seconds
        if not ttl:
            return
        while not self.closed:
            for s in [s for s in self.seats.values() if _idle_due(s, self.clock(), ttl)]:
                async with self._placement:
                    if _idle_due(s, self.clock(), ttl):  # re-read under the lock: a request may have arrived
                        await self._stop_seat(s, event="idle-unload",
                                              reason=f"idle for {self.clock() - s.last_used:.1f} s "
                                                     f"(policy.idle_unload_seconds={ttl:g})")
            # Sleep until the next seat could fall due; a request ending (or any other change) wakes us sooner.
            waiting = [s.last_used + ttl for s in self.seats.values()
                       if _idle_due(s, float("inf"), ttl) and s.last_used is not None]
            delay = min([max(0.05, d - self.clock()) for d in waiting] + [ttl, 30.0])
            async with self._changed:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), delay)

    # -- orphans --------------------------------------------------------------------------------

    async def _cleanup_orphans(self) -> list[Event]:
        """Deal with engine processes a previous fitevict recorded: stop them, or adopt healthy ones.

        ``engine.orphans = "stop"`` (default) stops every live one; ``"adopt"`` keeps a healthy seat of
        a model still in the catalog as a resident, and stops the rest. Each is recorded as an ``orphan``.
        """
        events = []
        for rec in await asyncio.to_thread(self.store.seats):
            argv = _cmdline(rec.pid) if rec.pid is not None else []
            alive = rec.pid is not None and _alive(rec.pid) and bool(argv) and "llama-server" in Path(argv[0]).name \
                and str(rec.port) in argv
            await asyncio.to_thread(self.store.seat_remove, rec.seat_id)
            adopted = None
            if alive and self.config.engine.orphans == "adopt":
                adopted = await self._adopt(rec, argv)
            if adopted is not None:
                action = f"adopted healthy orphan llama-server pid {rec.pid} (port {rec.port}) of {rec.model}, " \
                         f"left by fitevict pid {rec.fitevict_pid}"
            elif alive and rec.pid is not None:
                ghost = SeatState(
                    id=rec.seat_id, key=rec.model, entry=None, engine=rec.engine,  # type: ignore[arg-type]
                    config=LoadConfig.from_json(rec.config) if rec.config else LoadConfig(), model_path=Path("."),
                    port=rec.port or 0, log_path=Path(rec.log_path or "."), started_at=rec.started_at,
                    predicted=Footprint(()), signature="", strategy="orphan", pid=rec.pid, pgid=rec.pgid or rec.pid,
                )
                exit_s = await self._kill_group(ghost)
                action = f"stopped orphan llama-server pid {rec.pid} (port {rec.port}) left by fitevict pid " \
                         f"{rec.fitevict_pid} in {exit_s:.2f} s (engine.orphans={self.config.engine.orphans})"
            else:
                action = f"forgot seat record of {rec.model} (pid {rec.pid}): process no longer running"
            events.append(await self.record(Event(time=self.clock(), event="orphan", model=rec.model,
                                                  engine=rec.engine, reason=action,
                                                  details={"pid": rec.pid, "was_alive": alive,
                                                           "adopted": adopted is not None,
                                                           "fitevict_pid": rec.fitevict_pid})))
        return events

    async def _adopt(self, rec: SeatRecord, argv: list[str]) -> SeatState | None:
        """Take over a live, healthy seat of a catalogued model; None when it does not qualify."""
        entry = self.catalog.get(rec.model)
        if entry is None or rec.pid is None or rec.port is None or "-m" not in argv:
            return None
        try:
            async with httpx.AsyncClient(timeout=2.0) as c:
                if (await c.get(f"http://127.0.0.1:{rec.port}/health")).status_code != 200:
                    return None
        except httpx.TransportError:
            return None
        path = Path(argv[argv.index("-m") + 1])
        cfg = LoadConfig.from_json(rec.config) if rec.config else LoadConfig()
        if not path.is_file():
            return None
        seat = SeatState(
            id=rec.seat_id, key=entry.key, entry=entry, engine=rec.engine, config=cfg, model_path=path,
            port=rec.port, log_path=Path(rec.log_path or self.log_dir / f"{entry.key}-{rec.seat_id}.log"),
            started_at=rec.started_at, predicted=self.footprint(path, cfg), signature=self.signature(path, cfg),
            strategy="adopted", state="ready", pid=rec.pid, pgid=rec.pgid or rec.pid, ready_at=self.clock(),
            pinned=entry.pinned,
        )
        try:
            seat.measured = self._engine.measured_footprint(seat.log_path.read_text(errors="replace"))
        except (OSError, ValueError) as e:
            seat.measured_note = f"unavailable, because the adopted seat's log could not be read: {e}"
        seat.host_mem = procmem.read_tree(rec.pid)
        self.seats[entry.key] = seat
        seat.watcher = asyncio.create_task(self._watch(seat), name=f"watch-{seat.key}")
        await asyncio.to_thread(self.store.seat_upsert, self._seat_record(seat))
        return seat

    def _seat_record(self, seat: SeatState) -> SeatRecord:
        return SeatRecord(seat_id=seat.id, model=seat.key, engine=seat.engine, state=seat.state,
                          started_at=seat.started_at, fitevict_pid=os.getpid(), pid=seat.pid, pgid=seat.pgid,
                          port=seat.port, log_path=str(seat.log_path), config=seat.config.to_json())

    # -- views ----------------------------------------------------------------------------------

    def resident_views(self) -> list[dict]:
        ttl = self.config.policy.idle_unload_seconds
        out = []
        for s in self.seats.values():
            devices = [HOST, *s.config.devices]
            per_dev = {d: {"predicted_bytes": s.predicted.bytes_on(d), "predicted_source": _pred_source(s.predicted, d),
                           "measured_bytes": s.bytes_on(d) if s.source_on(d) == "measured" else None,
                           "measured_source": s.source_on(d) if s.source_on(d) == "measured" else
                           "unavailable, because it was not measured yet"} for d in devices}
            gpu = sum(s.bytes_on(d) for d in s.config.devices)
            host = s.bytes_on(HOST)
            total = gpu + host
            placement = (f"{100 * host / total:.0f}%/{100 * gpu / total:.0f}% CPU/GPU" if gpu and total
                         else "100% CPU")
            out.append({
                "key": s.key, "engine": s.engine, "state": s.state, "placement": placement,
                "devices": per_dev, "ctx": s.config.n_ctx, "config": s.config.to_json(),
                "in_flight": s.in_flight, "last_used": s.last_used, "loaded_at": s.ready_at,
                "load_seconds": s.load_seconds, "pid": s.pid, "port": s.port,
                "unload_at": (s.last_used + ttl) if (ttl and s.last_used is not None) else None,
                "host_pss": _mem_json(s.host_mem),
            })
        return out


# --- small pure helpers --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Release:
    verified: bool
    final: bool  # no point polling again (verified, unverifiable, or timed out)
    freed_bytes: int | None  # host: MemAvailable delta (measured)
    freed_by_device: dict[str, int]
    release_seconds: float | None
    note: str


RELEASE_FRACTION = 0.9
RELEASE_SLACK = 4 * MiB


def release_check(held: dict[str, int | None], before: dict[str, int], now: dict[str, int], *,
                  elapsed: float, timed_out: bool) -> Release:
    """Has the memory a stopped seat held come back? Pure: compares "not held by any process" before and now.

    ``before``/``now`` map a device to bytes no process holds (host: MemTotal - AnonPages - Shmem;
    GPU: NVML free); extra keys (MemAvailable) are reported, not checked. Other processes move these
    counters too, so a device counts as released when they rose by at least 90% of what the seat held,
    less 4 MiB. A figure the seat never had measured cannot be verified: the release is then reported
    unverified with that reason, never as verified.
    """
    freed = {d: now[d] - before[d] for d in before if d in now}
    # A fall in free memory means others took more than the seat gave back: the seat's share is unknown.
    host_freed = freed.get(HOST) if freed.get(HOST, -1) >= 0 else None
    unknown = [d for d, h in held.items() if h is None or d not in freed]
    if unknown:
        return Release(False, True, host_freed, freed, None,
                       f"unverified: held memory on {', '.join(unknown)} was never measured")
    short = {d: (freed[d], h) for d, h in held.items()
             if h is not None and freed[d] < max(0, int(h * RELEASE_FRACTION) - RELEASE_SLACK)}
    words = "; ".join(f"{d}: {format_size(freed[d])} came back of {format_size(h)} held" for d, h in held.items()
                      if h is not None)
    if not short:
        return Release(True, True, host_freed, freed, elapsed, words)
    if timed_out:
        return Release(False, True, host_freed, freed, None, f"not released within the timeout: {words}")
    return Release(False, False, host_freed, freed, None, words)


def load_config_for(entry: CatalogEntry, contract: Contract | None,
                    default_alloc_mode: str) -> tuple[LoadConfig, str, Path]:
    """The LoadConfig a model starts with (model settings, then the request's contract), its
    allocation mode, and the GGUF file to load."""
    c = contract or Contract()
    s = entry.settings
    kv = c.kv_cache_type
    cfg = LoadConfig(
        n_ctx=c.ctx if c.ctx is not None else (s.ctx if s.ctx is not None else 4096),
        n_parallel=c.parallel or s.parallel or 1,
        cache_type_k=kv or s.cache_type_k or "f16",
        cache_type_v=kv or s.cache_type_v or "f16",
        flash_attn=("on" if c.flash_attn else "off") if c.flash_attn is not None else (s.flash_attn or "auto"),
        n_gpu_layers=c.n_gpu_layers if c.n_gpu_layers is not None else (s.n_gpu_layers or 0),
        n_cpu_moe=c.n_cpu_moe if c.n_cpu_moe is not None else (s.n_cpu_moe or 0),
        embeddings=bool(s.embeddings),  # an embeddings seat's output buffer is priced as it will grow
    )
    mode = c.alloc_mode or s.alloc_mode or default_alloc_mode
    path = Path(entry.path)
    if c.gguf_file:
        from fitevict.catalog import resolve_gguf_file

        path = resolve_gguf_file(entry, c.gguf_file)
    return cfg, mode, path


def plan_request(entry: CatalogEntry, cfg: LoadConfig, mode: str, structure) -> pl.PlanRequest:
    """The planner's request for ``entry``: n_layer counts the output pseudo-layer too."""
    return pl.PlanRequest(
        key=entry.key, config=cfg, alloc_mode=mode, n_layer=structure.n_layer + 1,  # type: ignore[arg-type]
        n_moe_layers=structure.n_layer if structure.is_moe else 0, n_ctx_train=structure.n_ctx_train,
        pinned=entry.pinned,
    )


def _compatible(seat: SeatState, cfg: LoadConfig, path: Path, contract: Contract) -> bool:
    if path.resolve() != seat.model_path.resolve():
        return False
    c = seat.config
    if contract.ctx is not None and contract.ctx != c.n_ctx:
        return False
    if contract.kv_cache_type is not None and (contract.kv_cache_type, contract.kv_cache_type) != (c.cache_type_k, c.cache_type_v):
        return False
    if contract.flash_attn is not None and ("on" if contract.flash_attn else "off") != c.flash_attn:
        return False
    if contract.n_gpu_layers is not None and contract.n_gpu_layers != c.n_gpu_layers:
        return False
    if contract.n_cpu_moe is not None and contract.n_cpu_moe != c.n_cpu_moe:
        return False
    if contract.parallel is not None and contract.parallel != c.n_parallel:
        return False
    return True


def _idle_due(s: SeatState, now: float, ttl: float) -> bool:
    """An idle unload is due: a ready, unpinned seat that was used, serves nothing, and sat ``ttl`` seconds.
    A seat that was never used is left alone; a pinned one is never unloaded for idleness."""
    return (s.state == "ready" and not s.pinned and s.last_used is not None and s.in_flight == 0
            and s.reserved == 0 and now - s.last_used >= ttl)


def _dominant_type(structure) -> str:
    """The ggml type holding the most weight bytes: the file's quantization, for signatures."""
    by_type: dict[str, int] = {}
    for t in structure.tensors:
        by_type[t.ggml_type.name] = by_type.get(t.ggml_type.name, 0) + t.nbytes
    return max(by_type, key=by_type.__getitem__) if by_type else "unknown"


def _pred_source(fp: Footprint, device: str) -> str:
    if device == HOST:
        return fp.host_source
    d = fp.device(device)
    if d is None:
        return "formula"
    sources = {d.model.source, d.context.source, d.compute.source, d.output.source}
    return sources.pop() if len(sources) == 1 else "+".join(sorted(sources))


def _gpu_bytes(seat: SeatState) -> int:
    return sum(seat.bytes_on(d) for d in seat.config.devices)


def _strategy(plan: pl.Plan) -> str:
    c = plan.config
    base = {"load": "full", "partial": "partial", "ram": "ram-only"}.get(plan.action, plan.action)
    return f"{base} (ngl={c.n_gpu_layers}, n_cpu_moe={c.n_cpu_moe}, ctx={c.n_ctx})"


def _plan_needed(plan: pl.Plan) -> int | None:
    return sum(plan.needed_bytes.values()) if plan.needed_bytes else None


def _evict_reason(plan: pl.Plan, victim: str, for_key: str) -> str:
    for v in plan.evict:
        if v.key == victim:
            return f"evicted for {for_key}: {v.reason}"
    return f"evicted for {for_key}"


def plan_to_json(plan: pl.Plan) -> dict:
    return plan.to_json()


def with_engine_overhead(fp: Footprint, overhead: Mapping[str, int]) -> Footprint:
    """The footprint with the engine process's measured overhead: on the host it joins committed memory,
    on a GPU where the model has buffers it is the footprint's ``overhead`` for that device.

    Device rows stay the engine's own buffers, term by term.
    """
    host = overhead.get(HOST, 0)
    gpus = tuple((d, n) for d, n in overhead.items() if d != HOST and n > 0 and fp.device(d) is not None)
    if host <= 0 and not gpus:
        return fp
    notes = list(fp.notes)
    if host > 0:
        notes.append(f"host includes {format_size(host)} of llama-server process overhead "
                     f"(measured: PSS minus logged buffers)")
    for d, n in gpus:
        notes.append(f"{d} includes {format_size(n)} of llama-server process overhead "
                     f"(measured: NVML process bytes minus logged buffers)")
    return replace(fp, host_committed_bytes=fp.host_committed_bytes + max(host, 0), notes=tuple(notes),
                   host_source=f"{fp.host_source}+measured" if host > 0 else fp.host_source,  # type: ignore[arg-type]
                   overhead=gpus)


def footprint_from_json(d: dict) -> Footprint:
    """Rebuild a Footprint from ``Footprint.to_json()`` (used for stored measurements)."""
    devs = []
    for dv in d.get("devices", []):
        src = dv.get("sources", {})

        def term(name: str) -> Term:
            b = dv.get(f"{name}_bytes")
            s = src.get(name, "measured")
            return Term(b, s) if b is not None else Term.unavailable(dv.get("unavailable", {}).get(name, "not recorded"))

        devs.append(DeviceFootprint(dv["name"], term("model"), term("context"), term("compute"), term("output")))
    host = d.get("host", {})
    return Footprint(tuple(devs), host.get("mapped_bytes", 0), host.get("committed_bytes", 0),
                     host.get("source", "measured"), overhead=tuple(d.get("overhead", {}).items()))


async def _wait_pid_gone(pid: int, timeout: float | None) -> None:
    """Wait for a process we did not spawn (an orphan) to exit, via a pidfd when the kernel has one."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfd on this kernel: poll the pid instead
        deadline = None if timeout is None else time.monotonic() + timeout
        while _alive(pid) and (deadline is None or time.monotonic() < deadline):
            await asyncio.sleep(0.1)
        return
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(fd, lambda: done.done() or done.set_result(None))
    try:
        await asyncio.wait_for(done, timeout)
    except asyncio.TimeoutError:
        pass  # still alive: the caller escalates to SIGKILL
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _mem_json(m: procmem.ProcessMemory | None) -> dict | None:
    if m is None:
        return None
    return {"committed_bytes": m.committed_bytes, "mapped_bytes": m.mapped_bytes, "rss_bytes": m.rss_bytes,
            "source": m.source, "reason": m.reason, "pids": list(m.pids)}
