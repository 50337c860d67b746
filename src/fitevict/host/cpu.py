"""The CPU this process runs on, as ``/proc/cpuinfo`` names it: model, architecture and every flag, with a fingerprint
that keys whatever depends on the CPU (probe tables, stored measurements, engine builds)."""

from __future__ import annotations

import functools
import hashlib
import json
import platform
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True, slots=True)
class Cpu:
    model: str  # "AMD EPYC 9B14", "Intel(R) Xeon(R) Platinum 8481C"
    arch: str  # platform.machine(): x86_64, aarch64, arm64
    flags: frozenset[str]  # /proc/cpuinfo "flags" (x86) or "Features" (ARM)

    @property
    def fingerprint(self) -> str:
        """12 hex digits over the model name, architecture and every flag: two CPUs that differ in any of them
        (a native build's kernels, the extra buffer types) get different fingerprints."""
        blob = json.dumps([self.model, self.arch, sorted(self.flags)])
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def describe(self) -> str:
        return f"{self.model} ({self.arch}, cpu {self.fingerprint})"


def read_cpu(cpuinfo: Path = CPUINFO) -> Cpu:
    """The CPU from /proc/cpuinfo (its first processor); elsewhere the platform's own words and no flags."""
    model, flags = "", ""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Model", "Hardware", "cpu model") and not model:
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = value.strip()
            if model and flags:
                break
    except OSError:
        pass
    return Cpu(model or platform.processor() or "unknown CPU", platform.machine() or "unknown",
               frozenset(flags.split()))


@functools.cache
def this_cpu() -> Cpu:
    return read_cpu()
