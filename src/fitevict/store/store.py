"""The store: measurements, the compute-buffer cache, history and seats, in SQLite (WAL) or Postgres.

Concurrency design (one writer, as datasette does):

* Every write goes through one :class:`~fitevict.store.writer.Writer` thread that owns one
  connection and runs queued write functions one at a time, each in its own transaction.
* Every read takes a pooled connection; in WAL mode readers see the last committed data
  and never wait for the writer. A SQLite store opens its readers with the store (``connect.SQLITE_READERS``), so
  its descriptors do not climb with each new peak of reads at once.
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
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from fitevict.store.faults import READS, STORE_FAULTS, StoreFaults, reason
from fitevict.store.connect import (POSTGRES_DRIVER, StoreError, StoreFileLost, check_same_file, corrupt,
                                    default_url, file_identity, make_engine, move_aside_corrupt,
                                    move_aside_sidecars, open_readers)
from fitevict.store.migrations import MIGRATIONS, Migration, migrate
from fitevict.store.queries import (EVENT_SORT_COLUMNS, MAX_EVENTS_LIMIT, MEASUREMENT_SOURCES, Order, measurement_of,
                                    op_compute_put, op_put_measurement, op_record_event, op_seat_remove,
                                    op_seat_upsert, q_compute_get, q_events, q_last_measurement,
                                    q_newest_measurements, q_seats)
from fitevict.store.records import Event, Measurement, SeatRecord
from fitevict.store.retention import RowBounds
from fitevict.store.writer import Writer

T = TypeVar("T")
log = logging.getLogger("fitevict.store")

__all__ = ["EVENT_SORT_COLUMNS", "MAX_EVENTS_LIMIT", "MEASUREMENT_SOURCES", "POSTGRES_DRIVER", "AsyncStore", "Store",
           "StoreError", "default_url", "make_engine"]


class Store:
    """Facts and history. Open with :meth:`Store.open`; every method is safe from any thread."""

    def __init__(self, engine: Engine, writer: Writer) -> None:
        self._engine = engine
        self._writer = writer
        self.faults: StoreFaults = writer.faults  # what the store refused lately (``/health`` shows it)
        self.aio = AsyncStore(self)
        self._swap = threading.Lock()  # held while a corrupt file is replaced (``renew``)
        self._spec: tuple[str, float, tuple[Migration, ...]] | None = None  # how it was opened (``open``)
        self._renewing = False
        self.renewed: list[Callable[[], None]] = []  # called, on the renewing thread, after each ``renew``
        # at most this many history events: recording one removes those this many records older (logs.history_rows,
        # set by the server; None: no bound, as for a CLI command that opens the store)
        self.history_rows: int | None = None
        # load records and seat peak windows kept per configuration and in all (logs.records_per_signature,
        # logs.records_rows; set by the server): held at every record written
        self.row_bounds = RowBounds()
        writer.on_refused = self._refused

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        busy_timeout_s: float = 5.0,
        migrations: tuple[Migration, ...] = MIGRATIONS,
    ) -> "Store":
        """Open (creating if needed) the store at ``url`` (default :func:`default_url`) and migrate it. A SQLite
        file that is not a database (corrupt, or another file in its place) is moved aside, said in the log, and a new
        store starts in its place (``connect.move_aside_corrupt``)."""
        url = url or default_url()
        try:
            return cls._open(url, busy_timeout_s, migrations)
        except sa.exc.DatabaseError as e:
            aside = move_aside_corrupt(url, e)
            if aside is None:
                raise
            log.warning("the store %s could not be read (%s): moved aside to %s, its history and measurements kept "
                        "there unread; starting with a new, empty store", url, e.orig, aside)
        return cls._open(url, busy_timeout_s, migrations)

    @classmethod
    def _open(cls, url: str, busy_timeout_s: float, migrations: tuple[Migration, ...]) -> "Store":
        store = cls(*_connect(url, busy_timeout_s, migrations, StoreFaults()))
        store._spec = (url, busy_timeout_s, migrations)
        return store

    def _refused(self, error: BaseException) -> None:
        """A write or read was refused: a SQLite file found corrupt, deleted or replaced is renewed, off the refusing
        thread."""
        if self._spec is None or self._renewing or not (corrupt(self._spec[0], error)
                                                        or isinstance(error, StoreFileLost)):
            return
        self._renewing = True
        threading.Thread(target=self.renew, args=(error, self._writer), name="fitevict-store-renew",
                         daemon=True).start()

    def renew(self, error: BaseException, writer: Writer) -> Path | None:
        """The store's SQLite file found corrupt while fitevict runs (``error``), or deleted or replaced under it
        (``StoreFileLost``): the writer finishes what is queued, a corrupt file is moved aside as at start
        (``connect.move_aside_corrupt``: kept, unread), the store opens again at its path (a new, empty one, or the
        file put in place), and the ``renewed`` hooks run (the supervisor records its live seats again; the events
        held meanwhile are written by their retries). Returns where a corrupt file went, or the store's path for a
        lost one; None when it was renewed already, or could not be (logged: the store then refuses every write,
        and what it refuses is held or counted)."""
        assert self._spec is not None
        url, busy, migrations = self._spec
        try:
            with self._swap:
                if writer is not self._writer:
                    return None
                writer.close()
                self._engine.dispose()
                try:
                    aside = move_aside_corrupt(url, error)  # None for a lost file: nothing there to keep
                    sidecars = move_aside_sidecars(url) if aside is None else []
                    self._engine, self._writer = _connect(url, busy, migrations, self.faults)
                except (OSError, sa.exc.SQLAlchemyError, StoreError) as e:
                    log.error("the store %s could not be opened again after %s: %s; fitevict serves on, refusing "
                              "what it would store", self.url, reason(error), e)
                    return None
                self._writer.on_refused = self._refused
            self._say_renewed(error, aside, sidecars)
        finally:
            self._renewing = False
        for hook in self.renewed:
            hook()
        return aside or Path(sa.engine.make_url(url).database or "")

    def _say_renewed(self, error: BaseException, aside: Path | None, sidecars: list[Path]) -> None:
        """``renew`` is done: kept in ``faults`` (``/health``) and said in the log."""
        if aside is None:
            self.faults.lost_files.append({"at": time.time(), "reason": reason(error),
                                           "sidecars_moved_to": [str(p) for p in sidecars]})
            log.warning("%s: the store opened again at its path, where what was held meanwhile is written; what the "
                        "lost file held is gone with it (put it back from a copy to read it); its write-ahead log "
                        "files left at the path moved aside: %s", reason(error),
                        ", ".join(map(str, sidecars)) or "none")
            return
        self.faults.moved_aside.append({"at": time.time(), "to": str(aside), "reason": reason(error)})
        log.warning("the store %s was found corrupt while running (%s): moved aside to %s, its history and "
                    "measurements kept there unread; a new, empty store in its place, where what was held "
                    "meanwhile is written", self.url, reason(error), aside)

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
        with self._swap:
            self._writer.close()
            self._engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- generic ----
    def submit(self, fn: Callable[[Connection], T], *, transaction: bool = True) -> Future[T]:
        """Queue a write; ``fn(conn)`` runs on the writer thread inside a transaction (``transaction=False``: with
        none open, see ``Writer.submit``)."""
        with self._swap:
            return self._writer.submit(fn, transaction=transaction)

    def write(self, fn: Callable[[Connection], T], timeout: float | None = None) -> T:
        """Run ``fn(conn)`` on the writer in a transaction; block until it commits; return its result."""
        return self.submit(fn).result(timeout)

    async def awrite(self, fn: Callable[[Connection], T], *, transaction: bool = True) -> T:
        """:meth:`write` for async code: awaits the writer's future without holding a thread."""
        return await asyncio.wrap_future(self.submit(fn, transaction=transaction))

    def read(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn(conn)`` on a fresh read connection (sees the last committed data)."""
        with self._swap:
            engine = self._engine
        try:
            with engine.connect() as conn:
                return fn(conn)
        except STORE_FAULTS as e:
            self.faults.refuse(READS, e)
            self._refused(e)
            raise

    async def aread(self, fn: Callable[[Connection], T]) -> T:
        return await asyncio.to_thread(self.read, fn)

    # ---- history ----
    def record_event(self, event: Event) -> int:
        """Append one history event; returns its id (``event.id`` is ignored)."""
        return self.write(op_record_event(event, self.history_rows))

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
        return self.read(q_events(since, model, event, limit, order, until, sort_by))

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
        source: str = "engine-reported",
        measured_at: float | None = None,
    ) -> int:
        """Store an accepted measurement (run :func:`fitevict.guard.check_measurement` first); returns its id.

        Pass either the fields or one :class:`Measurement` (``put_measurement(m)``). ``measured_at``
        defaults to now. The host figures are None where they could not be read (stored as NULL).
        """
        m = measurement_of(signature, model, engine, footprint_json, host_committed, host_mapped, total, source, measured_at)
        return self.write(op_put_measurement(m, self.row_bounds))

    def last_measurement(self, signature: str) -> Measurement | None:
        """The newest measurement stored under ``signature``, or None."""
        return self.read(q_last_measurement(signature))

    def newest_measurements(self) -> dict[str, Measurement]:
        """The newest measurement of every signature, by signature (what ``last_measurement`` gives each one)."""
        return self.read(q_newest_measurements())

    # ---- compute-buffer cache ----
    def compute_get(self, key: str) -> dict[str, int] | None:
        """Cached dry-run compute buffers for ``key``: {device: bytes}, or None."""
        return self.read(q_compute_get(key))

    def compute_put(self, key: str, value: Mapping[str, int]) -> None:
        """Cache {device: bytes} under ``key`` (replacing any previous value)."""
        self.write(op_compute_put(key, value))

    # ---- seats ----
    def seat_upsert(self, seat: SeatRecord) -> None:
        self.write(op_seat_upsert(seat))

    def seat_remove(self, seat_id: str) -> bool:
        """Forget a seat; True if it was there."""
        return self.write(op_seat_remove(seat_id))

    def seats(self) -> list[SeatRecord]:
        """Every recorded seat, oldest first."""
        return self.read(q_seats())

    def seat(self, seat_id: str) -> SeatRecord | None:
        found = self.read(q_seats(seat_id))
        return found[0] if found else None


def _connect(url: str, busy_timeout_s: float, migrations: tuple[Migration, ...], faults: StoreFaults
             ) -> tuple[Engine, Writer]:
    """A migrated engine for ``url`` and its writer, counting refusals into ``faults``."""
    engine = make_engine(url, busy_timeout_s=busy_timeout_s)
    try:
        with engine.connect().execution_options(fitevict_begin="IMMEDIATE") as conn:
            migrate(conn, migrations, where=f" at {engine.url.render_as_string(hide_password=True)}")
        identity = file_identity(url)  # a write goes to this file only (``connect.check_same_file``)
        writer = Writer(engine, faults=faults, guard=lambda: check_same_file(url, identity))
        try:
            open_readers(engine)  # after the writer holds its connection: the pool keeps exactly the readers
        except BaseException:
            writer.close()
            raise
        return engine, writer
    except BaseException:
        engine.dispose()
        raise


class AsyncStore:
    """The same operations as :class:`Store`, as coroutines (``store.aio``)."""

    def __init__(self, store: Store) -> None:
        self._s = store

    async def record_event(self, event: Event) -> int:
        return await self._s.awrite(op_record_event(event, self._s.history_rows))

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
        return await self._s.aread(q_events(since, model, event, limit, order, until, sort_by))

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
        source: str = "engine-reported",
        measured_at: float | None = None,
    ) -> int:
        m = measurement_of(signature, model, engine, footprint_json, host_committed, host_mapped, total, source, measured_at)
        return await self._s.awrite(op_put_measurement(m, self._s.row_bounds))

    async def last_measurement(self, signature: str) -> Measurement | None:
        return await self._s.aread(q_last_measurement(signature))

    async def compute_get(self, key: str) -> dict[str, int] | None:
        return await self._s.aread(q_compute_get(key))

    async def compute_put(self, key: str, value: Mapping[str, int]) -> None:
        await self._s.awrite(op_compute_put(key, value))

    async def seat_upsert(self, seat: SeatRecord) -> None:
        await self._s.awrite(op_seat_upsert(seat))

    async def seat_remove(self, seat_id: str) -> bool:
        return await self._s.awrite(op_seat_remove(seat_id))

    async def seats(self) -> list[SeatRecord]:
        return await self._s.aread(q_seats())

    async def seat(self, seat_id: str) -> SeatRecord | None:
        found = await self._s.aread(q_seats(seat_id))
        return found[0] if found else None
