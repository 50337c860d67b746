"""Measuring a seat after its load (``Meter``): the engine's own buffers, process memory, GPU bytes, the engine
overhead.

Reading is I/O (the load log, /proc, NVML); what the readings say of the engine's own overhead is
``overhead_seen``; what a price makes of that overhead is in ``fitevict.prices.overhead``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fitevict.host import procmem
from fitevict.host.devmem import DeviceMeters
from fitevict.pricing.footprint import HOST, DeviceFootprint, Footprint, Term
from fitevict.seat.processes import Processes
from fitevict.seat.running import SeatState


def read_seat(seat: SeatState, engine: Any, nvml: Any, now: float) -> None:
    """Fill ``seat.measured`` (the engine's account of its buffers) and take the reading right after its load: PSS of
    its process tree and each device by its kind (``nvml``: the ``host.devmem.DeviceMeters``, or an NVML-like alone;
    ``SeatState.take_reading``), kept apart as ``load_mem``/``load_bytes`` (what the load record stores and the growth
    rate starts from; the memory sampler's later readings replace the live figure). A unified device is not read
    apart: its buffers are in the PSS (``seat.shared``). A reading that fails says why; it is never 0."""
    try:
        seat.measured = engine.measured_footprint(seat.log_path.read_text(errors="replace"))
    except (OSError, ValueError) as e:
        seat.measured, seat.measured_note = None, f"unavailable, because the load log could not be parsed: {e}"
    if seat.pid is None:
        return
    mem = procmem.read_tree(seat.pid)
    seat.load_reading(now, mem, read_devices(seat, set(mem.pids) or {seat.pid}, nvml))
    if seat.measured is None and not engine.traits.reports_buffers:
        seat.measured = process_footprint(mem)
    seat.load_own_pss = own_share(seat)
    meters = DeviceMeters.of(nvml)
    for dev, (unified, how) in memory_kind_seen(seat).items():
        c = meters.census.device(dev) if meters.census is not None else None
        if c is not None and c.unified_source.startswith("rule:") and c.unified != unified:
            meters.census = meters.census.learned(dev, unified, how)  # the machine's answer beats a rule


def process_footprint(mem: procmem.ProcessMemory) -> Footprint | None:
    """The footprint of a seat whose engine reports no buffers, as its process tree's reading says (source:
    measured): its PSS, committed and mapped, all on the host; None when the reading failed."""
    if mem.committed_bytes is None or mem.mapped_bytes is None:
        return None
    why = "the seat's process tree's PSS right after its load: its engine reports no buffers"
    return Footprint((DeviceFootprint(HOST, model=Term(mem.host_bytes, "measured", why)),),
                     host_mapped_bytes=mem.mapped_bytes, host_committed_bytes=mem.committed_bytes,
                     host_source="measured")


def own_share(seat: SeatState) -> int:
    """The seat's share (PSS) of its binary's shared pages now (``Seat.pages``; 0 without any): they are not its
    own overhead, and the planner counts them once on the seat that carries them."""
    pages = seat.seat.pages
    if pages is None or seat.pid is None:
        return 0
    got = procmem.file_pages(seat.pid, lambda path, _exe: pages.maps(path))
    return got.pss if got is not None else 0


UNIFIED_SHARE = 0.5  # a device's bytes count as in the seat's PSS when its unexplained committed part is this large
UNIFIED_MIN = 8 * 1024 * 1024  # below this on the device, the PSS's noise (overhead, untouched pages) decides nothing


def memory_kind_seen(seat: SeatState) -> dict[str, tuple[bool, str]]:
    """What the reading after its load says of each of its devices: is the device's memory host memory? Its
    committed PSS beyond its host buffers and the engine's overhead holds the device's buffers (unified), or not.
    Only where the engine reported buffers on the device and they are large enough to tell. Pure."""
    if (seat.measured is None or seat.load_mem is None or seat.load_mem.committed_bytes is None
            or seat.overhead is None):  # without the engine's own overhead the PSS beyond its buffers tells nothing
        return {}
    extra = seat.load_mem.committed_bytes - seat.measured.host_committed_bytes - seat.overhead
    out: dict[str, tuple[bool, str]] = {}
    for dev in seat.config.devices:
        n = seat.measured.bytes_on(dev) if seat.measured.device(dev) is not None else 0
        if n >= UNIFIED_MIN:
            unified = extra >= UNIFIED_SHARE * n
            out[dev] = (unified, f"measured: the seat's committed PSS exceeds its host buffers and overhead by "
                                 f"{extra} B against {n} B allocated on {dev}: "
                                 + ("its memory is host memory" if unified else "its memory is its own"))
    return out


def read_devices(seat: SeatState, pids: set[int], nvml: Any) -> dict[str, int | None]:
    """What the seat's processes hold on each of its devices that has memory of its own, each reading's source or
    reason kept in ``seat.device_read``."""
    if not seat.config.devices:
        return {}
    meters = DeviceMeters.of(nvml)
    seat.shared = meters.unified(seat.config.devices)
    got = meters.held_by(pids, [d for d in seat.config.devices if d not in seat.shared])
    seat.device_read.update({d: r.source if r.bytes is not None else r.reason for d, r in got.items()})
    seat.touched = tuple(d for d, r in got.items() if r.touched)
    return {d: r.bytes for d, r in got.items()}


def overhead_seen(seat: SeatState, known: Mapping[str, int] | None = None) -> dict[str, int]:
    """The engine process's own memory per device in this seat at the reading right after its load, beyond the
    buffers its log reports: host, PSS less the buffers, less its share of its binary's shared pages (kept apart,
    ``pricing.pages``) and less the parts of the seat's overhead that scale with its model (its ``overhead`` beyond
    the ``known`` calibrated figure), so that what is left is comparable with the calibrated part; a GPU, NVML's
    bytes for the process (its CUDA context is the difference)."""
    if seat.measured is None:
        return {}
    seen: dict[str, int] = {}
    if seat.load_mem is not None and seat.load_mem.host_bytes is not None:
        scaling = max(0, (seat.overhead or 0) - (known or {}).get(HOST, 0))  # nothing known: nothing to take off
        seen[HOST] = seat.load_mem.host_bytes - seat.load_own_pss - seat.measured.bytes_on(HOST) - scaling
    for dev, n in seat.load_bytes.items():
        if dev == HOST:
            continue
        if seat.measured.device(dev) is not None:
            seen[dev] = n - seat.measured.bytes_on(dev)
    return seen


def mem_json(m: procmem.ProcessMemory | None) -> dict | None:
    if m is None:
        return None
    return {"committed_bytes": m.committed_bytes, "mapped_bytes": m.mapped_bytes, "rss_bytes": m.rss_bytes,
            "source": m.source, "reason": m.reason, "pids": list(m.pids)}



class Meter:
    """``read_seat`` with its three parts: the GPU reader, the clock, and the processes (the engine that parses the
    seat's load log)."""

    def __init__(self, nvml: Any, clock: Callable[[], float], processes: Processes) -> None:
        self.nvml, self.clock, self.processes = nvml, clock, processes

    def read(self, seat: SeatState) -> None:
        read_seat(seat, self.processes.engine_for(seat.entry), self.nvml, self.clock())
