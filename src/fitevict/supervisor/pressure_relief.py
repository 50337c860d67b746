"""Acting on memory pressure from other programs (the rule is :mod:`fitevict.pressure`, the watch's state
:mod:`fitevict.supervisor.pressure_watch`): one reading of the seats in, the idle victims stopped through the scheduler,
and one ``pressure`` event once their processes are gone."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from typing import Any

from fitevict.host.budget import budget_from_config
from fitevict.host.procmem import largest_processes
from fitevict.pressure import Idle, Relief, assess
from fitevict.pricing.footprint import HOST
from fitevict.store.records import Event
from fitevict.supervisor.pressure_watch import HELD_SOURCE, holdings
from fitevict.schedule.seats import SeatStatus
from fitevict.supervisor.ports import Ports
from fitevict.units import format_size

log = logging.getLogger("fitevict.pressure")
EXIT_SLACK = 10.0  # seconds beyond engine.stop_grace_seconds that a stopped seat's processes may take to go


async def check_pressure(parts: Ports, live: Mapping[str, int | None]) -> Relief | None:
    """One reading: returns the relief it decided (None when yielding is off or fitevict is stopping)."""
    watch = parts.pressure
    if not watch.enabled or parts.desk.closed:
        return None
    held, per_seat = holdings(parts.seats, live)
    budget = await asyncio.to_thread(budget_from_config, parts.config.budget, parts.nvml, held=held,
                                     held_source=HELD_SOURCE, census=parts.meters.census)
    sched = parts.scheduler
    pending: dict[str, int] = {}
    for key, record in sched.seats.items():
        if record.status is SeatStatus.STOPPING:
            for dev, n in per_seat.get(key, {}).items():
                pending[dev] = pending.get(dev, 0) + n
    idle = [Idle(s.key, per_seat.get(s.key, dict(s.bytes)), s.priority,
                 s.last_used if s.last_used is not None else (s.ready_at or s.since), _outgrowing(parts, s.key))
            for s in sched.idle()]
    relief = assess(budget, watch.margins(budget), watch.under, idle, parts.config.policy.eviction, pending)
    now = parts.clock()
    if watch.observe(relief, now):
        parts.spawn(_relieve(parts, relief, now), "fitevict-pressure")
    return relief


async def _relieve(parts: Ports, relief: Relief, detected: float) -> None:
    """Stop the victims, wait until their processes are gone, and record the ``pressure`` event (each stop's
    release is verified and recorded in its own ``evict`` event, which may come later)."""
    grew = parts.pressure.grew(relief)
    stopping = {}
    for v in relief.victims:
        seat = parts.seats.get(v.key)
        if seat is not None and parts.scheduler.relieve(v.key, _victim_reason(relief, grew, v)):
            stopping[v.key] = seat
    exclude = {os.getpid(), *(p for s in parts.seats.values() for p in (s.pid, s.pgid) if p)}
    top = await asyncio.to_thread(largest_processes, exclude)
    gone = "every stopped seat's processes exited"
    try:
        await parts.history.wait_until(lambda: all(parts.seats.get(k) is not s for k, s in stopping.items()),
                                     parts.config.engine.stop_grace_seconds + EXIT_SLACK)
    except TimeoutError:
        gone = "not every stopped seat had exited when this was recorded"
    after = await asyncio.to_thread(parts.planning.budget)
    devices = []
    for s in relief.strains:
        d = after.device(s.device)
        devices.append({**s.to_json(), **grew[s.device],
                        "free_after_bytes": d.free.bytes if d is not None else None,
                        "free_source": d.free.source if d is not None else None})
    parts.pressure.events += 1
    await parts.history.record(Event(
        time=parts.clock(), event="pressure", seconds=max(0.0, parts.clock() - detected), reason=relief.reason(),
        host_bytes=sum(v.bytes.get(HOST, 0) for v in relief.victims if v.key in stopping) or None,
        details={"devices": devices, "largest_others": [p.to_json() for p in top],
                 "stopped": [{"model": k, "held": relief_bytes(relief, k)} for k in stopping],
                 "stopped_note": f"{gone}; each release is verified and recorded in its own evict event",
                 "kept_in_use": sorted(k for k in parts.scheduler.seats if k not in stopping),
                 "short_bytes": dict(relief.short), "detected_at": detected, "held_source": HELD_SOURCE,
                 "host_source": f"what the stopped seats held: {HELD_SOURCE}",
                 "others_source": "total - free - held, where free is meminfo MemAvailable or NVML free"}))
    log.warning("%s", relief.reason())


def relief_bytes(relief: Relief, key: str) -> dict[str, int]:
    return next((dict(v.bytes) for v in relief.victims if v.key == key), {})


def _outgrowing(parts: Ports, key: str) -> bool:
    seat = parts.seats.get(key)
    return seat is not None and seat.outgrowing


def _victim_reason(relief: Relief, grew: Mapping[str, Mapping[str, Any]], victim: Idle) -> str:
    parts = []
    for s in relief.strains:
        if not s.under:
            continue
        g = grew[s.device].get("others_grew_bytes")
        parts.append(f"{s.device} free {format_size(s.free)} < reserve {format_size(s.reserve)}"
                     + (f", other processes grew {format_size(g)}" if g else ""))
    why = ("idle and outgrowing its price (its outgrew event), so it goes before every healthy seat"
           if victim.outgrowing else "idle, so it gives its memory back")
    return "memory pressure from other programs: " + "; ".join(parts) + "; " + why


__all__ = ["EXIT_SLACK", "check_pressure"]
