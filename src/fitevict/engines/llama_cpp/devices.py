"""The devices a llama.cpp build can use, as the engine itself lists them (``llama-server --list-devices``).

The engine prints one line per non-CPU device: ``  NAME: DESCRIPTION (TOTAL MiB, FREE MiB free)``. Names are the
engine's own (``CUDA0``, ``Vulkan0``, ``RPC0``, ``Metal``, ``SYCL0``...) and are what ``-dev`` takes, so budgets,
history and metrics use them too. Sizes are engine-reported in whole MiB, rounded down.

Which devices appear depends on the build (its backends), the environment (``GGML_VK_VISIBLE_DEVICES``,
``CUDA_VISIBLE_DEVICES``) and the ``--rpc`` endpoints given: all three are part of the question.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fitevict.units import MiB

LIST_SOURCE = "engine-reported (llama-server --list-devices, whole MiB rounded down)"
_LINE = re.compile(r"^\s+(?P<name>[A-Za-z][\w-]*): (?P<desc>.*) \((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)\s*$")
_BACKEND = re.compile(r"^(?P<backend>[A-Za-z_-]*[A-Za-z_-])\d*$")
LIST_TIMEOUT_S = 60.0


class DeviceListError(RuntimeError):
    """The engine could not list its devices; the message quotes what it said."""


@dataclass(frozen=True, slots=True)
class EngineDevice:
    """One device as the engine lists it."""

    name: str  # the engine's name: what -dev takes
    description: str  # "llvmpipe (LLVM 15.0.6, 256 bits)", "127.0.0.1:50052", "NVIDIA H200"
    total_bytes: int
    free_bytes: int
    source: str = LIST_SOURCE

    @property
    def backend(self) -> str:
        """The ggml backend that owns it: "CUDA", "Vulkan", "RPC", "Metal", "SYCL", ..."""
        m = _BACKEND.match(self.name)
        return m.group("backend") if m else self.name


def parse_device_list(text: str) -> tuple[EngineDevice, ...]:
    """The devices in ``--list-devices`` output (its other lines, backend chatter and "(none)", are skipped)."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            out.append(EngineDevice(m["name"], m["desc"], int(m["total"]) * MiB, int(m["free"]) * MiB))
    return tuple(out)


def list_devices_text(binary: Path, *, rpc: Sequence[str] = (), env: Mapping[str, str] | None = None,
                      timeout: float = LIST_TIMEOUT_S) -> str:
    """What ``binary --list-devices`` printed (stdout, then stderr) with ``rpc`` endpoints, at ``-lv 4`` so that any
    device line a backend logs (ggml_vulkan's ``uma:``, where a build prints it) is in it too."""
    argv = [str(binary), "-lv", "4", *(["--rpc", ",".join(rpc)] if rpc else []), "--list-devices"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                             env=None if env is None else dict(env))
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DeviceListError(f"`{' '.join(argv)}` could not list devices: {type(e).__name__}: {e}") from e
    text = out.stdout + out.stderr
    if out.returncode != 0 or "Available devices:" not in text:
        tail = " | ".join(text.strip().splitlines()[-4:])
        raise DeviceListError(f"`{' '.join(argv)}` exited {out.returncode} without a device list: {tail}")
    return text


def list_devices(binary: Path, *, rpc: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 timeout: float = LIST_TIMEOUT_S) -> tuple[EngineDevice, ...]:
    """Ask ``binary`` which devices it can use with ``rpc`` endpoints (each rpc-server's devices follow in order)."""
    return parse_device_list(list_devices_text(binary, rpc=rpc, env=env, timeout=timeout))
