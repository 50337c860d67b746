"""GPU memory as NVML reports it: per device total / free / used, and per compute process used bytes.

All NVML access goes through one small object with pynvml's own call names (``NvmlLike``): the real
``pynvml`` module in production, a fake with the same calls in tests. Nothing here crashes when
there is no driver: the reading then says "no NVIDIA GPU: <reason>" and lists no devices; a number
NVML could not give is ``None`` with a reason, never 0.

Device names follow llama.cpp's ("CUDA0", "CUDA1", ...): CUDA ordinal k is the k-th device that
``CUDA_VISIBLE_DEVICES`` lists (by index or UUID prefix), or NVML index k when it is unset. NVML
enumerates in PCI bus order; CUDA does too when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or the GPUs are
identical (its default "fastest first" may reorder mixed GPUs).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class NvmlLike(Protocol):
    """The pynvml calls fitevict uses. ``NVMLError`` is the library's exception base class."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...  # .total .free .used
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]: ...  # .pid .usedGpuMemory


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One compute process on one GPU. ``used_bytes`` is None when NVML cannot attribute memory."""

    pid: int
    used_bytes: int | None
    source: str = "nvml"
    reason: str = ""


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU as NVML reports it, named as llama.cpp names it."""

    name: str  # "CUDA0"
    index: int  # NVML index
    model: str  # "NVIDIA H200"
    uuid: str
    total_bytes: int
    free_bytes: int
    used_bytes: int
    processes: tuple[GpuProcess, ...] = ()
    processes_reason: str = ""  # why the process list is missing, "" when it was read
    source: str = "nvml"


@dataclass(frozen=True, slots=True)
class GpuReading:
    """All GPUs at one moment. ``reason`` is non-empty ("no NVIDIA GPU: ...") when none could be read."""

    devices: tuple[GpuDevice, ...]
    reason: str = ""

    @property
    def available(self) -> bool:
        return bool(self.devices)

    def device(self, name: str) -> GpuDevice | None:
        for d in self.devices:
            if d.name == name:
                return d
        return None

    def used_by(self, pids: set[int] | frozenset[int]) -> dict[str, int | None]:
        """Bytes the given processes hold per device; None where NVML could not attribute them."""
        out: dict[str, int | None] = {}
        for d in self.devices:
            if d.processes_reason:
                out[d.name] = None
                continue
            total: int | None = 0
            for p in d.processes:
                if p.pid in pids:
                    if p.used_bytes is None:
                        total = None
                        break
                    total += p.used_bytes
            out[d.name] = total
        return out


def _text(v: str | bytes) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _load_pynvml() -> tuple[NvmlLike | None, str]:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError as e:
        return None, f"nvidia-ml-py is not importable ({e})"
    return pynvml, ""  # type: ignore[return-value]


def _visible_order(visible: str | None, count: int, uuids: list[str]) -> tuple[list[int], str]:
    """NVML indices in CUDA ordinal order, and a note when CUDA_VISIBLE_DEVICES cut the list short."""
    if visible is None:
        return list(range(count)), ""
    order: list[int] = []
    for raw in visible.split(","):
        entry = raw.strip()
        if not entry:
            break
        if entry.lstrip("-").isdigit():
            i = int(entry)
            if not 0 <= i < count or i in order:
                return order, f"CUDA_VISIBLE_DEVICES entry {entry!r} is not a device (NVML sees {count}); CUDA stops there"
            order.append(i)
            continue
        hits = [i for i, u in enumerate(uuids) if u.startswith(entry) or u.startswith("GPU-" + entry)]
        if len(hits) != 1 or hits[0] in order:
            return order, f"CUDA_VISIBLE_DEVICES entry {entry!r} matches {len(hits)} device UUIDs; CUDA stops there"
        order.append(hits[0])
    return order, ""


def read_gpus(nvml: NvmlLike | None = None, *, environ: Mapping[str, str] | None = None) -> GpuReading:
    """Read every visible GPU. ``nvml`` defaults to the real pynvml, ``environ`` to os.environ
    (only CUDA_VISIBLE_DEVICES is read from it)."""
    visible = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if nvml is None:
        nvml, why = _load_pynvml()
        if nvml is None:
            return GpuReading((), f"no NVIDIA GPU: {why}")
    err = nvml.NVMLError
    try:
        nvml.nvmlInit()
    except err as e:
        return GpuReading((), f"no NVIDIA GPU: NVML init failed: {e}")
    try:
        try:
            count = int(nvml.nvmlDeviceGetCount())
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
        except err as e:
            return GpuReading((), f"no NVIDIA GPU: NVML could not list devices: {e}")
        if count == 0:
            return GpuReading((), "no NVIDIA GPU: NVML reports 0 devices")
        order, note = _visible_order(visible, count, uuids)
        if not order:
            return GpuReading((), f"no NVIDIA GPU: CUDA_VISIBLE_DEVICES={visible!r} hides all {count} devices. {note}".strip())
        devices: list[GpuDevice] = []
        problems: list[str] = []
        for ordinal, idx in enumerate(order):
            h = handles[idx]
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(h)
                model = _text(nvml.nvmlDeviceGetName(h))
            except err as e:
                problems.append(f"CUDA{ordinal} (NVML index {idx}) unreadable: {e}")
                continue
            procs: tuple[GpuProcess, ...] = ()
            preason = ""
            try:
                procs = tuple(
                    GpuProcess(
                        int(p.pid),
                        None if p.usedGpuMemory is None else int(p.usedGpuMemory),
                        "nvml",
                        "" if p.usedGpuMemory is not None else "NVML does not attribute memory to this process",
                    )
                    for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)
                )
            except err as e:
                preason = f"NVML could not list compute processes: {e}"
            devices.append(
                GpuDevice(
                    name=f"CUDA{ordinal}",
                    index=idx,
                    model=model,
                    uuid=uuids[idx],
                    total_bytes=int(mem.total),
                    free_bytes=int(mem.free),
                    used_bytes=int(mem.used),
                    processes=procs,
                    processes_reason=preason,
                )
            )
        reason = "; ".join(p for p in (note, *problems) if p)
        if not devices:
            return GpuReading((), f"no NVIDIA GPU: {reason}")
        return GpuReading(tuple(devices), reason)
    finally:
        try:
            nvml.nvmlShutdown()
        except err:
            pass  # the reading is complete; a failed shutdown changes nothing we report
