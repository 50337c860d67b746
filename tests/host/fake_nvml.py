"""A fake NVML with pynvml's call names, standing in for the driver at the library edge.

It holds plain device records; every call behaves like pynvml's (handles by index, memory info with
total/free/used, compute processes with pid/usedGpuMemory, errors as ``NVMLError``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    """pynvml's exception base class."""


@dataclass
class FakeGpu:
    name: str = "NVIDIA Fake 24GB"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    total: int = 24 * 1024**3
    used: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, usedGpuMemory)
    broken_memory: bool = False
    broken_processes: bool = False


class FakeNvml:
    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu] | None = None, *, init_error: str | None = None) -> None:
        self.gpus = list(gpus or [])
        self.init_error = init_error
        self.inits = 0
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error:
            raise NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.gpus):
            raise NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self.gpus[handle].name

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return self.gpus[handle].uuid.encode()  # some pynvml versions return bytes here

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        g = self.gpus[handle]
        if g.broken_memory:
            raise NVMLError("GPU is lost")
        return SimpleNamespace(total=g.total, used=g.used, free=g.total - g.used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        g = self.gpus[handle]
        if g.broken_processes:
            raise NVMLError("Not Supported")
        return [SimpleNamespace(pid=p, usedGpuMemory=u) for p, u in g.processes]
