"""The store's operations, one builder each: it validates its arguments in the caller's thread and returns
``fn(conn)``, which the single writer (writes) or a pooled reader connection (reads) runs. SQLAlchemy Core with
bound parameters only; sort columns and directions come from whitelists, never from user text."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from fitevict.pricing.footprint import SOURCES
from fitevict.store import schema as t
from fitevict.store.records import EVENTS, Event, Measurement, SeatRecord
from fitevict.store.retention import RowBounds, trim_events, trim_measurements

Order = Literal["asc", "desc"]

MAX_EVENTS_LIMIT = 10_000
"""The most history rows one ``events()`` call returns."""

EVENT_SORT_COLUMNS: dict[str, sa.ColumnClause] = {
    "time": t.events.c.time,
    "id": t.events.c.id,
    "seconds": t.events.c.seconds,
    "model": t.events.c.model,
    "event": t.events.c.event,
    "vram_bytes": t.events.c.vram_bytes,
    "host_bytes": t.events.c.host_bytes,
    "freed_bytes": t.events.c.freed_bytes,
}
"""The only columns history may be sorted by (ties broken by id in the same direction). NULL (an
unavailable figure, no model) sorts last in either direction."""

_NOT_NULL_SORT_COLUMNS = frozenset({"time", "id", "event"})
"""Sort columns that are never NULL: no NULLS LAST, so a descending sort can still walk an index backwards."""

MEASUREMENT_SOURCES: tuple[str, ...] = tuple(s for s in SOURCES if s != "unavailable")


def _dumps(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} is not JSON-serialisable (plain dicts, lists, str, int, finite floats): {e}") from e


# ---- operations: each builder validates in the caller's thread and returns fn(conn) ----


def op_record_event(ev: Event, keep_rows: int | None = None) -> Callable[[Connection], int]:
    """Append ``ev``; with ``keep_rows``, the events that many records older go in the same transaction
    (``retention.trim_events``), so the table never holds more between prunes."""
    if not isinstance(ev, Event):
        raise TypeError(f"record_event takes an Event, got {type(ev).__name__}")
    values = {
        "time": float(ev.time),
        "event": ev.event,
        "model": ev.model,
        "engine": ev.engine,
        "seconds": None if ev.seconds is None else float(ev.seconds),
        "vram_bytes": ev.vram_bytes,
        "host_bytes": ev.host_bytes,
        "offloaded_bytes": ev.offloaded_bytes,
        "strategy": ev.strategy,
        "reason": ev.reason,
        "freed_bytes": ev.freed_bytes,
        "request_id": ev.request_id,
        "predicted_bytes": ev.predicted_bytes,
        "buffers_predicted_bytes": ev.buffers_predicted_bytes,
        "engine_reported_bytes": ev.engine_reported_bytes,
        "details_json": _dumps(dict(ev.details), "Event.details"),
    }

    def fn(conn: Connection) -> int:
        new_id = int(conn.execute(sa.insert(t.events).values(**values).returning(t.events.c.id)).scalar_one())
        if keep_rows:
            trim_events(conn, keep_rows, new_id)
        return new_id

    return fn


def _row_event(r: sa.Row) -> Event:
    return Event(
        id=int(r.id),
        time=float(r.time),
        event=r.event,
        model=r.model,
        engine=r.engine,
        seconds=r.seconds,
        vram_bytes=r.vram_bytes,
        host_bytes=r.host_bytes,
        offloaded_bytes=r.offloaded_bytes,
        strategy=r.strategy,
        reason=r.reason,
        freed_bytes=r.freed_bytes,
        request_id=r.request_id,
        predicted_bytes=r.predicted_bytes,
        buffers_predicted_bytes=r.buffers_predicted_bytes,
        engine_reported_bytes=r.engine_reported_bytes,
        details=json.loads(r.details_json),
    )


def _finite(name: str, v: object) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{name} must be unix seconds (a finite number) or None, got {v!r}")
    return float(v)


def q_events(
    since: float | None,
    model: str | None,
    event: str | None,
    limit: int,
    order: str,
    until: float | None,
    sort_by: str,
) -> Callable[[Connection], list[Event]]:
    since_f = _finite("since", since)
    until_f = _finite("until", until)
    if event is not None and event not in EVENTS:
        raise ValueError(f"event filter {event!r} is not in the history vocabulary {EVENTS}")
    if model is not None and not isinstance(model, str):
        raise TypeError(f"model filter must be a str or None, got {type(model).__name__}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not (1 <= limit <= MAX_EVENTS_LIMIT):
        raise ValueError(f"limit must be an int from 1 to {MAX_EVENTS_LIMIT}, got {limit!r}; page with since/until")
    if order not in ("asc", "desc"):
        raise ValueError(f"order must be 'asc' or 'desc', got {order!r}")
    if sort_by not in EVENT_SORT_COLUMNS:
        raise ValueError(f"cannot sort history by {sort_by!r}; sortable columns: {sorted(EVENT_SORT_COLUMNS)}")
    col = EVENT_SORT_COLUMNS[sort_by]
    direction = sa.asc if order == "asc" else sa.desc
    q = sa.select(t.events)
    if since_f is not None:
        q = q.where(t.events.c.time >= since_f)
    if until_f is not None:
        q = q.where(t.events.c.time < until_f)
    if model is not None:
        q = q.where(t.events.c.model == model)
    if event is not None:
        q = q.where(t.events.c.event == event)
    q = q.limit(limit)

    def fn(conn: Connection) -> list[Event]:
        key = direction(_bytewise(col, conn.dialect.name))
        if sort_by not in _NOT_NULL_SORT_COLUMNS:
            key = key.nulls_last()  # SQLite puts NULL first ascending, PostgreSQL first descending
        ordered = q.order_by(key, direction(t.events.c.id))
        return [_row_event(r) for r in conn.execute(ordered)]

    return fn


def _bytewise(col: sa.ColumnClause, dialect: str) -> sa.ColumnElement[Any]:
    """Text compared byte by byte (code point order), as SQLite's default BINARY collation does; a
    PostgreSQL database's default collation follows its locale (``'B' < 'a'`` in C, not in en_US)."""
    if dialect == "postgresql" and isinstance(col.type, sa.Text):
        return col.collate("C")
    return col


