"""Engine processes an earlier fitevict left behind: stopped (release-verified), or adopted when healthy."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from fitevict.engines import REGISTRY, engine_class, is_engine_process
from fitevict.engines.process import alive, cmdline, group_alive
from fitevict.engines.upstream import health_status
from fitevict.host import procmem
from fitevict.pricing.footprint import HOST
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.schedule.seats import Seat, SeatStatus
from fitevict.store.faults import STORE_FAULTS, reason
from fitevict.store.records import Event, SeatRecord
from fitevict.supervisor.ports import Ports
from fitevict.seat.release import stop_and_verify
from fitevict.seat.running import SeatState
from fitevict.seat.storing import interrupted, seat_record

log = logging.getLogger("fitevict.supervisor")


def _is_engine(argv: list[str], rec: SeatRecord) -> bool:
    """The recorded pid still runs the engine it ran for us (not a recycled pid)."""
    if not argv or str(rec.port) not in argv:
        return False
    return is_engine_process(argv)


async def cleanup_orphans(parts: Ports, install: Callable[[SeatState], None]) -> list[Event]:
    """``engine.orphans = "stop"`` (default) stops every live one; ``"adopt"`` keeps a healthy seat of a model
    still in the catalog as a resident, and stops the rest. Each is recorded as an ``orphan``, a stop with
    its release verified like every other stop. A seat whose load or stop the earlier fitevict was in the middle of
    (its record's state, ``storing``) closes that load or stop: ``details["interrupted"]`` names it."""
    events = []
    for rec in await parts.store.aio.seats():
        argv = cmdline(rec.pid) if rec.pid is not None else []
        live = rec.pid is not None and alive(rec.pid) and _is_engine(argv, rec)
        try:
            await parts.store.aio.seat_remove(rec.seat_id)
        except STORE_FAULTS as e:  # kept: the next start forgets it again
            log.warning("%s: the seat record %s of an earlier fitevict not removed: %s", rec.model, rec.seat_id,
                        reason(e))
        adopted = await adopt(parts, install, rec, argv) if live and parts.config.engine.orphans == "adopt" else None
        details: dict = {"pid": rec.pid, "was_alive": live, "adopted": adopted is not None,
                         "fitevict_pid": rec.fitevict_pid, "interrupted": interrupted(rec), "state": rec.state}
        freed = None
        if adopted is not None:
            action = (f"adopted healthy orphan {rec.engine} pid {rec.pid} (port {rec.port}) of {rec.model}, "
                      f"left by fitevict pid {rec.fitevict_pid}")
        elif live and rec.pid is not None:
            cfg = LoadConfig.from_json(rec.config) if rec.config else LoadConfig()
            res = await stop_and_verify(rec.model, rec.pgid or rec.pid, cfg.devices, proc=None,
                                        grace=parts.config.engine.stop_grace_seconds,
                                        release_timeout=parts.config.engine.release_timeout_seconds,
                                        nvml=parts.meters, clock=parts.clock)
            details.update(res.details())
            freed = res.freed_bytes
            action = (f"stopped orphan {rec.engine} pid {rec.pid} (port {rec.port}) left by fitevict pid "
                      f"{rec.fitevict_pid} in {res.exit_seconds:.2f} s (engine.orphans={parts.config.engine.orphans}); "
                      f"{res.note}")
        else:
            details["group_left"] = bool(rec.pgid and group_alive(rec.pgid))  # no process of its group runs
            action = f"forgot seat record of {rec.model} (pid {rec.pid}): process no longer running"
        if details["interrupted"] is not None:
            action += (f"; its {details['interrupted']} was interrupted: fitevict pid {rec.fitevict_pid} ended "
                       f"during it")
        events.append(await parts.history.record(Event(
            time=parts.clock(), event="orphan", model=rec.model, engine=rec.engine, reason=action, freed_bytes=freed,
            details=details)))
    return events


async def adopt(parts: Ports, install: Callable[[SeatState], None], rec: SeatRecord, argv: list[str]
                ) -> SeatState | None:
    """Take over a live, healthy seat of a catalogued model; None when it does not qualify."""
    entry = parts.catalog.get(rec.model)
    path = engine_class(rec.engine).model_of(argv) if rec.engine in REGISTRY else None
    if entry is None or rec.pid is None or rec.port is None or path is None:
        return None
    if await health_status(rec.port) != 200:
        return None
    cfg = LoadConfig.from_json(rec.config) if rec.config else LoadConfig()
    if not path.is_file():
        return None
    now = parts.clock()
    predicted = parts.prices.footprint(path, cfg)
    record = Seat(entry.key, cfg, str(path.resolve()), now, SeatStatus.READY, pinned=entry.pinned, ready_at=now,
                  turn_start=now, pages=predicted.pages)
    seat = SeatState(
        id=rec.seat_id, seat=record, entry=entry, engine=rec.engine, model_path=path,
        port=rec.port, log_path=Path(rec.log_path or parts.processes.log_dir / f"{entry.key}-{rec.seat_id}.log"),
        started_at=rec.started_at, predicted=predicted,
        signature=parts.prices.signature(path, cfg), strategy="adopted", pid=rec.pid, pgid=rec.pgid or rec.pid,
    )
    try:
        seat.measured = parts.processes.engine_for(entry).measured_footprint(seat.log_path.read_text(errors="replace"))
    except (OSError, ValueError) as e:
        seat.measured_note = f"unavailable, because the adopted seat's log could not be read: {e}"
    seat.load_reading(now, procmem.read_tree(rec.pid), {})
    record.loaded_bytes = {HOST: seat.bytes_on(HOST)}
    record.loaded_source = seat.source_on(HOST)  # what bytes_on counted: planned, measured, or the price
    install(seat)
    await parts.store.aio.seat_upsert(seat_record(seat))
    return seat
