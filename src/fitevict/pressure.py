"""Memory pressure from other programs, pure: when to give memory back, and which idle seats give it.

A device is **under pressure** when its free memory falls below its reserve: other programs (or the residents
themselves) took what the budget promised to keep free. The rule has a margin, so that a reading at the edge does
not evict and reload in turn (hysteresis)::

    enter    free < reserve
    leave    free >= reserve + margin
    target   free + bytes already being released >= reserve + margin

While a device is under pressure its reserve counts ``reserve + margin`` for planning too (:func:`strained`), so a
load admitted in the meantime cannot push it straight back under. Victims are idle seats only (nothing in flight,
nothing queued for them, not pinned, not loading), in the order a load's evictions take (the eviction policy's,
``planner.eviction``: GreedyDual-Size ``cost`` or least recently used ``lru``, ties by the most bytes on the devices in
need), and only seats that hold bytes on a device in need. A seat **outgrowing its price** (:func:`outgrowth`: its
latest reading exceeds its price by more than ``budget.outgrow_margin``) goes before every healthy one: it holds more
than it was admitted for, and may still be growing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from fitevict.budget import Budget, DeviceBudget, Figure
from fitevict.planner.eviction import eviction_policy
from fitevict.units import format_size


@dataclass(frozen=True, slots=True)
class Idle:
    """A seat that may be stopped to relieve pressure, with what it holds per device (measured where known)."""

    key: str
    bytes: Mapping[str, int]
    priority: float  # GreedyDual-Size H: lower goes first under ``cost``
    last_used: float  # lower goes first under ``lru``
    outgrowing: bool = False  # its reading exceeded its price by more than the bound: it goes before healthy ones


@dataclass(frozen=True, slots=True)
class Outgrowth:
    """A seat holding more on ``device`` than it was priced at, by more than ``bound``: the figures that say so."""

    device: str
    reading: int  # the latest reading (PSS of its process tree, or NVML)
    price: int  # what it was priced and admitted at on this device
    bound: int  # budget.outgrow_margin
    base: int | None  # the reading right after its load
    seconds: float | None  # from that reading to this one

    @property
    def over(self) -> int:
        return self.reading - self.price

    @property
    def rate(self) -> float | None:
        """Bytes per second it grew since the reading after its load (None without that reading or time)."""
        if self.base is None or not self.seconds or self.seconds <= 0:
            return None
        return (self.reading - self.base) / self.seconds

    def reason(self, key: str) -> str:
        rate = "" if self.rate is None else f", growing {format_size(int(self.rate))}/s since its load"
        return (f"{key} outgrew its price on {self.device}: read {format_size(self.reading)} against "
                f"{format_size(self.price)} priced, {format_size(self.over)} over (bound "
                f"{format_size(self.bound)}, budget.outgrow_margin){rate}")

    def to_json(self) -> dict:
        return {"device": self.device, "reading_bytes": self.reading, "price_bytes": self.price,
                "over_bytes": self.over, "bound_bytes": self.bound, "load_reading_bytes": self.base,
                "seconds_since_load_reading": self.seconds, "growth_bytes_per_second": self.rate}


def outgrowth(device: str, reading: int | None, price: int, bound: int, base: int | None = None,
              seconds: float | None = None) -> Outgrowth | None:
    """The seat outgrows its price on ``device`` when its reading exceeds the price by more than ``bound``."""
    if reading is None or reading - price <= bound:
        return None
    return Outgrowth(device, reading, price, bound, base, seconds)


@dataclass(frozen=True, slots=True)
class Strain:
    """One device's reading against its reserve."""

    device: str
    free: int
    reserve: int
    margin: int
    held: int  # what fitevict's residents hold there, counted the way ``free`` counts it
    others: int  # what other processes hold (total - free - held)
    pending: int  # bytes of seats already stopping: on their way back
    under: bool  # under pressure after this reading (with the hysteresis)

    @property
    def need(self) -> int:
        """Bytes still to free to reach ``reserve + margin`` (0 when nothing needs to go)."""
        return max(0, self.reserve + self.margin - self.free - self.pending) if self.under else 0

    def to_json(self) -> dict:
        return {"device": self.device, "free_bytes": self.free, "reserve_bytes": self.reserve,
                "margin_bytes": self.margin, "held_bytes": self.held, "others_bytes": self.others,
                "pending_bytes": self.pending, "under": self.under, "need_bytes": self.need}


