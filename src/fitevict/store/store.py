"""The store: measurements, the compute-buffer cache, history and seats, in SQLite (WAL) or Postgres.

Concurrency design (one writer, as datasette does):

* Every write goes through one :class:`~fitevict.store.writer.Writer` thread that owns one
  connection and runs queued write functions one at a time, each in its own transaction.
* Every read opens its own pooled connection; in WAL mode readers see the last committed data
  and never wait for the writer.
* The public methods are synchronous and safe to call from any thread: a write blocks the caller
  until the writer has committed it (or re-raises its error). Async code uses ``store.aio``, the
  same methods as coroutines: writes await the writer's future without holding a thread, reads
  run in ``asyncio.to_thread``.
* ``submit``/``write``/``awrite`` and ``read``/``aread`` take ``fn(conn)`` for anything the named
  methods do not cover. Queries are SQLAlchemy Core with bound parameters; sort columns and
  directions come from whitelists, never from user text.

Both backends behave alike: upserts are one atomic ``INSERT ... ON CONFLICT DO UPDATE`` (another
process may write the same database), history sorts put unavailable figures (NULL) last in either
direction and compare text byte by byte (``COLLATE "C"`` on PostgreSQL, SQLite's BINARY), and
migrations are serialised between processes (see :mod:`fitevict.store.migrations`).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Literal, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Engine, make_url

from fitevict.paths import data_dir
from fitevict.pricing.footprint import SOURCES
from fitevict.store import schema as t
from fitevict.store.migrations import MIGRATIONS, Migration, migrate
from fitevict.store.records import EVENTS, Event, Measurement, Seat
from fitevict.store.writer import Writer

T = TypeVar("T")
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


class StoreError(RuntimeError):
    """The store cannot be opened or used as configured."""


def default_url() -> str:
    """``sqlite:///<data_dir>/fitevict.db`` (an absolute path, so four slashes)."""
    return f"sqlite:///{(data_dir() / 'fitevict.db').resolve()}"


def make_engine(url: str, *, busy_timeout_s: float = 5.0) -> Engine:
    """A SQLAlchemy engine for ``url``. SQLite: parent directories created, WAL, synchronous=NORMAL,
    busy_timeout, foreign_keys on, and real transactions (fitevict issues BEGIN itself, so DDL is
    transactional and the writer takes the write lock up front with BEGIN IMMEDIATE). PostgreSQL:
    see :func:`_postgres_engine` (its driver opens transactions itself; DDL is transactional there too).
    Any other backend raises :class:`StoreError`."""
    u = make_url(url)
    backend = u.get_backend_name()
    if backend == "postgresql":
        return _postgres_engine(u)
    if backend != "sqlite":
        raise StoreError(
            f"store URL {u.render_as_string(hide_password=True)!r} names the backend {backend!r}; the store runs on "
            "SQLite (sqlite:////path/to/fitevict.db) or PostgreSQL (postgresql+psycopg://user:pass@host/db)"
        )
    db = u.database or ""
    if db in ("", ":memory:") or "mode=memory" in db:
        raise StoreError(
            f"store URL {url!r} is an in-memory SQLite database, which each connection sees separately; "
            "the store needs a file (one writer, many readers). Use sqlite:////path/to/fitevict.db"
        )
    Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(u, connect_args={"timeout": busy_timeout_s})
    busy_ms = int(busy_timeout_s * 1000)

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # no implicit BEGIN from the driver; see _on_begin
        cur = dbapi_conn.cursor()
        try:
            mode = cur.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(
                    f"SQLite refused WAL mode for {db} (journal_mode is {mode!r}); WAL needs a local filesystem "
                    "that supports shared memory. Put the store on a local disk, or use Postgres by URL."
                )
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute(f"PRAGMA busy_timeout={busy_ms:d}")
            cur.execute("PRAGMA foreign_keys=ON")
        finally:
            cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get("fitevict_begin") == "IMMEDIATE"
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


POSTGRES_DRIVER = "psycopg"
"""The driver a bare ``postgresql://`` URL gets (psycopg 3: ``pip install 'fitevict[postgres]'``)."""


