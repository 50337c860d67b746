"""Measurement I/O: what the machine has (NVML, /proc, the CPU) and what fitevict may use of it (the budget
records themselves are pure: ``fitevict.budget``)."""

from fitevict.host.budget import DEFAULT_GPU_RESERVE, DEFAULT_RAM_RESERVE, measure_budget
from fitevict.host.nvml import GpuDevice, GpuProcess, GpuReading, NvmlLike, read_gpus
from fitevict.host.procmem import (
    HostMemory,
    HostMemoryError,
    ProcessMemory,
    descendants,
    read_meminfo,
    read_process,
    read_tree,
)

__all__ = [
    "DEFAULT_GPU_RESERVE",
    "DEFAULT_RAM_RESERVE",
    "GpuDevice",
    "GpuProcess",
    "GpuReading",
    "HostMemory",
    "HostMemoryError",
    "NvmlLike",
    "ProcessMemory",
    "descendants",
    "measure_budget",
    "read_gpus",
    "read_meminfo",
    "read_process",
    "read_tree",
]
