"""The machine's budget, read: how many bytes fitevict's residents may hold, per GPU and in host RAM.

``total`` and ``free`` are measured (NVML; /proc/meminfo MemTotal and MemAvailable). ``held`` is what fitevict's
residents hold right now, counted the way ``free`` counts it: on a GPU the residents' NVML process bytes; on the
host their *committed* bytes (Pss_Anon + Pss_Shmem), because MemAvailable already counts their mapped weights (page
cache) as available. ``reserve`` and ``limit`` come from the config. The records and the rule that turns these into
a budget (``budget = max(0, min(limit, total - reserve - others))``) are pure, in ``fitevict.budget``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from pathlib import Path

from fitevict.budget import Budget, DeviceBudget, Figure, size_field, validated
from fitevict.config.records import BudgetConfig, default
from fitevict.host.nvml import NvmlLike, read_gpus
from fitevict.host.procmem import PROC, read_meminfo
from fitevict.pricing.footprint import HOST
from fitevict.units import format_size

# kept free for the OS, the page cache of everything else and the front door; and on each GPU: the config's defaults
DEFAULT_RAM_RESERVE: int = default(BudgetConfig, "ram_reserve")
DEFAULT_GPU_RESERVE: int = default(BudgetConfig, "gpu_reserve")


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
    host = validated(
        DeviceBudget(
            name=HOST,
            total=Figure(mem.total_bytes, "meminfo MemTotal"),
            free=Figure(mem.available_bytes, "meminfo MemAvailable"),
            reserve=Figure(size_field(ram_reserve, "ram_reserve"), cfg("ram_reserve", ram_reserve)),
            limit=None if ram_limit is None else Figure(size_field(ram_limit, "ram_limit"), cfg("ram_limit", ram_limit)),
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
            validated(
                DeviceBudget(
                    name=g.name,
                    total=Figure(g.total_bytes, f"nvml {g.model}"),
                    free=Figure(g.free_bytes, "nvml"),
                    reserve=Figure(size_field(gpu_reserve, "gpu_reserve"), cfg("gpu_reserve", gpu_reserve)),
                    limit=None
                    if gpu_limit is None
                    else Figure(size_field(gpu_limit, "gpu_limit"), cfg("gpu_limit", gpu_limit)),
                    held=Figure(held.get(g.name, 0), held_source if g.name in held else "nothing held"),
                ),
                "gpu_reserve",
                "gpu_limit",
            )
        )
    return Budget(tuple(devices), tuple(notes))


def budget_from_config(b: Any, nvml: NvmlLike | None = None, *, held: Mapping[str, int] | None = None,
                       held_source: str = "measured residents") -> Budget:
    """The machine now under the config's ``[budget]`` section (a ``BudgetConfig``): the one way every caller
    (the supervisor, ``fitevict serve``'s start check, ``fitevict plan``) turns the config into a Budget."""
    return measure_budget(ram_limit=b.ram_limit, gpu_limit=b.gpu_limit, ram_reserve=b.ram_reserve,
                          gpu_reserve=b.gpu_reserve, nvml=nvml, held=held, held_source=held_source)
