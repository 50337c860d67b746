"""Device memory, measured by the kind of device: one small protocol (``DeviceReader``), one reader per kind, picked
by a registry (``reader_for``) from the engine's device record.

    NVIDIA (CUDA)            NVML: the process's bytes; the device's free memory
    amdgpu, i915, xe, ...    DRM fdinfo of the seat's processes (``host.fdinfo``): the process's bytes only
    RPC                      the rpc-server process's own PSS growth over its idle baseline (its pid: the one that
                             listens on the endpoint, ``host.procnet``; a remote endpoint cannot be read from here)
    unified (lavapipe, APU)  nothing apart: the device's buffers are host memory, already in the seat's PSS; the
                             engine's allocated figure stands for the device (counted once: ``fitevict.budget``)
    anything else            unavailable, because ...: the engine's allocated figure counts instead

Each reading is bytes with a source, or None with "unavailable, because ...", never 0 for a failed read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fitevict.host import procmem
from fitevict.host.fdinfo import SOURCE as FDINFO_SOURCE
from fitevict.host.fdinfo import drm_devices, read_drm_usage
from fitevict.host.nvml import read_gpus
from fitevict.host.procnet import client_pids, listening_pid


@dataclass(frozen=True, slots=True)
class DeviceBytes:
    """One figure of one device: ``bytes`` with its ``source``, or None with ``reason``."""

    bytes: int | None
    source: str = ""
    reason: str = ""
    # the reading counts pages touched so far (a process's PSS): a buffer not yet written is not in it, so it grows
    # as the seat's context fills; False where the driver counts what was allocated (NVML, DRM)
    touched: bool = False


class DeviceReader(Protocol):
    """Reads one device. ``held_by``: what these processes hold there; ``free``: bytes no process holds (what a
    release is verified against), where the kind of device can say."""

    name: str
    kind: str

    def held_by(self, pids: frozenset[int]) -> DeviceBytes: ...
    def free(self) -> DeviceBytes: ...


def _unavailable(why: str) -> DeviceBytes:
    return DeviceBytes(None, "", why if why.startswith("unavailable") else f"unavailable, because {why}")


@dataclass
class NvmlReader:
    name: str
    nvml: Any = None
    kind: str = "nvml"

    def held_by(self, pids: frozenset[int]) -> DeviceBytes:
        gpus = read_gpus(self.nvml)
        if gpus.device(self.name) is None:
            return _unavailable(gpus.reason or f"NVML does not see {self.name}")
        n = gpus.used_by(pids).get(self.name)
        return DeviceBytes(n, "measured: NVML bytes of the process") if n is not None else _unavailable(
            "NVML does not attribute memory to the seat")

    def free(self) -> DeviceBytes:
        d = read_gpus(self.nvml).device(self.name)
        return DeviceBytes(d.free_bytes, "measured: NVML free") if d is not None else _unavailable(
            f"NVML does not see {self.name}")


@dataclass
class FdinfoReader:
    """A DRM device without NVML. Its processes' fdinfo names the device by PCI address; the engine's listing does
    not, so the seat's one DRM device is this one (several: unavailable, which one is not known)."""

    name: str
    kind: str = "drm-fdinfo"

    def held_by(self, pids: frozenset[int]) -> DeviceBytes:
        use = read_drm_usage(pids)
        if use.reason:
            return _unavailable(use.reason)
        if len(use.device_bytes) > 1:
            return _unavailable(f"the seat uses {len(use.device_bytes)} DRM devices "
                                f"({', '.join(sorted(use.device_bytes))}) and the engine's listing does not say "
                                f"which one is {self.name}")
        if not use.device_bytes:
            return _unavailable("the seat's processes hold no DRM client")
        (pdev, n), = use.device_bytes.items()
        return DeviceBytes(n, f"{FDINFO_SOURCE}, {use.drivers[pdev]} {pdev}")

    def free(self) -> DeviceBytes:
        return _unavailable("DRM fdinfo is per process: the device's free memory is not in it")