@dataclass(frozen=True, slots=True)
class Relief:
    """What one reading decides: each device's strain, the seats to stop (in order), and what stays short."""

    strains: tuple[Strain, ...]
    victims: tuple[Idle, ...]
    short: Mapping[str, int]  # bytes a device still needs after every victim (nothing idle left to stop)

    @property
    def under(self) -> frozenset[str]:
        return frozenset(s.device for s in self.strains if s.under)

    def strain(self, device: str) -> Strain | None:
        return next((s for s in self.strains if s.device == device), None)

    def reason(self) -> str:
        """One line: which devices are short, by how much, and what is being done."""
        parts = [f"{s.device} free {format_size(s.free)} < reserve {format_size(s.reserve)} "
                 f"(other processes hold {format_size(s.others)})" for s in self.strains if s.under]
        head = "memory pressure: " + "; ".join(parts) if parts else "no memory pressure"
        if self.victims:
            head += "; stopping idle " + ", ".join(
                f"{v.key} (outgrowing its price)" if v.outgrowing else v.key for v in self.victims)
        if self.short:
            head += "; still short " + ", ".join(f"{d} {format_size(n)}" for d, n in self.short.items()) + \
                    " with nothing idle left to stop"
        return head


def strain(d: DeviceBudget, margin: int, was_under: bool, pending: int = 0) -> Strain:
    """One device's strain. ``was_under``: it was under pressure at the last reading (the hysteresis)."""
    free, reserve = d.free.bytes, d.reserve.bytes
    under = free < reserve + margin if was_under else free < reserve
    return Strain(d.name, free, reserve, margin, d.held.bytes, d.others_bytes, pending, under)


def assess(budget: Budget, margin: Mapping[str, int], was_under: frozenset[str], idle: Sequence[Idle],
           eviction: str, pending: Mapping[str, int] | None = None) -> Relief:
    """The relief for one reading: every device's strain, and the idle seats to stop until each device in need
    is back at ``reserve + margin`` (counting what seats already stopping will give back)."""
    pending = pending or {}
    strains = tuple(strain(d, margin.get(d.name, 0), d.name in was_under, pending.get(d.name, 0))
                    for d in budget.devices)
    need = {s.device: s.need for s in strains if s.need > 0}
    victims: list[Idle] = []
    for cand in eviction_policy(eviction).order(idle, need):
        if not need:
            break
        if not any(cand.bytes.get(dev, 0) > 0 for dev in need):
            continue
        victims.append(cand)
        for dev in list(need):
            need[dev] -= cand.bytes.get(dev, 0)
            if need[dev] <= 0:
                del need[dev]
    return Relief(strains, tuple(victims), need)


def strained(budget: Budget, under: frozenset[str], margin: Mapping[str, int]) -> Budget:
    """The budget as the planner sees it while devices are under pressure: their reserve raised by the margin,
    labelled so, so that a load admitted now does not push them straight back under."""
    if not under:
        return budget
    devices = tuple(
        replace(d, reserve=Figure(d.reserve.bytes + margin.get(d.name, 0),
                                  f"{d.reserve.source} + budget.pressure_margin (under memory pressure)"))
        if d.name in under and d.reserve.bytes + margin.get(d.name, 0) < d.total.bytes else d
        for d in budget.devices)
    return Budget(devices, budget.notes, budget.rpc)


__all__ = ["Idle", "Outgrowth", "Relief", "Strain", "assess", "outgrowth", "strain", "strained"]
