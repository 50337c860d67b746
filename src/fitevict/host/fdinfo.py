"""Per-process GPU memory from Linux DRM fdinfo (``/proc/PID/fdinfo/N``), where NVML does not reach.

DRM drivers (amdgpu, i915, xe, and others) publish, for each open DRM file, the client's memory by region
(Documentation/gpu/drm-usage-stats.rst)::

    drm-driver:        amdgpu
    drm-pdev:          0000:03:00.0
    drm-client-id:     42
    drm-memory-vram:   1048576 KiB          (amdgpu, older keys)
    drm-total-vram:    1048576 KiB          (the common keys: drm-total-<region>, drm-resident-<region>)
    drm-total-local0:  524288 KiB           (i915 / xe device-local memory)
    drm-total-system0: 4096 KiB             (system memory the driver placed for this client)

Several fds (and processes) may share one client: each client (``drm-pdev``, ``drm-client-id``) counts once. The
device's own memory is its device-local regions (``vram*``, ``local*``, ``stolen*``); system regions are host memory
and are reported apart.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from fitevict.host.procmem import PROC

_UNITS = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
_LOCAL = re.compile(r"^(vram|local|stolen)")
SOURCE = "measured: DRM fdinfo of the seat's processes (/proc/PID/fdinfo: drm-total-* / drm-memory-*)"


@dataclass(frozen=True, slots=True)
class DrmClient:
    """One DRM client as one fdinfo file shows it."""

    driver: str
    pdev: str
    client_id: str
    total: Mapping[str, int]  # region -> bytes (drm-total-*, else drm-memory-*)
    resident: Mapping[str, int]  # region -> bytes (drm-resident-*)

    @property
    def device_bytes(self) -> int:
        """Bytes in the device's own regions (vram, local, stolen)."""
        return sum(n for r, n in self.total.items() if _LOCAL.match(r))

    @property
    def system_bytes(self) -> int:
        return sum(n for r, n in self.total.items() if not _LOCAL.match(r))


def _bytes(value: str) -> int | None:
    parts = value.split()
    if not parts or not parts[0].isdigit():
        return None
    unit = parts[1] if len(parts) > 1 else ""
    return int(parts[0]) * _UNITS[unit] if unit in _UNITS else None


def parse_fdinfo(text: str) -> DrmClient | None:
    """The DRM client an fdinfo text describes; None for a file that is not a DRM client's."""
    keys: dict[str, str] = {}
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep:
            keys[k.strip()] = v.strip()
    if "drm-driver" not in keys:
        return None
    total: dict[str, int] = {}
    memory: dict[str, int] = {}
    resident: dict[str, int] = {}
    for k, v in keys.items():
        n = _bytes(v)
        if n is None:
            continue
        for prefix, into in (("drm-total-", total), ("drm-memory-", memory), ("drm-resident-", resident)):
            if k.startswith(prefix):
                into[k[len(prefix):]] = n
    return DrmClient(keys["drm-driver"], keys.get("drm-pdev", ""), keys.get("drm-client-id", ""),
                     total or memory, resident)


@dataclass(frozen=True, slots=True)
class DrmUsage:
    """What a set of processes holds through DRM, per device (``drm-pdev``), each client counted once."""

    device_bytes: Mapping[str, int]  # pdev -> bytes in its own regions
    system_bytes: Mapping[str, int]  # pdev -> bytes in system memory regions
    drivers: Mapping[str, str]  # pdev -> driver
    reason: str = ""  # why nothing could be read ("" when the files were read)


def read_drm_usage(pids: Iterable[int], proc: Path = PROC) -> DrmUsage:
    """The DRM memory of ``pids`` (see the module doc). A process that vanished mid-read is skipped."""
    seen: set[tuple[str, str]] = set()
    dev: dict[str, int] = {}
    sysm: dict[str, int] = {}
    drivers: dict[str, str] = {}
    denied: list[str] = []
    for pid in pids:
        d = proc / str(pid) / "fdinfo"
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            continue
        except PermissionError as e:
            denied.append(f"{d}: {e.strerror}")
            continue
        for name in names:
            try:
                text = (d / name).read_text(errors="replace")
            except (FileNotFoundError, ProcessLookupError):
                continue
            except PermissionError as e:
                denied.append(f"{d / name}: {e.strerror}")
                continue
            c = parse_fdinfo(text)
            if c is None or (c.pdev, c.client_id) in seen:
                continue
            seen.add((c.pdev, c.client_id))
            dev[c.pdev] = dev.get(c.pdev, 0) + c.device_bytes
            sysm[c.pdev] = sysm.get(c.pdev, 0) + c.system_bytes
            drivers[c.pdev] = c.driver
    reason = f"unavailable, because fdinfo could not be read: {'; '.join(denied[:3])}" if denied and not dev else ""
    return DrmUsage(dev, sysm, drivers, reason)


def drm_devices(dev: Path = Path("/dev/dri")) -> tuple[str, ...]:
    """The DRM device nodes of this machine (``/dev/dri/renderD128``, ...); () when it has none."""
    try:
        return tuple(sorted(str(dev / n) for n in os.listdir(dev)))
    except OSError:
        return ()
