"""Budget records, pure: how many bytes fitevict's residents may hold in total, per GPU and in host RAM.

For each budget device (``"CPU"`` = host RAM, ``"CUDA0"``, ...)::

    others      = max(0, (total - free) - held)          # what processes that are not fitevict's use
    budget      = max(0, min(limit, total - reserve - others))

Every number carries a ``source`` string saying where it came from: measured (``host/budget.py`` reads the machine)
or declared (``Budget.declared``, for tests, benchmarks and plans for another machine). The planner reads these
records and nothing else of the machine.

**Unified memory is counted once.** A device whose memory is host memory (``unified``: lavapipe, an APU, Apple) has
its budget carved out of RAM: every byte placed on it counts against the host budget as well (``charged``), and its
own budget is a limit inside the host's. So the two budgets can never spend the same bytes, and a seat's PSS (which
holds its unified device's buffers) is not counted beside them a second time.
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
    unified: bool = False  # its memory is host memory: what it holds counts against the host budget too
    unified_source: str = ""  # who said so: engine-reported, measured, declared, or a labelled rule

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
            "unified": self.unified,
            "unified_source": self.unified_source,
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


def per_device(value: int | str | Mapping[str, int | str] | None, name: str, fallback: int | str | None
               ) -> int | str | None:
    """A ``gpu_limit`` or ``gpu_reserve`` setting for device ``name``: one size for every device, or the size a
    mapping by device name gives it (``fallback`` for a device it does not name)."""
    if isinstance(value, Mapping):
        return value.get(name, fallback)
    return value


def charged(held: Mapping[str, int], unified: frozenset[str] | tuple[str, ...]) -> dict[str, int]:
    """Bytes per budget device with every unified device's bytes charged to the host as well (see the module doc):
    the one rule for what a placement needs and what a resident holds."""
    out = dict(held)
    extra = sum(n for d, n in held.items() if d in unified and d != HOST)
    if extra:
        out[HOST] = out.get(HOST, 0) + extra
    return out


def _keys(name: str) -> tuple[str, str]:
    return ("ram_reserve", "ram_limit") if name == HOST else ("gpu_reserve", "gpu_limit")


@dataclass(frozen=True, slots=True)
class Budget:
    """A snapshot of every budget device. ``notes`` says what was not measured and why."""

    devices: tuple[DeviceBudget, ...]
    notes: tuple[str, ...] = ()
    # the rpc-server endpoints of its RPC devices (RPC0, RPC1, ...), in order: a placement on any of them passes all
    rpc: tuple[str, ...] = ()

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
        """Every device but the host: the engine's names (CUDA0, Vulkan0, RPC0, ...)."""
        return tuple(d.name for d in self.devices if d.name != HOST)

    @property
    def unified_names(self) -> frozenset[str]:
        """The devices whose memory is host memory (their bytes count against the host budget too)."""
        return frozenset(d.name for d in self.devices if d.unified and d.name != HOST)

    def budget_bytes(self, name: str) -> int:
        """The residents' budget on ``name``; 0 for a device this budget does not have."""
        d = self.device(name)
        return d.budget_bytes if d else 0

    def to_json(self) -> dict:
        return {"devices": [d.to_json() for d in self.devices], "notes": list(self.notes), "rpc": list(self.rpc)}

    @staticmethod
    def declared(spec: Mapping[str, int | str | Mapping[str, int | str]]) -> "Budget":
        """A budget from declared numbers, for tests, benchmarks and dry runs.

        ``{"CPU": "16GiB", "CUDA0": "8GiB"}`` declares totals (all free, no reserve, no limit);
        a mapping per device may give ``total``, ``free``, ``reserve``, ``limit``, ``held``, and ``unified``
        (True: its memory is host memory).
        """
        devices = []
        for name, v in spec.items():
            rk, lk = _keys(name)
            f = dict(v) if isinstance(v, Mapping) else {"total": v}
            unknown = set(f) - {"total", "free", "reserve", "limit", "held", "unified"}
            if unknown or "total" not in f:
                raise BudgetError(
                    f"{name}: declare total (and optionally free, reserve, limit, held, unified); got {sorted(f)}"
                )
            unified = bool(f.get("unified", False)) and name != HOST
            total = size_field(f["total"], f"{name}.total")
            d = DeviceBudget(
                name=name,
                total=Figure(total, "declared"),
                free=Figure(size_field(f.get("free", total), f"{name}.free"), "declared"),
                reserve=Figure(size_field(f.get("reserve", 0), rk), "declared"),
                limit=None if f.get("limit") is None else Figure(size_field(f["limit"], lk), "declared"),
                held=Figure(size_field(f.get("held", 0), f"{name}.held"), "declared"),
                unified=unified,
                unified_source="declared" if unified else "",
            )
            devices.append(validated(d, rk, lk))
        return Budget(tuple(devices))