@dataclass
class RpcServerReader:
    """An RPC device: its rpc-server's PSS over its idle baseline (taken when the reader was made, before a seat)."""

    name: str
    endpoint: str
    total_bytes: int
    pid: int | None = None
    baseline: int | None = None
    reason: str = ""
    kind: str = "rpc-server-pss"

    @classmethod
    def of(cls, name: str, endpoint: str, total_bytes: int, pid: int | None = None) -> RpcServerReader:
        reason = ""
        if pid is None:
            found = listening_pid(endpoint)
            pid, reason = found.pid, found.reason
        r = cls(name, endpoint, total_bytes, pid, None, reason)
        r.baseline = r._pss()
        return r

    def _pss(self) -> int | None:
        if self.pid is None:
            return None
        m = procmem.read_process(self.pid)
        if m.committed_bytes is None:
            self.reason = f"unavailable, because rpc-server pid {self.pid} could not be read: {m.reason}"
        return m.committed_bytes

    def _source(self) -> str:
        return (f"measured: rpc-server pid {self.pid} ({self.endpoint}) committed PSS over its idle baseline "
                f"{self.baseline} B (smaps_rollup)")

    def held_by(self, pids: frozenset[int]) -> DeviceBytes:
        """The server's growth, when ``pids`` are its only clients; with other clients connected the growth is
        theirs together, and the seat's share is unavailable (its engine-reported buffers count)."""
        now = self._pss()
        if now is None or self.baseline is None:
            return _unavailable(self.reason or "the rpc-server's memory was not read")
        others = client_pids(self.endpoint) - pids - {self.pid}
        if others:
            return _unavailable(f"rpc-server pid {self.pid} also serves pids {sorted(others)}: its growth "
                                f"({now - self.baseline} B) is theirs together")
        return DeviceBytes(max(0, now - self.baseline), self._source(), touched=True)

    def free(self) -> DeviceBytes:
        now = self._pss()
        if now is None:
            return _unavailable(self.reason or "the rpc-server's memory was not read")
        return DeviceBytes(self.total_bytes - now, f"derived: engine-reported total less {self._source()}")


@dataclass
class EngineReportedReader:
    """Nothing reads this device apart: the engine's allocated figure (its load log) counts for it."""

    name: str
    why: str
    kind: str = "engine-reported"

    def held_by(self, pids: frozenset[int]) -> DeviceBytes:
        return _unavailable(self.why)

    def free(self) -> DeviceBytes:
        return _unavailable(self.why)


def reader_for(dev: Any, nvml: Any = None, rpc_pids: Mapping[str, int] | None = None) -> DeviceReader:
    """The reader of one census device (``engines.llama_cpp.census.CensusDevice``): see the module doc."""
    if dev.unified:
        return EngineReportedReader(dev.name, f"{dev.name}'s memory is host memory ({dev.unified_source}): its "
                                              "buffers are in the seat's PSS; the engine's allocated figure counts")
    if dev.backend == "CUDA":
        return NvmlReader(dev.name, nvml)
    if dev.backend == "RPC":
        return RpcServerReader.of(dev.name, dev.endpoint, dev.device.total_bytes, (rpc_pids or {}).get(dev.endpoint))
    if drm_devices():
        return FdinfoReader(dev.name)
    return EngineReportedReader(dev.name, f"no reader for a {dev.backend} device on this machine (no NVML, no DRM "
                                          "device node): the engine's allocated figure counts")


class DeviceMeters:
    """Every device's reader, by the engine's name; NVML's devices without a census entry are read by NVML."""

    def __init__(self, nvml: Any = None, census: Any = None, rpc_pids: Mapping[str, int] | None = None) -> None:
        self.nvml = nvml
        self.readers: dict[str, DeviceReader] = {}
        self.census = None
        if census is not None:
            self.use(census, rpc_pids)

    @staticmethod
    def of(x: Any) -> DeviceMeters:
        """``x`` if it is one, else the meters of an NVML-like (or None: the real NVML) alone."""
        return x if isinstance(x, DeviceMeters) else DeviceMeters(x)

    def use(self, census: Any, rpc_pids: Mapping[str, int] | None = None) -> None:
        """Read the devices of ``census`` from now on (a reader per device, its baseline taken now)."""
        self.census = census
        self.readers = {d.name: reader_for(d, self.nvml, rpc_pids) for d in census.devices}

    def reader(self, name: str) -> DeviceReader:
        return self.readers.get(name) or NvmlReader(name, self.nvml)

    def held_by(self, pids: Iterable[int], devices: Sequence[str]) -> dict[str, DeviceBytes]:
        """What ``pids`` hold on each of ``devices``."""
        frozen = frozenset(pids)
        return {d: self.reader(d).held_by(frozen) for d in devices}

    def free(self, devices: Sequence[str]) -> dict[str, DeviceBytes]:
        return {d: self.reader(d).free() for d in devices}

    def unified(self, devices: Sequence[str]) -> tuple[str, ...]:
        """Those of ``devices`` whose memory is host memory (as the census says)."""
        if self.census is None:
            return ()
        return tuple(d for d in devices if (c := self.census.device(d)) is not None and c.unified)
