"""Records the store reads and writes: frozen dataclasses, validated on construction.

Pure: no I/O, no clock. A figure that could not be measured is ``None`` (stored as NULL), never 0.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

EVENTS: tuple[str, ...] = ("load", "evict", "unload", "idle-unload", "fail", "reject", "refuse", "crash", "orphan",
                           "leak", "pressure",
                           "kv-restore", "outgrew", "recycle")
"""The history vocabulary. Anything else is refused, by the record and by the table's CHECK."""

_EVENT_BYTE_FIELDS: tuple[str, ...] = (
    "vram_bytes",
    "host_bytes",
    "offloaded_bytes",
    "freed_bytes",
    "predicted_bytes",
    "buffers_predicted_bytes",
    "engine_reported_bytes",
)


def check_bytes(owner: str, name: str, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}.{name} must be an int number of bytes or None (unavailable), got {value!r}")
    if value < 0:
        raise ValueError(f"{owner}.{name} must be >= 0 bytes or None (unavailable), got {value}")


def check_seconds(owner: str, name: str, value: object, *, required: bool = False) -> None:
    if value is None and not required:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{owner}.{name} must be a finite number of seconds, got {value!r}")


@dataclass(frozen=True, slots=True)
class Event:
    """One line of history. ``time`` is unix seconds; byte figures are ``None`` where unavailable.

    ``details`` holds what has no column of its own (release verified, exit time, release time,
    pids, ...); it must be JSON-serialisable. ``id`` is set by the store.

    ``predicted_bytes`` is the whole price a seat is planned at (``Footprint.whole_bytes``: host mapped + committed
    and each GPU's buffers and overhead; a refusal's, what its plan needed); ``buffers_predicted_bytes`` the engine
    buffers alone as priced (``Footprint.total_bytes``); ``engine_reported_bytes`` the buffers the engine reported
    it allocated (its load log or allocator trace). What a process was read to hold (PSS, NVML) is in
    ``host_bytes``/``vram_bytes`` and ``details``.
    """

    time: float
    event: str
    model: str | None = None
    engine: str | None = None
    seconds: float | None = None
    vram_bytes: int | None = None
    host_bytes: int | None = None
    offloaded_bytes: int | None = None
    strategy: str | None = None
    reason: str | None = None
    freed_bytes: int | None = None
    request_id: str | None = None
    predicted_bytes: int | None = None
    buffers_predicted_bytes: int | None = None
    engine_reported_bytes: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    id: int | None = None

    def __post_init__(self) -> None:
        if self.event not in EVENTS:
            raise ValueError(f"event {self.event!r} is not in the history vocabulary {EVENTS}")
        check_seconds("Event", "time", self.time, required=True)
        check_seconds("Event", "seconds", self.seconds)
        if self.seconds is not None and self.seconds < 0:
            raise ValueError(f"Event.seconds must be >= 0 or None (unavailable), got {self.seconds}")
        for name in _EVENT_BYTE_FIELDS:
            check_bytes("Event", name, getattr(self, name))
        if not isinstance(self.details, Mapping):
            raise TypeError(f"Event.details must be a mapping, got {type(self.details).__name__}")


@dataclass(frozen=True, slots=True)
class Measurement:
    """A measured footprint, kept under the signature of the exact file and configuration measured.

    ``footprint`` is ``Footprint.to_json()``; ``host_*`` are ``None`` where they could not be read.
    """

    signature: str
    model: str
    engine: str
    measured_at: float
    footprint: dict[str, Any]
    host_committed_bytes: int | None
    host_mapped_bytes: int | None
    total_bytes: int
    source: str = "engine-reported"  # the footprint's: the engine's buffers (rows stored before say "measured")
    id: int | None = None

    def __post_init__(self) -> None:
        if not self.signature:
            raise ValueError("Measurement.signature must not be empty")
        check_seconds("Measurement", "measured_at", self.measured_at, required=True)
        check_bytes("Measurement", "host_committed_bytes", self.host_committed_bytes)
        check_bytes("Measurement", "host_mapped_bytes", self.host_mapped_bytes)
        if self.total_bytes is None:
            raise ValueError(
                "Measurement.total_bytes is None: an unavailable measurement is never stored "
                "(fitevict.guard.check_measurement rejects it)"
            )
        check_bytes("Measurement", "total_bytes", self.total_bytes)


@dataclass(frozen=True, slots=True)
class SeatRecord:
    """A running (or starting/stopping) engine process, kept so a restarted fitevict can find orphans.

    ``fitevict_pid`` is the pid of the supervisor that started it; ``config`` is ``LoadConfig.to_json()``
    or the engine's equivalent. ``pid``/``pgid``/``port`` are ``None`` before the process exists.
    """

    seat_id: str
    model: str
    engine: str
    state: str
    started_at: float
    fitevict_pid: int
    pid: int | None = None
    pgid: int | None = None
    port: int | None = None
    log_path: str | None = None
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.seat_id:
            raise ValueError("SeatRecord.seat_id must not be empty")
        if not self.state:
            raise ValueError(f"SeatRecord {self.seat_id!r}: state must not be empty")
        check_seconds("SeatRecord", "started_at", self.started_at, required=True)
        for name in ("pid", "pgid", "fitevict_pid"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise ValueError(f"SeatRecord {self.seat_id!r}: {name} must be a positive int, got {v!r}")
        if self.port is not None and not (0 < self.port < 65536):
            raise ValueError(f"SeatRecord {self.seat_id!r}: port {self.port} is outside 1..65535")


def measurement_signature(
    *, path: str, size: int, mtime_ns: int, quantization: str, config: Mapping[str, Any], machine: str = ""
) -> str:
    """A stable key for "this file, measured under this configuration".

    ``config`` is the placement that decides the footprint (``LoadConfig.to_json()``: ctx, ngl,
    n_cpu_moe, devices, kv types, parallel, ...). Any change to the file (size, mtime) or to the
    configuration gives a new signature, so a measurement is compared only with its own kind.
    Returns ``"sha256:<hex>"`` of the canonical JSON (sorted keys, no whitespace).
    """
    doc = {"path": path, "size": size, "mtime_ns": mtime_ns, "quantization": quantization, "config": dict(config)}
    if machine:  # the engine build and CPU (host.machine.machine_key): another machine's measurement never matches
        doc["machine"] = machine
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=list)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
