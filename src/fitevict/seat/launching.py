"""A new seat's engine process from its spawn to its first healthy answer. Each attempt gets a fresh port and log:
the process is spawned in its own group, attached to its seat in the table, the scheduler told it runs
(``spawned``), its store record kept (``loading``) and its health awaited (``running.wait_ready``). An attempt that
fails is ended (``ending.Ending``) and read: an engine that could not bind its port (``Engine.bind_failed`` of its
log: another program took the port between its choice and the bind) is started once more on another port, and a
llama-server that crashed with repacking on (``crash.retry_without_repack``) once more without it, priced again for
that configuration; any other failure is final, and handed back to the load to record. A seat that answers is
kept in the store as ``ready``.

``Launcher`` works with four parts: the processes (the engine's argv, port and log), the seat table, the clock and
the engine settings (health timeout, stall); and with the seat's prices (``price.SeatPrices``), the ending,
the store's seat records and two callables: ``spawned`` (the scheduler's) and ``changed`` (the history's).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from fitevict.phase import mark
from fitevict import planner as pl
from fitevict.config.records import EngineConfig
from fitevict.engines import engine_class, traits
from fitevict.engines.base import LaunchSpec
from fitevict.pricing.footprint import Footprint
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.request.catalog import CatalogEntry
from fitevict.schedule.errors import LoadFailed
from fitevict.schedule.seats import SeatTable
from fitevict.seat.crash import RepackCrash, retry_without_repack
from fitevict.seat.ending import Ending
from fitevict.seat.processes import Processes
from fitevict.seat.release import StopResult
from fitevict.seat.running import SeatState, log_tail, spawn, wait_ready
from fitevict.seat.price import SeatPrices
from fitevict.seat.storing import SeatRecords

log = logging.getLogger("fitevict.seat")


@dataclass(eq=False)
class Attempt:
    """A load as far as it got: the step it is at (its words), the latest attempt's seat (None before the first
    spawn), its launch spec and configuration, and the crash that made it load without repacking."""

    step: str = "pruning the seat logs"
    seat: SeatState | None = None
    spec: LaunchSpec | None = None
    config: LoadConfig | None = None
    crash: RepackCrash | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """The last attempt failed for good: its stop, why it failed, and the engine's exit code when it exited on its
    own before the stop (None: it still ran, and the stop ended it)."""

    res: StopResult
    error: LoadFailed
    code: int | None = None


class Launcher:
    def __init__(self, processes: Processes, table: SeatTable, clock: Callable[[], float], engine: EngineConfig, *,
                 prices: SeatPrices, ending: Ending, records: SeatRecords,
                 spawned: Callable[[str, LoadConfig], None], changed: Callable[[], Awaitable[None]]) -> None:
        self.processes, self.table, self.clock, self.engine = processes, table, clock, engine
        self.prices, self.ending, self.records, self.spawned, self.changed = prices, ending, records, spawned, changed

    async def prune_logs(self) -> None:
        """Seat logs within ``[logs]`` before a load adds one (never a running seat's)."""
        await self.processes.prune_logs(self.table.running().values())

    async def launch(self, attempt: Attempt, entry: CatalogEntry, cfg: LoadConfig, path: Path, predicted: Footprint,
                     plan: pl.Plan) -> Failed | None:
        """Start ``entry`` under ``cfg`` until one attempt answers its health check (None) or one fails for good."""
        key, t0 = plan.key, self.clock()
        for n in (1, 2, 3):
            # The port is free when chosen but another process may take it first; the engine then fails to
            # bind at once, before it reads a weight, and one retry on a new port is enough.
            seat = attempt.seat = self._new_seat(key, entry, cfg, path, predicted, plan, after=attempt.seat)
            spec = attempt.spec = self.processes.launch_spec(entry, path, cfg, seat.port)
            attempt.config = cfg
            await spawn(seat, spec)
            mark(key, "spawned")
            self.table.attach(seat.seat, seat)
            self.spawned(key, cfg)
            await self.changed()
            self.records.keep(seat)  # a restart finds it, and that its load had not ended (``storing``)
            try:
                await wait_ready(seat, clock=self.clock, health_timeout=self.engine.health_timeout_seconds,
                                 stall_seconds=self.engine.stall_seconds, health_path=spec.health_path)
                break
            except LoadFailed as e:
                code = seat.proc.returncode if seat.proc is not None else None
                res = await self.ending.end(seat)
                if n == 1 and engine_class(entry.engine).bind_failed(log_tail(seat.log_path, 200)):
                    continue
                sig = retry_without_repack(traits(entry.engine).repacks, cfg, code) if attempt.crash is None else None
                if sig is None:
                    return Failed(res, e, code)
                # once, with no extra CPU buffer types, priced for that configuration
                attempt.crash = RepackCrash(sig, self.clock() - t0, str(seat.log_path), predicted.whole_bytes,
                                            res.freed_bytes, self.prices.host_buffers())
                log.warning("%s: llama-server died by %s with repacking on; loading it again with -nr", key, sig)
                cfg = cfg.with_(repack=False)
                predicted = await self.prices.without_repack(entry, path, cfg)
        self.records.keep(seat, "ready")
        return None

    def _new_seat(self, key: str, entry: CatalogEntry, cfg: LoadConfig, path: Path, predicted: Footprint,
                  plan: pl.Plan, after: SeatState | None) -> SeatState:
        """The record of a seat about to start: a fresh port and log, its price and signature (``after``: the
        attempt before, which failed and was read: its log may go)."""
        if after is not None:
            self.processes.done_with_log(after.log_path)
        record = self.table.get(key)
        assert record is not None, f"{key}: a load without its seat in the table"
        return SeatState(
            id=uuid.uuid4().hex[:12], seat=record, entry=entry, engine=entry.engine, model_path=path,
            port=self.processes.next_port(), log_path=self.processes.log_path(key),
            started_at=self.clock(), predicted=predicted, signature=self.prices.signature(path, cfg),
            strategy=plan.action, split=plan.split, predicted_overhead=self.prices.own_overhead(entry, cfg))