def _postgres_engine(u: sa.URL) -> Engine:
    """PostgreSQL: psycopg 3 unless the URL names another driver; connections checked before use, so a
    restarted server costs a reconnect rather than an error; fitevict's name in ``pg_stat_activity``."""
    if u.drivername == "postgresql":
        u = u.set(drivername=f"postgresql+{POSTGRES_DRIVER}")
    connect_args: dict[str, Any] = {}
    if "application_name" not in u.query:
        connect_args["application_name"] = "fitevict"
    if "connect_timeout" not in u.query:
        connect_args["connect_timeout"] = 10
    try:
        return sa.create_engine(u, pool_pre_ping=True, connect_args=connect_args)
    except ImportError as e:
        raise StoreError(
            f"store URL {u.render_as_string(hide_password=True)!r} needs the PostgreSQL driver {u.get_driver_name()!r}, "
            f"which is not installed ({e}). Install fitevict with its postgres extra: pip install 'fitevict[postgres]' "
            "(psycopg 3), and use postgresql:// or postgresql+psycopg://"
        ) from e


def _dumps(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} is not JSON-serialisable (plain dicts, lists, str, int, finite floats): {e}") from e


# ---- operations: each builder validates in the caller's thread and returns fn(conn) ----


def _op_record_event(ev: Event) -> Callable[[Connection], int]:
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
        "measured_bytes": ev.measured_bytes,
        "details_json": _dumps(dict(ev.details), "Event.details"),
    }

    def fn(conn: Connection) -> int:
        return int(conn.execute(sa.insert(t.events).values(**values).returning(t.events.c.id)).scalar_one())

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
        measured_bytes=r.measured_bytes,
        details=json.loads(r.details_json),
    )


def _finite(name: str, v: object) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{name} must be unix seconds (a finite number) or None, got {v!r}")
    return float(v)


def _q_events(
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


def _op_put_measurement(m: Measurement) -> Callable[[Connection], int]:
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
        return int(conn.execute(stmt).scalar_one())

    return fn


def _q_last_measurement(signature: str) -> Callable[[Connection], Measurement | None]:
    c = t.measurements.c
    q = (
        sa.select(t.measurements)
        .where(c.signature == signature)
        .order_by(sa.desc(c.measured_at), sa.desc(c.id))
        .limit(1)
    )

    def fn(conn: Connection) -> Measurement | None:
        r = conn.execute(q).first()
        if r is None:
            return None
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

    return fn


def _q_compute_get(key: str) -> Callable[[Connection], dict[str, int] | None]:
    q = sa.select(t.compute_cache.c.value_json).where(t.compute_cache.c.key == key)

    def fn(conn: Connection) -> dict[str, int] | None:
        v = conn.execute(q).scalar_one_or_none()
        return None if v is None else json.loads(v)

    return fn


_UPSERT_INSERTS = {"sqlite": sqlite_insert, "postgresql": postgresql_insert}


def _upsert(table: sa.TableClause, key_col: str, values: dict[str, Any]) -> Callable[[Connection], None]:
    """One atomic ``INSERT ... ON CONFLICT (key) DO UPDATE``. An UPDATE-then-INSERT is not enough on
    PostgreSQL: another process's uncommitted insert of the same key is invisible to the UPDATE, and
    the INSERT then fails on the key once that process commits."""
    rest = [k for k in values if k != key_col]

    def fn(conn: Connection) -> None:
        stmt = _UPSERT_INSERTS[conn.dialect.name](table).values(**values)
        conn.execute(stmt.on_conflict_do_update(index_elements=[key_col], set_={k: stmt.excluded[k] for k in rest}))

    return fn


def _op_compute_put(key: str, value: Mapping[str, int]) -> Callable[[Connection], None]:
    if not key:
        raise ValueError("compute cache key must not be empty")
    for dev, n in value.items():
        if not isinstance(dev, str) or isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(
                f"compute cache value for {key!r} must map device name -> bytes (int >= 0); got {dev!r}: {n!r}"
            )
    vals = {"key": key, "value_json": _dumps(dict(value), "compute cache value"), "created_at": time.time()}
    return _upsert(t.compute_cache, "key", vals)


def _op_seat_upsert(seat: Seat) -> Callable[[Connection], None]:
    if not isinstance(seat, Seat):
        raise TypeError(f"seat_upsert takes a Seat, got {type(seat).__name__}")
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
        "config_json": _dumps(dict(seat.config), "Seat.config"),
        "fitevict_pid": seat.fitevict_pid,
    }
    return _upsert(t.seats, "seat_id", vals)


