"""Yielding memory to other programs: the supervisor's side of :mod:`fitevict.pressure`.

The memory sampler calls :meth:`PressureWatch.check` with every reading of the seats (their committed bytes right
now). The watch measures the machine with those bytes counted as fitevict's, asks the pure rule which idle seats to
stop, has the scheduler stop them (an ``evict`` each), and once their stops are done records one ``pressure``
event: free memory before and after, how much other processes grew since the last calm reading, the largest of
them by PSS, and what was stopped and what was kept because it was in use. While a device is under pressure the
planner sees its reserve raised by the margin (:meth:`planning_budget`), so loads that would not fit what is really
free are refused with the reason, and loads resume by themselves once the other program lets go.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fitevict.budget import Budget
from fitevict.host.budget import budget_from_config
from fitevict.host.procmem import largest_processes
from fitevict.pressure import Idle, Relief, assess, strained
from fitevict.pricing.footprint import HOST
from fitevict.store.records import Event
from fitevict.units import format_size

if TYPE_CHECKING:
    from fitevict.supervisor.core import Supervisor

log = logging.getLogger("fitevict.pressure")
GROWTH_WINDOW = 60.0  # seconds of calm readings that growth is measured against
EXIT_SLACK = 10.0  # seconds beyond engine.stop_grace_seconds that a stopped seat's processes may take to go
HELD_SOURCE = "sampled residents: committed bytes (Pss_Anon + Pss_Shmem) read this tick"


def holdings(seats: Mapping[str, Any], live: Mapping[str, int | None] | None = None
             ) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """What fitevict's seats hold, in total and per seat, counted the way free memory counts it: host committed
    bytes from ``live`` (a reading of this tick, by seat key) where there is one, else the load's measurement; GPU
    bytes from the load's measurement."""
    live = live or {}
    total: dict[str, int] = {}
    per_seat: dict[str, dict[str, int]] = {}
    for key, s in seats.items():
        mine: dict[str, int] = {}
        host = live.get(key)
        if host is None and s.host_mem is not None:
            host = s.host_mem.committed_bytes
        if host is not None:
            mine[HOST] = host
        for dev, n in s.gpu_bytes.items():
            mine[dev] = n
        per_seat[key] = mine
        for dev, n in mine.items():
            total[dev] = total.get(dev, 0) + n
    return total, per_seat


