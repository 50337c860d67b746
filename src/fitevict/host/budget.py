"""The machine's budget, read: how many bytes fitevict's residents may hold, per GPU and in host RAM.

``total`` and ``free`` are measured (NVML; /proc/meminfo MemTotal and MemAvailable). The devices are the engine's
(``engines.llama_cpp.census``: the build's ``--list-devices`` with the configured rpc-servers): a CUDA device is read
from NVML, matched by its CUDA ordinal (``CUDA_VISIBLE_DEVICES`` order; seats run with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
so that the engine's ordinal is NVML's PCI order); any other device (Vulkan, RPC, Metal, ...) has the engine-reported
total, and as free what the listing reported less what the residents hold on it now (the listing is taken before any
seat). A unified device keeps the census's word on it (``Budget``'s one-count rule). ``held`` is what fitevict's
residents hold right now, counted the way ``free`` counts it: on a GPU the residents' NVML process bytes; on the
host their *committed* bytes (Pss_Anon + Pss_Shmem), because MemAvailable already counts their mapped weights (page
cache) as available. ``reserve`` and ``limit`` come from the config. The records and the rule that turns these into
a budget (``budget = max(0, min(limit, total - reserve - others))``) are pure, in ``fitevict.budget``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from pathlib import Path

from fitevict.budget import Budget, DeviceBudget, Figure, per_device, size_field, validated
from fitevict.config.records import GPU_RESERVE, BudgetConfig, default
from fitevict.host.nvml import NvmlLike, read_gpus
from fitevict.host.procmem import PROC, read_meminfo
from fitevict.pricing.footprint import HOST
from fitevict.units import format_size

# kept free for the OS, the page cache of everything else and the front door; and on each GPU: the config's defaults
DEFAULT_RAM_RESERVE: int = default(BudgetConfig, "ram_reserve")
DEFAULT_GPU_RESERVE: int = default(BudgetConfig, "gpu_reserve")


def measure_budget(
    ram_limit: int | str | None = None,
    gpu_limit: int | str | Mapping[str, int | str] | None = None,
    ram_reserve: int | str = DEFAULT_RAM_RESERVE,
    gpu_reserve: int | str | Mapping[str, int | str] = DEFAULT_GPU_RESERVE,
    nvml: NvmlLike | None = None,
    *,
    held: Mapping[str, int] | None = None,
    held_source: str = "measured residents",
    meminfo: Path = PROC / "meminfo",
    environ: Mapping[str, str] | None = None,
    census: Any = None,
) -> Budget:
    """Read the machine: host RAM from /proc/meminfo, GPUs from NVML (``nvml``: pynvml or a fake).

    ``gpu_limit`` and ``gpu_reserve`` apply to each device (one size), or per device by name (a mapping).
    ``census`` (an ``engines.llama_cpp.census.Census``) names the engine's devices; None: NVML's alone. ``held`` maps device name to the bytes
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
    if census is not None and census.reason:
        notes.append(f"engine devices {census.reason}")
    listed = {d.name: d for d in census.devices} if census is not None else {}
    seen = set()
    for g in gpus.devices:
        seen.add(g.name)
        c = listed.get(g.name)
        devices.append(_device(g.name, Figure(g.total_bytes, f"nvml {g.model}"), Figure(g.free_bytes, "nvml"),
                               gpu_limit, gpu_reserve, held, held_source,
                               (c.unified, c.unified_source) if c is not None else (False, "rule: NVML device")))
    for c in listed.values():
        if c.name in seen or c.backend == "CUDA" and gpus.available:
            continue  # a CUDA device NVML does not see under that ordinal is not there for its seats
        mine = held.get(c.name, 0)
        devices.append(_device(
            c.name, Figure(c.device.total_bytes, f"{c.device.source}: {c.device.description}"),
            Figure(max(0, c.device.free_bytes - mine), "engine-reported free at listing, less what residents hold now"),
            gpu_limit, gpu_reserve, held, held_source, (c.unified, c.unified_source)))
    named = set(gpu_limit) if isinstance(gpu_limit, Mapping) else set()
    missing = sorted(named - {d.name for d in devices})
    if missing:
        notes.append(f"gpu_limit names {', '.join(missing)}, which this machine's engine does not list")
    return Budget(tuple(devices), tuple(notes), census.rpc if census is not None else ())


def _device(name: str, total: Figure, free: Figure, gpu_limit: Any, gpu_reserve: Any, held: Mapping[str, int],
            held_source: str, unified: tuple[bool, str]) -> DeviceBudget:
    cfg = lambda key, v: f"config {key}={v if isinstance(v, str) else format_size(v)}"  # noqa: E731
    limit = per_device(gpu_limit, name, None)
    reserve = per_device(gpu_reserve, name, GPU_RESERVE)
    assert reserve is not None
    return validated(
        DeviceBudget(
            name=name, total=total, free=Figure(min(free.bytes, total.bytes), free.source),
            reserve=Figure(size_field(reserve, "gpu_reserve"), cfg("gpu_reserve", reserve)),
            limit=None if limit is None else Figure(size_field(limit, "gpu_limit"), cfg("gpu_limit", limit)),
            held=Figure(held.get(name, 0), held_source if name in held else "nothing held"),
            unified=unified[0], unified_source=unified[1],
        ),
        "gpu_reserve",
        "gpu_limit",
    )


def budget_from_config(b: Any, nvml: NvmlLike | None = None, *, held: Mapping[str, int] | None = None,
                       held_source: str = "measured residents", census: Any = None) -> Budget:
    """The machine now under the config's ``[budget]`` section (a ``BudgetConfig``): the one way every caller
    (the supervisor, ``fitevict serve``'s start check, ``fitevict plan``) turns the config into a Budget."""
    return measure_budget(ram_limit=b.ram_limit, gpu_limit=b.gpu_limit, ram_reserve=b.ram_reserve,
                          gpu_reserve=b.gpu_reserve, nvml=nvml, held=held, held_source=held_source, census=census)
