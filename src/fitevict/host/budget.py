"""Budgets: how many bytes fitevict's residents may hold in total, per GPU and in host RAM.

For each budget device (``"CPU"`` = host RAM, ``"CUDA0"``, ...)::

    others      = max(0, (total - free) - held)          # what processes that are not fitevict's use
    budget      = max(0, min(limit, total - reserve - others))

``total`` and ``free`` are measured (NVML; /proc/meminfo MemTotal and MemAvailable) or declared.
``held`` is what fitevict's residents hold right now, counted the way ``free`` counts it: on a GPU the
residents' NVML process bytes; on the host their *committed* bytes (Pss_Anon + Pss_Shmem), because
MemAvailable already counts their mapped weights (page cache) as available.
``reserve`` is kept free for everything else; ``limit`` (optional ceiling: ``ram_limit``,
``gpu_limit``) caps what fitevict may hold in total, whatever else is free.

``budget_bytes`` is the most the residents may hold together. The residents' own bytes are *not*
subtracted here -- the planner subtracts them (host: mapped + committed), so one snapshot serves every
plan. Every number carries a ``source`` string saying where it came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from pathlib import Path

from fitevict.config.records import BudgetConfig, default
from fitevict.host.nvml import NvmlLike, read_gpus
from fitevict.host.procmem import PROC, read_meminfo
from fitevict.pricing.footprint import HOST
from fitevict.units import GiB, SizeError, format_size, parse_size

# kept free for the OS, the page cache of everything else and the front door; and on each GPU: the config's defaults
DEFAULT_RAM_RESERVE: int = default(BudgetConfig, "ram_reserve")
DEFAULT_GPU_RESERVE: int = default(BudgetConfig, "gpu_reserve")


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


def _validate(d: DeviceBudget, reserve_key: str, limit_key: str) -> DeviceBudget:
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


def _size(value: int | str, key: str) -> int:
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
            total = _size(f["total"], f"{name}.total")
            d = DeviceBudget(
                name=name,
                total=Figure(total, "declared"),
                free=Figure(_size(f.get("free", total), f"{name}.free"), "declared"),
                reserve=Figure(_size(f.get("reserve", 0), rk), "declared"),
                limit=None if f.get("limit") is None else Figure(_size(f["limit"], lk), "declared"),
                held=Figure(_size(f.get("held", 0), f"{name}.held"), "declared"),
            )
            devices.append(_validate(d, rk, lk))
        return Budget(tuple(devices))


def measure_budget(
    ram_limit: int | str | None = None,
    gpu_limit: int | str | None = None,
    ram_reserve: int | str = DEFAULT_RAM_RESERVE,
    gpu_reserve: int | str = DEFAULT_GPU_RESERVE,
    nvml: NvmlLike | None = None,
    *,
    held: Mapping[str, int] | None = None,
    held_source: str = "measured residents",
    meminfo: Path = PROC / "meminfo",
    environ: Mapping[str, str] | None = None,
) -> Budget:
    """Read the machine: host RAM from /proc/meminfo, GPUs from NVML (``nvml``: pynvml or a fake).

    ``gpu_limit`` and ``gpu_reserve`` apply to each GPU. ``held`` maps device name to the bytes
    fitevict's residents hold there now (host: committed bytes), so that they are not counted as
    someone else's. With no GPU the budget is host-only and ``notes`` says why.
    Raises BudgetError for settings that cannot hold, HostMemoryError when meminfo is unreadable.
    """
    held = dict(held or {})
    cfg = lambda key, v: f"config {key}={v if isinstance(v, str) else format_size(v)}"  # noqa: E731
    mem = read_meminfo(meminfo)
    host = _validate(
        DeviceBudget(
            name=HOST,
            total=Figure(mem.total_bytes, "meminfo MemTotal"),
            free=Figure(mem.available_bytes, "meminfo MemAvailable"),
            reserve=Figure(_size(ram_reserve, "ram_reserve"), cfg("ram_reserve", ram_reserve)),
            limit=None if ram_limit is None else Figure(_size(ram_limit, "ram_limit"), cfg("ram_limit", ram_limit)),
            held=Figure(held.get(HOST, 0), held_source if HOST in held else "nothing held"),
        ),
        "ram_reserve",
        "ram_limit",
    )
    devices = [host]
    notes: list[str] = []
    gpus = read_gpus(nvml, environ=environ)
    if gpus.reason:
        notes.append(gpus.reason)
    for g in gpus.devices:
        devices.append(
            _validate(
                DeviceBudget(
                    name=g.name,
                    total=Figure(g.total_bytes, f"nvml {g.model}"),
                    free=Figure(g.free_bytes, "nvml"),
                    reserve=Figure(_size(gpu_reserve, "gpu_reserve"), cfg("gpu_reserve", gpu_reserve)),
                    limit=None
                    if gpu_limit is None
                    else Figure(_size(gpu_limit, "gpu_limit"), cfg("gpu_limit", gpu_limit)),
                    held=Figure(held.get(g.name, 0), held_source if g.name in held else "nothing held"),
                ),
                "gpu_reserve",
                "gpu_limit",
            )
        )
    return Budget(tuple(devices), tuple(notes))


def budget_from_config(b: Any, nvml: NvmlLike | None = None, *, held: Mapping[str, int] | None = None) -> Budget:
    """The machine now under the config's ``[budget]`` section (a ``BudgetConfig``): the one way every caller
    (the supervisor, ``fitevict serve``'s start check, ``fitevict plan``) turns the config into a Budget."""
    return measure_budget(ram_limit=b.ram_limit, gpu_limit=b.gpu_limit, ram_reserve=b.ram_reserve,
                          gpu_reserve=b.gpu_reserve, nvml=nvml, held=held)
