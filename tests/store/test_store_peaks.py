"""Serving-window peaks: written through the one writer, read back whole, unavailable figures kept as NULL."""

from __future__ import annotations

import pytest

from fitevict.store import Store
from fitevict.store.peaks import SeatPeaks, op_put_peaks, q_peaks


def _window(model: str, start: float, pss: int | None, **details) -> SeatPeaks:
    return SeatPeaks(seat_id=f"{model}-{start}", model=model, engine="llama-server",
                     config={"n_ctx": 4096, "cache_type_k": "q8_0"}, started_at=start, ended_at=start + 5,
                     samples=12, peak_pss_bytes=pss, peak_rss_bytes=None if pss is None else pss + 1,
                     peak_gpu_bytes=None, peak_available_drop_bytes=7, baseline_available_bytes=1000,
                     details={"reasons": {"peak_gpu_bytes": "unavailable, because no NVIDIA GPU"}, **details})


def test_peaks_round_trip_with_unavailable_figures_as_none(store: Store) -> None:
    first = _window("a", 100.0, 5_000_000_000)  # past 32 bits: BIGINT on both backends
    second = _window("b", 101.0, None, other_seats=1)
    ids = [store.write(op_put_peaks(w)) for w in (second, first)]
    assert len(set(ids)) == 2
    got = store.read(q_peaks())
    assert [w.model for w in got] == ["a", "b"]  # in start order, not write order
    a, b = got
    assert a.peak_pss_bytes == 5_000_000_000 and a.config == first.config and a.id is not None
    assert b.peak_pss_bytes is None and b.peak_rss_bytes is None and b.details["other_seats"] == 1
    assert a.peak_gpu_bytes is None and a.reason("peak_gpu_bytes") == "unavailable, because no NVIDIA GPU"
    assert a.reason("peak_pss_bytes") == ""
    assert [w.model for w in store.read(q_peaks(model="b"))] == ["b"]
    assert [w.model for w in store.read(q_peaks(since=100.5))] == ["b"]


def test_a_peak_is_never_negative() -> None:
    with pytest.raises(ValueError, match="peak_pss_bytes"):
        _window("a", 1.0, -1)
