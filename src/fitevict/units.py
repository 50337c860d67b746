"""Byte sizes: parse "24GiB" / "600MiB" / "1.5G", format for humans, round to pages.

Binary (KiB, MiB, GiB, TiB) and decimal (KB, MB, GB, TB) suffixes are both accepted;
a bare "G"/"M"/"K" is binary, as llama.cpp and most CLI tools use it.
"""

from __future__ import annotations

import re

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kib": KiB,
    "kb": 1000,
    "m": MiB,
    "mib": MiB,
    "mb": 1000**2,
    "g": GiB,
    "gib": GiB,
    "gb": 1000**3,
    "t": TiB,
    "tib": TiB,
    "tb": 1000**4,
}

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


class SizeError(ValueError):
    """A size string that cannot be read."""


def parse_size(text: str | int, *, name: str = "size") -> int:
    """Parse a byte size. ``name`` is the config key or flag, used in the error."""
    if isinstance(text, bool):
        raise SizeError(f"{name}: {text!r} is not a size; write it like 600MiB, 24GiB or 1073741824")
    if isinstance(text, int):
        if text < 0:
            raise SizeError(f"{name}: {text} is negative; a size must be 0 or more bytes")
        return text
    m = _SIZE_RE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise SizeError(
            f"{name}: {text!r} is not a size; write it like 600MiB, 24GiB, 1.5GB or 1073741824 "
            f"(units: {', '.join(u for u in _UNITS if u)})"
        )
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    return int(round(value))


def format_size(n: int | None, *, unavailable: str = "unavailable") -> str:
    """Human size in binary units with three significant figures: 1.50 GiB, 600 MiB, 512 B."""
    if n is None:
        return unavailable
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            v = n / size
            digits = 2 if v < 10 else 1 if v < 100 else 0
            return f"{sign}{v:.{digits}f} {unit}"
    return f"{sign}{n} B"


def pad(n: int, to: int) -> int:
    """Round ``n`` up to a multiple of ``to`` (llama.cpp's GGML_PAD)."""
    return -(-n // to) * to
