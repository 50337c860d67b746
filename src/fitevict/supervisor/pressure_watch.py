"""Yielding memory to other programs: the supervisor's side of :mod:`fitevict.pressure`.

The memory sampler calls ``pressure_relief.check_pressure`` with every reading of the seats (their committed bytes right
now). The watch measures the machine with those bytes counted as fitevict's, asks the pure rule which idle seats to
stop, has the scheduler stop them (an ``evict`` each), and once their stops are done records one ``pressure``
event: free memory before and after, how much other processes grew since the last calm reading, the largest of
them by PSS, and what was stopped and what was kept because it was in use. While a device is under pressure the
planner sees its reserve raised by the margin (:meth:`planning_budget`), so loads that would not fit what is really
free are refused with the reason, and loads resume by themselves once the other program lets go.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from fitevict.budget import Budget
from fitevict.config import Config
from fitevict.pressure import Relief, strained
from fitevict.pricing.footprint import HOST

GROWTH_WINDOW = 60.0  # seconds of calm readings that growth is measured against
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
    def __init__(self, config: Config) -> None:
        self.config = config
        self.under: frozenset[str] = frozenset()
        # device -> calm readings (when, others' bytes) over the last GROWTH_WINDOW seconds: growth is counted from
        # the lowest of them, since a program that grows takes several readings to do it
        self.calm_others: dict[str, deque[tuple[float, int]]] = {}
        self.last: Relief | None = None
        self.events = 0  # pressure events recorded

    @property
    def enabled(self) -> bool:
        return bool(self.config.budget.yield_to_others)

    def margins(self, budget: Budget) -> dict[str, int]:
        return {d.name: int(self.config.budget.pressure_margin) for d in budget.devices}

    def planning_budget(self, budget: Budget) -> Budget:
        """The budget the planner sees: under pressure, a device's reserve is raised by the margin (labelled)."""
        return strained(budget, self.under, self.margins(budget))

    def observe(self, relief: Relief, now: float) -> bool:
        """Take the pure rule's answer for this reading; True when it asks for action (victims, or a device that
        just came under pressure). Calm readings are kept for the growth figure."""
        entering = relief.under - self.under
        self.under, self.last = relief.under, relief
        for s in relief.strains:
            if not s.under:
                calm = self.calm_others.setdefault(s.device, deque())
                calm.append((now, s.others))
                while calm and calm[0][0] < now - GROWTH_WINDOW:
                    calm.popleft()
        return bool(relief.victims or entering)

    def grew(self, relief: Relief) -> dict[str, dict[str, Any]]:
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


__all__ = ["GROWTH_WINDOW", "HELD_SOURCE", "PressureWatch", "holdings"]
