"""The failed-load guard: known answers, arithmetic in the comments."""

from __future__ import annotations

import pytest

from fitevict.guard import Verdict, check_measurement
from fitevict.units import GiB, MiB

FILE = 4 * GiB  # a 4 GiB model file: its 1% floor is 4 GiB * 0.01 = 42_949_672.96 B (~40.96 MiB)

CASES = [
    # (name, total, file_bytes, previous, min_fraction, accepted, check)
    # nothing measured at all
    ("none", None, FILE, None, 0.5, False, "implausible"),
    # 0 B < 1 MiB floor
    ("zero", 0, FILE, None, 0.5, False, "implausible"),
    # 1 MiB - 1 = 1_048_575 B < 1_048_576 B floor, even for an empty file (no 1% rule then)
    ("just-under-floor", MiB - 1, 0, None, 0.5, False, "implausible"),
    # exactly 1 MiB meets the floor; file_bytes 0 skips the 1% rule
    ("floor-exact-empty-file", MiB, 0, None, 0.5, True, None),
    # 40 MiB = 41_943_040 B < 42_949_672.96 B (1% of 4 GiB)
    ("under-1pct-of-file", 40 * MiB, FILE, None, 0.5, False, "implausible"),
    # 41 MiB = 42_991_616 B >= 42_949_672.96 B
    ("over-1pct-of-file", 41 * MiB, FILE, None, 0.5, True, None),
    # first measurement of a signature: 5 GiB, nothing to compare with
    ("first", 5 * GiB, FILE, None, 0.5, True, None),
    # 3 GiB < 0.5 * 8 GiB = 4 GiB
    ("collapse", 3 * GiB, FILE, 8 * GiB, 0.5, False, "collapse"),
    # 4 GiB = 0.5 * 8 GiB: exactly half is accepted (strictly-under rejects)
    ("exactly-half", 4 * GiB, FILE, 8 * GiB, 0.5, True, None),
    # 4 GiB - 1 < 4 GiB
    ("one-byte-under-half", 4 * GiB - 1, FILE, 8 * GiB, 0.5, False, "collapse"),
    # growth is never a collapse: 12 GiB > 8 GiB
    ("growth", 12 * GiB, FILE, 8 * GiB, 0.5, True, None),
    # stricter guard: 6 GiB < 0.8 * 8 GiB = 6.4 GiB
    ("strict-fraction", 6 * GiB, FILE, 8 * GiB, 0.8, False, "collapse"),
    # the file's size could not be read: its check cannot run, so nothing is stored (never a 0 that skips it)
    ("file-size-unavailable", 5 * GiB, None, None, 0.5, False, "implausible"),
    # implausible fires before collapse: 0 B is both under the floor and under half of 8 GiB
    ("implausible-first", 0, FILE, 8 * GiB, 0.5, False, "implausible"),
    # a different signature means the caller passes previous=None: 1 GiB after 8 GiB elsewhere passes
    ("new-signature-drop", 1 * GiB, FILE, None, 0.5, True, None),
]


@pytest.mark.parametrize(
    ("total", "file_bytes", "previous", "min_fraction", "accepted", "check"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_known_answers(
    total: int | None, file_bytes: int | None, previous: int | None, min_fraction: float, accepted: bool, check: str | None
) -> None:
    v = check_measurement(total, file_bytes=file_bytes, previous=previous, min_fraction=min_fraction)
    assert isinstance(v, Verdict)
    assert (v.accepted, v.check) == (accepted, check)
    assert v.reason.startswith(check or "accepted")


def test_collapse_reason_carries_the_numbers() -> None:
    v = check_measurement(3 * GiB, file_bytes=FILE, previous=8 * GiB)
    # 3 GiB = 3_221_225_472 B; 8 GiB = 8_589_934_592 B; 0.5 x 8 GiB = 4_294_967_296 B
    for text in ("3221225472 B", "8589934592 B", "4294967296 B", "0.5 x", "same signature"):
        assert text in v.reason


def test_implausible_reason_carries_the_numbers() -> None:
    v = check_measurement(40 * MiB, file_bytes=FILE, previous=None)
    # 40 MiB = 41_943_040 B; 4 GiB = 4_294_967_296 B; 1% of it = 42_949_672 B (truncated for display)
    for text in ("41943040 B", "4294967296 B", "42949672 B", "0.01 x"):
        assert text in v.reason
    assert "1048575 B" in check_measurement(MiB - 1, file_bytes=0, previous=None).reason


@pytest.mark.parametrize(
    "kwargs",
    [
        {"file_bytes": -1, "previous": None},
        {"file_bytes": 1, "previous": -1},
        {"file_bytes": 1, "previous": None, "min_fraction": 0.0},
        {"file_bytes": 1, "previous": None, "min_fraction": 1.5},
    ],
)
def test_bad_arguments_raise(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        check_measurement(5 * GiB, **kwargs)