def op_put_measurement(m: Measurement, bounds: RowBounds = RowBounds()) -> Callable[[Connection], int]:
    """Store a load record; the configuration's records beyond ``bounds`` go in the same transaction."""
    if m.source not in MEASUREMENT_SOURCES:
        raise ValueError(f"measurement source {m.source!r} is not one of {MEASUREMENT_SOURCES}")
    values = {
        "signature": m.signature,
        "model": m.model,
        "engine": m.engine,
        "measured_at": float(m.measured_at),
        "footprint_json": _dumps(dict(m.footprint), "footprint_json"),
        "host_committed_bytes": m.host_committed_bytes,
        "host_mapped_bytes": m.host_mapped_bytes,
        "total_bytes": m.total_bytes,
        "source": m.source,
    }

    def fn(conn: Connection) -> int:
        stmt = sa.insert(t.measurements).values(**values).returning(t.measurements.c.id)
        new_id = int(conn.execute(stmt).scalar_one())
        trim_measurements(conn, bounds, m.signature)
        return new_id

    return fn


def _row_measurement(r: Any) -> Measurement:
    return Measurement(
        id=int(r.id),
        signature=r.signature,
        model=r.model,
        engine=r.engine,
        measured_at=float(r.measured_at),
        footprint=json.loads(r.footprint_json),
        host_committed_bytes=r.host_committed_bytes,
        host_mapped_bytes=r.host_mapped_bytes,
        total_bytes=int(r.total_bytes),
        source=r.source,
    )


def q_last_measurement(signature: str) -> Callable[[Connection], Measurement | None]:
    c = t.measurements.c
    q = (
        sa.select(t.measurements)
        .where(c.signature == signature)
        .order_by(sa.desc(c.measured_at), sa.desc(c.id))
        .limit(1)
    )

    def fn(conn: Connection) -> Measurement | None:
        r = conn.execute(q).first()
        return None if r is None else _row_measurement(r)

    return fn


def q_newest_measurements() -> Callable[[Connection], dict[str, Measurement]]:
    """The newest measurement of every signature (as ``q_last_measurement`` picks it), in one query."""
    c = t.measurements.c
    rank = sa.func.row_number().over(partition_by=c.signature, order_by=(sa.desc(c.measured_at), sa.desc(c.id)))
    ranked = sa.select(t.measurements, rank.label("rank")).subquery()
    q = sa.select(ranked).where(ranked.c.rank == 1)

    def fn(conn: Connection) -> dict[str, Measurement]:
        return {r.signature: _row_measurement(r) for r in conn.execute(q)}

    return fn


def q_compute_get(key: str) -> Callable[[Connection], dict[str, int] | None]:
    q = sa.select(t.compute_cache.c.value_json).where(t.compute_cache.c.key == key)

    def fn(conn: Connection) -> dict[str, int] | None:
        v = conn.execute(q).scalar_one_or_none()
        return None if v is None else json.loads(v)

    return fn