def _op_seat_remove(seat_id: str) -> Callable[[Connection], bool]:
    def fn(conn: Connection) -> bool:
        return conn.execute(sa.delete(t.seats).where(t.seats.c.seat_id == seat_id)).rowcount > 0

    return fn


def _row_seat(r: sa.Row) -> Seat:
    return Seat(
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


def _q_seats(seat_id: str | None = None) -> Callable[[Connection], list[Seat]]:
    q = sa.select(t.seats).order_by(t.seats.c.started_at, t.seats.c.seat_id)
    if seat_id is not None:
        q = q.where(t.seats.c.seat_id == seat_id)

    def fn(conn: Connection) -> list[Seat]:
        return [_row_seat(r) for r in conn.execute(q)]

    return fn


def _measurement(
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


class Store:
    """Facts and history. Open with :meth:`Store.open`; every method is safe from any thread."""

    def __init__(self, engine: Engine, writer: Writer) -> None:
        self._engine = engine
        self._writer = writer
        self.aio = AsyncStore(self)

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        busy_timeout_s: float = 5.0,
        migrations: tuple[Migration, ...] = MIGRATIONS,
    ) -> "Store":
        """Open (creating if needed) the store at ``url`` (default :func:`default_url`) and migrate it."""
        engine = make_engine(url or default_url(), busy_timeout_s=busy_timeout_s)
        try:
            with engine.connect().execution_options(fitevict_begin="IMMEDIATE") as conn:
                migrate(conn, migrations, where=f" at {engine.url.render_as_string(hide_password=True)}")
            writer = Writer(engine)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, writer)

    @property
    def url(self) -> str:
        return self._engine.url.render_as_string(hide_password=True)

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def writer_thread_ident(self) -> int | None:
        """The writer thread's ident (every write runs there)."""
        return self._writer.thread_ident

    def close(self) -> None:
        """Finish queued writes, stop the writer, close connections. Idempotent."""
        self._writer.close()
        self._engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- generic ----
    def submit(self, fn: Callable[[Connection], T]) -> Future[T]:
        """Queue a write; ``fn(conn)`` runs on the writer thread inside a transaction."""
        return self._writer.submit(fn)

    def write(self, fn: Callable[[Connection], T], timeout: float | None = None) -> T:
        """Run ``fn(conn)`` on the writer in a transaction; block until it commits; return its result."""
        return self._writer.submit(fn).result(timeout)

    async def awrite(self, fn: Callable[[Connection], T]) -> T:
        """:meth:`write` for async code: awaits the writer's future without holding a thread."""
        return await asyncio.wrap_future(self._writer.submit(fn))

    def read(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn(conn)`` on a fresh read connection (sees the last committed data)."""
        with self._engine.connect() as conn:
            return fn(conn)

    async def aread(self, fn: Callable[[Connection], T]) -> T:
        return await asyncio.to_thread(self.read, fn)

    # ---- history ----
    def record_event(self, event: Event) -> int:
        """Append one history event; returns its id (``event.id`` is ignored)."""
        return self.write(_op_record_event(event))

    def events(
        self,
        since: float | None = None,
        model: str | None = None,
        event: str | None = None,
        limit: int = 100,
        order: Order = "desc",
        *,
        until: float | None = None,
        sort_by: str = "time",
    ) -> list[Event]:
        """History with ``since <= time < until``, optionally one model and/or one event kind.

        ``limit`` is 1..MAX_EVENTS_LIMIT; ``sort_by`` is one of EVENT_SORT_COLUMNS; ties go by id.
        """
        return self.read(_q_events(since, model, event, limit, order, until, sort_by))

    # ---- measurements ----
    def put_measurement(
        self,
        signature: str | Measurement,
        model: str | None = None,
        engine: str | None = None,
        footprint_json: Mapping[str, Any] | None = None,
        host_committed: int | None = None,
        host_mapped: int | None = None,
        total: int | None = None,
        *,
        source: str = "measured",
        measured_at: float | None = None,
    ) -> int:
        """Store an accepted measurement (run :func:`fitevict.guard.check_measurement` first); returns its id.

        Pass either the fields or one :class:`Measurement` (``put_measurement(m)``). ``measured_at``
        defaults to now. The host figures are None where they could not be read (stored as NULL).
        """
        m = _measurement(signature, model, engine, footprint_json, host_committed, host_mapped, total, source, measured_at)
        return self.write(_op_put_measurement(m))

    def last_measurement(self, signature: str) -> Measurement | None:
        """The newest measurement stored under ``signature``, or None."""
        return self.read(_q_last_measurement(signature))

    # ---- compute-buffer cache ----
    def compute_get(self, key: str) -> dict[str, int] | None:
        """Cached dry-run compute buffers for ``key``: {device: bytes}, or None."""
        return self.read(_q_compute_get(key))

    def compute_put(self, key: str, value: Mapping[str, int]) -> None:
        """Cache {device: bytes} under ``key`` (replacing any previous value)."""
        self.write(_op_compute_put(key, value))

    # ---- seats ----
    def seat_upsert(self, seat: Seat) -> None:
        self.write(_op_seat_upsert(seat))

    def seat_remove(self, seat_id: str) -> bool:
        """Forget a seat; True if it was there."""
        return self.write(_op_seat_remove(seat_id))

    def seats(self) -> list[Seat]:
        """Every recorded seat, oldest first."""
        return self.read(_q_seats())

    def seat(self, seat_id: str) -> Seat | None:
        found = self.read(_q_seats(seat_id))
        return found[0] if found else None


class AsyncStore:
    """The same operations as :class:`Store`, as coroutines (``store.aio``)."""

    def __init__(self, store: Store) -> None:
        self._s = store

    async def record_event(self, event: Event) -> int:
        return await self._s.awrite(_op_record_event(event))

    async def events(
        self,
        since: float | None = None,
        model: str | None = None,
        event: str | None = None,
        limit: int = 100,
        order: Order = "desc",
        *,
        until: float | None = None,
        sort_by: str = "time",
    ) -> list[Event]:
        return await self._s.aread(_q_events(since, model, event, limit, order, until, sort_by))

    async def put_measurement(
        self,
        signature: str | Measurement,
        model: str | None = None,
        engine: str | None = None,
        footprint_json: Mapping[str, Any] | None = None,
        host_committed: int | None = None,
        host_mapped: int | None = None,
        total: int | None = None,
        *,
        source: str = "measured",
        measured_at: float | None = None,
    ) -> int:
        m = _measurement(signature, model, engine, footprint_json, host_committed, host_mapped, total, source, measured_at)
        return await self._s.awrite(_op_put_measurement(m))

    async def last_measurement(self, signature: str) -> Measurement | None:
        return await self._s.aread(_q_last_measurement(signature))

    async def compute_get(self, key: str) -> dict[str, int] | None:
        return await self._s.aread(_q_compute_get(key))

    async def compute_put(self, key: str, value: Mapping[str, int]) -> None:
        await self._s.awrite(_op_compute_put(key, value))

    async def seat_upsert(self, seat: Seat) -> None:
        await self._s.awrite(_op_seat_upsert(seat))

    async def seat_remove(self, seat_id: str) -> bool:
        return await self._s.awrite(_op_seat_remove(seat_id))

    async def seats(self) -> list[Seat]:
        return await self._s.aread(_q_seats())

    async def seat(self, seat_id: str) -> Seat | None:
        found = await self._s.aread(_q_seats(seat_id))
        return found[0] if found else None
