"""The failed-load guard: decide whether a fresh measurement may be stored. Pure.

A measurement that failed (the engine died early, the probe read the wrong process, the buffers
were not allocated yet) must never become the price of a model: the planner would then load it
into memory that cannot hold it. Two checks, in order:

``implausible``
    The figure cannot be a loaded model on its own terms: it is missing (None), or under
    ``floor_bytes`` (1 MiB: llama.cpp's output and compute buffers alone exceed it), or, for a
    non-empty model file, under ``min_file_fraction`` (1%) of the file's bytes. Even with every
    weight mapped and counted elsewhere, a real load holds far more than 1% of its file.

``no-weights`` (torch seats, check_walk)
    The seat's object walk found no weights from the checkpoint in any component. The load failed, whatever the
    process's memory says: it is refused with the walk's reason, never priced from a process-memory figure.

``collapse``
    The figure is under ``min_fraction`` (half) of the last accepted measurement with the SAME
    signature (same file, same configuration). Callers pass ``previous`` only for that signature;
    a different signature (new ctx, placement, kv type, file) is a different cost, so a drop then
    passes. Exactly ``min_fraction`` x previous is accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from fitevict.units import MiB, format_size

IMPLAUSIBLE_FLOOR_BYTES = MiB
IMPLAUSIBLE_FILE_FRACTION = 0.01
COLLAPSE_MIN_FRACTION = 0.5

Check = Literal["implausible", "collapse", "no-weights"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """``accepted``; when not, ``check`` names the check that fired; ``reason`` carries the numbers."""

    accepted: bool
    check: Check | None
    reason: str


def _b(n: int | float) -> str:
    return f"{format_size(int(n))} ({int(n)} B)"


def check_measurement(
    total_bytes: int | None,
    *,
    file_bytes: int | None,
    previous: int | None,
    min_fraction: float = COLLAPSE_MIN_FRACTION,
    floor_bytes: int = IMPLAUSIBLE_FLOOR_BYTES,
    min_file_fraction: float = IMPLAUSIBLE_FILE_FRACTION,
) -> Verdict:
    """Accept or reject a measured total. ``previous`` is the last accepted total for the same signature."""
    if file_bytes is not None and (isinstance(file_bytes, bool) or not isinstance(file_bytes, int) or file_bytes < 0):
        raise ValueError(f"file_bytes must be an int >= 0 or None, got {file_bytes!r}")
    if previous is not None and (isinstance(previous, bool) or not isinstance(previous, int) or previous < 0):
        raise ValueError(f"previous must be an int >= 0 or None, got {previous!r}")
    for name, frac in (("min_fraction", min_fraction), ("min_file_fraction", min_file_fraction)):
        if not (math.isfinite(frac) and 0 < frac <= 1):
            raise ValueError(f"{name} must be in (0, 1], got {frac!r}")
    if floor_bytes < 0:
        raise ValueError(f"floor_bytes must be >= 0, got {floor_bytes!r}")

    if total_bytes is None:
        return Verdict(False, "implausible", "implausible: no total was measured (None); not stored")
    if isinstance(total_bytes, bool) or not isinstance(total_bytes, int):
        raise ValueError(f"total_bytes must be an int or None, got {total_bytes!r}")
    if total_bytes < floor_bytes:
        return Verdict(
            False,
            "implausible",
            f"implausible: measured total {_b(total_bytes)} is under the {_b(floor_bytes)} floor that any loaded "
            "model exceeds; the measurement failed, not stored — check the seat's log and remeasure",
        )
    if file_bytes is None:
        return Verdict(False, "implausible", f"implausible until checked: measured total {_b(total_bytes)}, but the "
                       "model file's size could not be read, so the file check cannot run; not stored — check the file")
    file_floor = file_bytes * min_file_fraction
    if file_bytes > 0 and total_bytes < file_floor:
        return Verdict(
            False,
            "implausible",
            f"implausible: measured total {_b(total_bytes)} is under {min_file_fraction:g} x the model file's "
            f"{_b(file_bytes)} = {_b(file_floor)}; the measurement failed, not stored — check the seat's log "
            "and remeasure",
        )
    if previous is not None and previous > 0:
        limit = previous * min_fraction
        if total_bytes < limit:
            return Verdict(
                False,
                "collapse",
                f"collapse: measured total {_b(total_bytes)} is under {min_fraction:g} x the last accepted "
                f"{_b(previous)} = {_b(limit)} for the same signature; not stored — a load that lost most of "
                "its memory failed part-way; remeasure (a changed configuration gets a new signature)",
            )
    basis = f"last accepted {_b(previous)}" if previous else "no earlier measurement for this signature"
    return Verdict(True, None, f"accepted: measured total {_b(total_bytes)} ({basis}; file {_b(file_bytes)})")


def check_walk(weight_bytes: int | None, *, reason: str = "") -> Verdict:
    """Accept a torch seat's load only when its object walk found weights (``weight_bytes`` from the checkpoint).

    ``reason`` is the seat's own account of a failed walk. An accepted walk then goes through check_measurement
    like any other measurement (the ratio guard against the same signature's last accepted figure)."""
    if weight_bytes is None or weight_bytes <= 0:
        why = reason or f"the object walk found {weight_bytes} B of weights in every component"
        return Verdict(False, "no-weights", f"no-weights: {why}; the load is refused and not stored — a process "
                                            "memory figure never stands in for a walk")
    return Verdict(True, None, f"accepted: the object walk found {_b(weight_bytes)} of weights")