_UPSERT_INSERTS = {"sqlite": sqlite_insert, "postgresql": postgresql_insert}


def upsert(table: sa.TableClause, key_col: str | tuple[str, ...], values: dict[str, Any]) -> Callable[[Connection], None]:
    """One atomic ``INSERT ... ON CONFLICT (key) DO UPDATE``. An UPDATE-then-INSERT is not enough on
    PostgreSQL: another process's uncommitted insert of the same key is invisible to the UPDATE, and
    the INSERT then fails on the key once that process commits."""
    keys = (key_col,) if isinstance(key_col, str) else key_col
    rest = [k for k in values if k not in keys]

    def fn(conn: Connection) -> None:
        stmt = _UPSERT_INSERTS[conn.dialect.name](table).values(**values)
        conn.execute(stmt.on_conflict_do_update(index_elements=list(keys), set_={k: stmt.excluded[k] for k in rest}))

    fn.table = table.name  # type: ignore[attr-defined]  # what it writes, for the store's faults (store.faults)
    return fn


def op_compute_put(key: str, value: Mapping[str, int]) -> Callable[[Connection], None]:
    if not key:
        raise ValueError("compute cache key must not be empty")
    for dev, n in value.items():
        if not isinstance(dev, str) or isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(
                f"compute cache value for {key!r} must map device name -> bytes (int >= 0); got {dev!r}: {n!r}"
            )
    vals = {"key": key, "value_json": _dumps(dict(value), "compute cache value"), "created_at": time.time()}
    return upsert(t.compute_cache, "key", vals)


def op_seat_upsert(seat: SeatRecord) -> Callable[[Connection], None]:
    if not isinstance(seat, SeatRecord):
        raise TypeError(f"seat_upsert takes a SeatRecord, got {type(seat).__name__}")
    vals = {
        "seat_id": seat.seat_id,
        "model": seat.model,
        "engine": seat.engine,
        "pid": seat.pid,
        "pgid": seat.pgid,
        "port": seat.port,
        "started_at": float(seat.started_at),
        "state": seat.state,
        "log_path": seat.log_path,
        "config_json": _dumps(dict(seat.config), "SeatRecord.config"),
        "fitevict_pid": seat.fitevict_pid,
    }
    return upsert(t.seats, "seat_id", vals)


def op_seat_remove(seat_id: str) -> Callable[[Connection], bool]:
    def fn(conn: Connection) -> bool:
        return conn.execute(sa.delete(t.seats).where(t.seats.c.seat_id == seat_id)).rowcount > 0

    return fn


def _row_seat(r: sa.Row) -> SeatRecord:
    return SeatRecord(
        seat_id=r.seat_id,
        model=r.model,
        engine=r.engine,
        pid=r.pid,
        pgid=r.pgid,
        port=r.port,
        started_at=float(r.started_at),
        state=r.state,
        log_path=r.log_path,
        config=json.loads(r.config_json),
        fitevict_pid=int(r.fitevict_pid),
    )


def q_seats(seat_id: str | None = None) -> Callable[[Connection], list[SeatRecord]]:
    q = sa.select(t.seats).order_by(t.seats.c.started_at, t.seats.c.seat_id)
    if seat_id is not None:
        q = q.where(t.seats.c.seat_id == seat_id)

    def fn(conn: Connection) -> list[SeatRecord]:
        return [_row_seat(r) for r in conn.execute(q)]

    return fn


def measurement_of(
    signature: str | Measurement,
    model: str | None,
    engine: str | None,
    footprint_json: Mapping[str, Any] | None,
    host_committed: int | None,
    host_mapped: int | None,
    total: int | None,
    source: str,
    measured_at: float | None,
) -> Measurement:
    if isinstance(signature, Measurement):
        if any(v is not None for v in (model, engine, footprint_json, host_committed, host_mapped, total, measured_at)):
            raise TypeError("put_measurement takes either one Measurement or the separate fields, not both")
        return signature
    if model is None or engine is None:
        raise TypeError("put_measurement needs model and engine (or one Measurement)")
    if not isinstance(footprint_json, Mapping):
        raise TypeError(f"footprint_json must be Footprint.to_json() (a dict), got {type(footprint_json).__name__}")
    return Measurement(
        signature=signature,
        model=model,
        engine=engine,
        measured_at=time.time() if measured_at is None else measured_at,
        footprint=dict(footprint_json),
        host_committed_bytes=host_committed,
        host_mapped_bytes=host_mapped,
        total_bytes=total,
        source=source,
    )