class PressureWatch:
    def __init__(self, sup: "Supervisor") -> None:
        self.sup = sup
        self.under: frozenset[str] = frozenset()
        # device -> calm readings (when, others' bytes) over the last GROWTH_WINDOW seconds: growth is counted from
        # the lowest of them, since a program that grows takes several readings to do it
        self.calm_others: dict[str, deque[tuple[float, int]]] = {}
        self.last: Relief | None = None
        self.events = 0  # pressure events recorded

    @property
    def enabled(self) -> bool:
        return bool(self.sup.config.budget.yield_to_others)

    def margins(self, budget: Budget) -> dict[str, int]:
        return {d.name: int(self.sup.config.budget.pressure_margin) for d in budget.devices}

    def planning_budget(self, budget: Budget) -> Budget:
        """The budget the planner sees: under pressure, a device's reserve is raised by the margin (labelled)."""
        return strained(budget, self.under, self.margins(budget))

    async def check(self, live: Mapping[str, int | None]) -> Relief | None:
        """One reading: returns the relief it decided (None when yielding is off or fitevict is stopping)."""
        sup = self.sup
        if not self.enabled or sup.closed:
            return None
        held, per_seat = holdings(sup.seats, live)
        budget = await asyncio.to_thread(budget_from_config, sup.config.budget, sup.nvml, held=held,
                                         held_source=HELD_SOURCE)
        sched = sup.scheduler
        pending: dict[str, int] = {}
        for key, slot in sched.slots.items():
            if slot.phase.value == "stopping":
                for dev, n in per_seat.get(key, {}).items():
                    pending[dev] = pending.get(dev, 0) + n
        idle = [Idle(s.key, per_seat.get(s.key, dict(s.bytes)), s.priority,
                     s.last_used if s.last_used is not None else (s.ready_at or s.since)) for s in sched.idle()]
        relief = assess(budget, self.margins(budget), self.under, idle, sup.config.policy.eviction, pending)
        entering = relief.under - self.under
        self.under, self.last = relief.under, relief
        now = sup.clock()
        for s in relief.strains:
            if not s.under:
                calm = self.calm_others.setdefault(s.device, deque())
                calm.append((now, s.others))
                while calm and calm[0][0] < now - GROWTH_WINDOW:
                    calm.popleft()
        if relief.victims or entering:
            task = asyncio.get_running_loop().create_task(self._relieve(relief, now), name="fitevict-pressure")
            sup.fx.tasks.add(task)
            task.add_done_callback(sup.fx.tasks.discard)
        return relief

    def _grew(self, relief: Relief) -> dict[str, dict[str, Any]]:
        out = {}
        for s in relief.strains:
            calm = self.calm_others.get(s.device)
            if calm:
                since, low = min(calm, key=lambda c: c[1])
                out[s.device] = {"others_grew_bytes": s.others - low, "since": since}
            else:
                out[s.device] = {"others_grew_bytes": None, "since": None,
                                 "why": "unavailable, because no calm reading was taken before the pressure began"}
        return out

    async def _relieve(self, relief: Relief, detected: float) -> None:
        """Stop the victims, wait until their processes are gone, and record the ``pressure`` event (each stop's
        release is verified and recorded in its own ``evict`` event, which may come later)."""
        sup = self.sup
        grew = self._grew(relief)
        stopping = {}
        for v in relief.victims:
            seat = sup.seats.get(v.key)
            if seat is not None and sup.scheduler.relieve(v.key, _victim_reason(relief, grew)):
                stopping[v.key] = seat
        exclude = {os.getpid(), *(p for s in sup.seats.values() for p in (s.pid, s.pgid) if p)}
        top = await asyncio.to_thread(largest_processes, exclude)
        gone = "every stopped seat's processes exited"
        try:
            await sup.wait_until(lambda: all(sup.seats.get(k) is not s for k, s in stopping.items()),
                                 sup.config.engine.stop_grace_seconds + EXIT_SLACK)
        except TimeoutError:
            gone = "not every stopped seat had exited when this was recorded"
        after = await asyncio.to_thread(sup.budget)
        devices = []
        for s in relief.strains:
            d = after.device(s.device)
            devices.append({**s.to_json(), **grew[s.device],
                            "free_after_bytes": d.free.bytes if d is not None else None,
                            "free_source": d.free.source if d is not None else None})
        self.events += 1
        await sup.record(Event(
            time=sup.clock(), event="pressure", seconds=max(0.0, sup.clock() - detected), reason=relief.reason(),
            host_bytes=sum(v.bytes.get(HOST, 0) for v in relief.victims if v.key in stopping) or None,
            details={"devices": devices, "largest_others": [p.to_json() for p in top],
                     "stopped": [{"model": k, "held": relief_bytes(relief, k)} for k in stopping],
                     "stopped_note": f"{gone}; each release is verified and recorded in its own evict event",
                     "kept_in_use": sorted(k for k in sup.scheduler.slots if k not in stopping),
                     "short_bytes": dict(relief.short), "detected_at": detected, "held_source": HELD_SOURCE,
                     "host_source": f"what the stopped seats held: {HELD_SOURCE}",
                     "others_source": "total - free - held, where free is meminfo MemAvailable or NVML free"}))
        log.warning("%s", relief.reason())


def relief_bytes(relief: Relief, key: str) -> dict[str, int]:
    return next((dict(v.bytes) for v in relief.victims if v.key == key), {})


def _victim_reason(relief: Relief, grew: Mapping[str, Mapping[str, Any]]) -> str:
    parts = []
    for s in relief.strains:
        if not s.under:
            continue
        g = grew[s.device].get("others_grew_bytes")
        parts.append(f"{s.device} free {format_size(s.free)} < reserve {format_size(s.reserve)}"
                     + (f", other processes grew {format_size(g)}" if g else ""))
    return "memory pressure from other programs: " + "; ".join(parts) + "; idle, so it gives its memory back"


__all__ = ["PressureWatch", "holdings"]
