"""Budget records, pure: how many bytes fitevict's residents may hold in total, per GPU and in host RAM.

For each budget device (``"CPU"`` = host RAM, ``"CUDA0"``, ...)::

    others      = max(0, (total - free) - held)          # what processes that are not fitevict's use
    budget      = max(0, min(limit, total - reserve - others))

Every number carries a ``source`` string saying where it came from: measured (``host/budget.py`` reads the machine)
or declared (``Budget.declared``, for tests, benchmarks and plans for another machine). The planner reads these
records and nothing else of the machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fitevict.pricing.footprint import HOST
from fitevict.units import SizeError, format_size, parse_size


class BudgetError(ValueError):
    """A budget setting that cannot hold: names the key, its value, and what it was checked against."""


@dataclass(frozen=True, slots=True)
class Figure:
    """One number with where it came from ("meminfo MemTotal", "nvml", "config ram_limit=8GiB", "declared")."""

    bytes: int
    source: str


@dataclass(frozen=True, slots=True)
class DeviceBudget:
    """One device's budget inputs; ``budget_bytes`` derives from them (see the module docstring)."""

    name: str
    total: Figure
    free: Figure
    reserve: Figure
    limit: Figure | None = None  # None = no ceiling
    held: Figure = Figure(0, "nothing held")

    @property
    def others_bytes(self) -> int:
        """Bytes used by processes that are not fitevict's residents."""
        return max(0, self.total.bytes - self.free.bytes - self.held.bytes)

    @property
    def budget_bytes(self) -> int:
        """The most fitevict's residents may hold on this device, all of them together."""
        room = self.total.bytes - self.reserve.bytes - self.others_bytes
        if self.limit is not None:
            room = min(room, self.limit.bytes)
        return max(0, room)

    @property
    def budget_source(self) -> str:
        binding = "limit" if self.limit is not None and self.limit.bytes <= (
            self.total.bytes - self.reserve.bytes - self.others_bytes
        ) else "total - reserve - others"
        return f"derived: {binding}"

    def to_json(self) -> dict:
        fig = lambda f: None if f is None else {"bytes": f.bytes, "source": f.source}  # noqa: E731
        return {
            "name": self.name,
            "total": fig(self.total),
            "free": fig(self.free),
            "reserve": fig(self.reserve),
            "limit": fig(self.limit),
            "held": fig(self.held),
            "others_bytes": self.others_bytes,
            "budget_bytes": self.budget_bytes,
            "budget_source": self.budget_source,
        }


def validated(d: DeviceBudget, reserve_key: str, limit_key: str) -> DeviceBudget:
    total = d.total.bytes
    if total <= 0:
        raise BudgetError(f"{d.name}: total {total} B ({d.total.source}) must be positive")
    if d.reserve.bytes < 0:
        raise BudgetError(f"{reserve_key}={d.reserve.bytes} B is negative; a reserve must be 0 or more bytes")
    if d.reserve.bytes >= total:
        raise BudgetError(
            f"{reserve_key}={format_size(d.reserve.bytes)} is not below {d.name}'s total "
            f"{format_size(total)} ({d.total.source}); nothing would be left to load into. "
            f"Set {reserve_key} below {format_size(total)}"
        )
    if d.limit is not None:
        if d.limit.bytes < 0:
            raise BudgetError(f"{limit_key}={d.limit.bytes} B is negative; a limit must be 0 or more bytes")
        if d.limit.bytes > total:
            raise BudgetError(
                f"{limit_key}={format_size(d.limit.bytes)} is above {d.name}'s total {format_size(total)} "
                f"({d.total.source}); set {limit_key} to at most {format_size(total)} or leave it unset"
            )
    if not 0 <= d.free.bytes <= total:
        raise BudgetError(
            f"{d.name}: free {format_size(d.free.bytes)} ({d.free.source}) is outside 0..total {format_size(total)}"
        )
    if d.held.bytes < 0:
        raise BudgetError(f"{d.name}: held {d.held.bytes} B ({d.held.source}) is negative")
    return d


def size_field(value: int | str, key: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        raise BudgetError(f"{key}={value} B is negative; it must be 0 or more bytes")
    try:
        return parse_size(value, name=key)
    except SizeError as e:
        raise BudgetError(str(e)) from e


def _keys(name: str) -> tuple[str, str]:
    return ("ram_reserve", "ram_limit") if name == HOST else ("gpu_reserve", "gpu_limit")


@dataclass(frozen=True, slots=True)
class Budget:
    """A snapshot of every budget device. ``notes`` says what was not measured and why."""

    devices: tuple[DeviceBudget, ...]
    notes: tuple[str, ...] = ()

    def device(self, name: str) -> DeviceBudget | None:
        for d in self.devices:
            if d.name == name:
                return d
        return None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)

    @property
    def gpu_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices if d.name != HOST)

    def budget_bytes(self, name: str) -> int:
        """The residents' budget on ``name``; 0 for a device this budget does not have."""
        d = self.device(name)
        return d.budget_bytes if d else 0

    def to_json(self) -> dict:
        return {"devices": [d.to_json() for d in self.devices], "notes": list(self.notes)}

    @staticmethod
    def declared(spec: Mapping[str, int | str | Mapping[str, int | str]]) -> "Budget":
        """A budget from declared numbers, for tests, benchmarks and dry runs.

        ``{"CPU": "16GiB", "CUDA0": "8GiB"}`` declares totals (all free, no reserve, no limit);
        a mapping per device may give ``total``, ``free``, ``reserve``, ``limit``, ``held``.
        """
        devices = []
        for name, v in spec.items():
            rk, lk = _keys(name)
            f = dict(v) if isinstance(v, Mapping) else {"total": v}
            unknown = set(f) - {"total", "free", "reserve", "limit", "held"}
            if unknown or "total" not in f:
                raise BudgetError(
                    f"{name}: declare total (and optionally free, reserve, limit, held); got {sorted(f)}"
                )
            total = size_field(f["total"], f"{name}.total")
            d = DeviceBudget(
                name=name,
                total=Figure(total, "declared"),
                free=Figure(size_field(f.get("free", total), f"{name}.free"), "declared"),
                reserve=Figure(size_field(f.get("reserve", 0), rk), "declared"),
                limit=None if f.get("limit") is None else Figure(size_field(f["limit"], lk), "declared"),
                held=Figure(size_field(f.get("held", 0), f"{name}.held"), "declared"),
            )
            devices.append(validated(d, rk, lk))
        return Budget(tuple(devices))
