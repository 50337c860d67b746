"""Peak memory of each seat over its serving window: the record, and its writes and reads in the store.

A window runs from the moment the memory sampler first sees a seat until the seat is gone (or the server stops).
Each peak is the largest reading taken in the window; a figure that could not be read on this host is ``None``
and ``details["reasons"][name]`` says why ("unavailable, because ..."), never 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from fitevict.store import schema as t
from fitevict.store.records import check_bytes, check_seconds
from fitevict.store.retention import RowBounds, trim_peaks

PEAK_FIELDS: tuple[str, ...] = ("peak_pss_bytes", "peak_rss_bytes", "peak_gpu_bytes", "peak_available_drop_bytes")


@dataclass(frozen=True, slots=True)
class SeatPeaks:
    """One seat's serving window. ``config`` is the seat's ``LoadConfig.to_json()``.

    ``details``: ``sources`` (per figure: smaps_rollup, rss-fallback, nvml, meminfo), ``reasons`` (per figure that
    is None: why it is unavailable), ``other_seats`` (the most other seats resident at once during the window: the
    MemAvailable drop is the host's, so it is this seat's alone only when that is 0), ``baseline`` (how the
    MemAvailable baseline was taken).
    """

    seat_id: str
    model: str
    engine: str
    config: dict[str, Any]
    started_at: float
    ended_at: float
    samples: int
    peak_pss_bytes: int | None
    peak_rss_bytes: int | None
    peak_gpu_bytes: int | None
    peak_available_drop_bytes: int | None
    baseline_available_bytes: int | None
    details: dict[str, Any] = field(default_factory=dict)
    id: int | None = None

    def __post_init__(self) -> None:
        check_seconds("SeatPeaks", "started_at", self.started_at, required=True)
        check_seconds("SeatPeaks", "ended_at", self.ended_at, required=True)
        for name in (*PEAK_FIELDS, "baseline_available_bytes"):
            check_bytes("SeatPeaks", name, getattr(self, name))
        if self.samples < 0:
            raise ValueError(f"SeatPeaks.samples must be >= 0, got {self.samples}")

    def reason(self, name: str) -> str:
        """Why ``name`` is None ("" when it has a value)."""
        if getattr(self, name) is not None:
            return ""
        return str(self.details.get("reasons", {}).get(name) or "unavailable, because it was never sampled")

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "seat_id": self.seat_id, "model": self.model, "engine": self.engine,
                "config": self.config, "started_at": self.started_at, "ended_at": self.ended_at,
                "samples": self.samples, **{n: getattr(self, n) for n in PEAK_FIELDS},
                "baseline_available_bytes": self.baseline_available_bytes, "details": self.details}


def op_put_peaks(p: SeatPeaks, bounds: RowBounds = RowBounds()) -> Callable[[Connection], int]:
    """The write (for ``Store.write`` / ``awrite``: the store's one writer); the windows of the same model and
    configuration beyond ``bounds`` go in the same transaction."""
    values = {"seat_id": p.seat_id, "model": p.model, "engine": p.engine,
              "config_json": json.dumps(p.config, sort_keys=True), "started_at": float(p.started_at),
              "ended_at": float(p.ended_at), "samples": int(p.samples),
              **{n: getattr(p, n) for n in (*PEAK_FIELDS, "baseline_available_bytes")},
              "details_json": json.dumps(p.details, sort_keys=True, allow_nan=False)}

    def fn(conn: Connection) -> int:
        new_id = int(conn.execute(sa.insert(t.seat_peaks).values(**values).returning(t.seat_peaks.c.id)).scalar_one())
        trim_peaks(conn, bounds, (values["model"], values["config_json"]))
        return new_id

    return fn


def q_peaks(model: str | None = None, since: float | None = None) -> Callable[[Connection], list[SeatPeaks]]:
    """The read (for ``Store.read`` / ``aread``): windows in start order, optionally one model, from ``since``."""
    q = sa.select(t.seat_peaks)
    if model is not None:
        q = q.where(t.seat_peaks.c.model == model)
    if since is not None:
        q = q.where(t.seat_peaks.c.started_at >= since)
    q = q.order_by(t.seat_peaks.c.started_at, t.seat_peaks.c.id)

    def fn(conn: Connection) -> list[SeatPeaks]:
        return [SeatPeaks(seat_id=r.seat_id, model=r.model, engine=r.engine, config=json.loads(r.config_json),
                          started_at=r.started_at, ended_at=r.ended_at, samples=r.samples,
                          peak_pss_bytes=r.peak_pss_bytes, peak_rss_bytes=r.peak_rss_bytes,
                          peak_gpu_bytes=r.peak_gpu_bytes, peak_available_drop_bytes=r.peak_available_drop_bytes,
                          baseline_available_bytes=r.baseline_available_bytes,
                          details=json.loads(r.details_json), id=int(r.id))
                for r in conn.execute(q)]

    return fn
