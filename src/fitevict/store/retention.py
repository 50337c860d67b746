"""What the store keeps: every table that grows with traffic within ``[logs]``, by age and by rows, the space they
leave given back to the disk, and SQLite's write-ahead log checkpointed so that it does not grow without end.

- history events older than ``logs.history_days`` go, and an event goes once ``logs.history_rows`` newer ones were
  recorded (:func:`trim_events`: by id, at every recorded event as well as at each prune, so the bound holds
  between prunes too);
- engine-reported load records (``measurements``) older than that go too, but never a configuration's newest one:
  prices are made from it; and, by rows (``RowBounds``), only the newest ``logs.records_per_signature`` of each
  configuration stay, and at most ``logs.records_rows`` in all (the oldest first), held at every record written;
- seat peak windows likewise: by age, the newest ``logs.records_per_signature`` per model and configuration, at most
  ``logs.records_rows`` in all, held at every window written;
- cached structures and compute figures older than ``logs.history_days`` go, and at each prune all but the newest
  ``logs.records_rows`` of each cache (they are made again when needed).

One write function prunes it all in one transaction (the single writer); :func:`op_compact` then gives the freed
pages back to the disk in steps of ``COMPACT_STEP_PAGES`` (SQLite's ``auto_vacuum=INCREMENTAL``; on the writer,
outside a transaction), each step one write, so that writes queued meanwhile run between steps rather than wait for
the whole; :func:`checkpoint` truncates SQLite's WAL, which is when the file shrinks. PostgreSQL's space is its
autovacuum's: it reuses the room of deleted rows and gives the file's tail back; fitevict runs no VACUUM there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from fitevict.store import schema as t
from fitevict.store.connect import INCREMENTAL

DAY = 86_400.0
COMPACT_STEP_PAGES = 1024  # pages one compaction step gives back (4 MiB at SQLite's default 4 KiB page)


@dataclass(frozen=True, slots=True)
class RowBounds:
    """The row bounds of load records and seat peak windows (the newest ``per_signature`` of each configuration, at
    most ``rows`` of each table) and of each cache (at most ``rows``). None: no bound of that kind."""

    per_signature: int | None = None
    rows: int | None = None

    @staticmethod
    def of(per_signature: int, rows: int) -> "RowBounds":
        """From ``[logs]`` figures, where 0 means no bound."""
        return RowBounds(per_signature or None, rows or None)


@dataclass(frozen=True, slots=True)
class Pruned:
    """Rows one prune removed, by table, and the bounds it pruned to."""

    events: int = 0
    measurements: int = 0
    seat_peaks: int = 0
    caches: int = 0
    before: float | None = None  # rows older than this time went (None: no bound by age)
    rows: int | None = None  # at most this many history events are kept (None: no bound)

    @property
    def total(self) -> int:
        return self.events + self.measurements + self.seat_peaks + self.caches

    def reason(self) -> str:
        bounds = []
        if self.before is not None:
            bounds.append(f"older than {self.before:.0f} (unix time)")
        if self.rows is not None:
            bounds.append(f"beyond the newest {self.rows} history events")
        return (f"pruned {self.events} history event(s), {self.measurements} load record(s), {self.seat_peaks} seat "
                f"peak window(s) and {self.caches} cached figure(s): {' and '.join(bounds) or 'no bound'} "
                "(logs.history_days, logs.history_rows)")


def op_prune(now: float, history_days: float, history_rows: int,
             bounds: RowBounds = RowBounds()) -> Callable[[Connection], Pruned]:
    """A write function: remove what ``[logs]`` no longer keeps (0 days or 0 rows: no bound of that kind)."""
    before = now - history_days * DAY if history_days > 0 else None
    rows = history_rows if history_rows > 0 else None

    def fn(conn: Connection) -> Pruned:
        events = _prune_events(conn, before, rows)
        aged = {"measurements": 0, "seat_peaks": 0, "caches": 0}
        if before is not None:
            aged = {"measurements": _prune_measurements(conn, before),
                    "seat_peaks": _count(conn.execute(sa.delete(t.seat_peaks).where(t.seat_peaks.c.ended_at < before))),
                    "caches": _count(conn.execute(sa.delete(t.compute_cache).where(t.compute_cache.c.created_at < before)))
                    + _count(conn.execute(sa.delete(t.gguf_structures).where(t.gguf_structures.c.parsed_at < before)))}
        return Pruned(events=events, measurements=aged["measurements"] + trim_measurements(conn, bounds),
                      seat_peaks=aged["seat_peaks"] + trim_peaks(conn, bounds),
                      caches=aged["caches"] + trim_caches(conn, bounds.rows), before=before, rows=rows)

    return fn


def _count(result: Any) -> int:
    return max(int(result.rowcount or 0), 0)


def _prune_events(conn: Connection, before: float | None, rows: int | None) -> int:
    e = t.events
    n = _count(conn.execute(sa.delete(e).where(e.c.time < before))) if before is not None else 0
    if rows is not None:
        n += trim_events(conn, rows)
    return n


def trim_events(conn: Connection, rows: int, newest_id: int | None = None) -> int:
    """The history's row bound: an event goes once ``rows`` newer ones were recorded (ids count the records, so the
    table holds at most ``rows`` events). One range delete on the primary key, cheap enough for every recorded event;
    ``newest_id``: the id just recorded (else read). Returns how many went."""
    e = t.events
    if newest_id is None:
        newest_id = conn.execute(sa.select(sa.func.max(e.c.id))).scalar()
        if newest_id is None:
            return 0
    return _count(conn.execute(sa.delete(e).where(e.c.id <= newest_id - rows)))


_PEAK_KEYS = ("model", "config_json")  # a seat peak window's configuration


def trim_measurements(conn: Connection, bounds: RowBounds, signature: str | None = None) -> int:
    """Load records beyond ``bounds``: of ``signature`` (the one just written) or of every configuration, then the
    oldest beyond the table's bound. Returns how many went."""
    m = t.measurements
    n = _keep_newest(conn, m, (m.c.signature,), (signature,) if signature is not None else None,
                     bounds.per_signature)
    return n + _trim_rows(conn, m, bounds.rows)


def trim_peaks(conn: Connection, bounds: RowBounds, key: tuple[str, str] | None = None) -> int:
    """Seat peak windows beyond ``bounds``: of ``key`` (model, config_json: the window just written) or of every
    configuration, then the oldest beyond the table's bound. Returns how many went."""
    p = t.seat_peaks
    n = _keep_newest(conn, p, tuple(p.c[k] for k in _PEAK_KEYS), key, bounds.per_signature)
    return n + _trim_rows(conn, p, bounds.rows)


def trim_caches(conn: Connection, rows: int | None) -> int:
    """All but the newest ``rows`` of each cache (compute figures, GGUF structures; ties at the cut go too)."""
    if rows is None:
        return 0
    n = 0
    for col in (t.compute_cache.c.created_at, t.gguf_structures.c.parsed_at):
        cut = sa.select(col).order_by(col.desc()).offset(rows).limit(1).scalar_subquery()
        n += _count(conn.execute(sa.delete(col.table).where(col <= cut)))
    return n


def _keep_newest(conn: Connection, table: Any, keys: tuple[Any, ...], values: tuple[Any, ...] | None,
                 n: int | None) -> int:
    """Delete all but the newest ``n`` rows (by id) of each group of ``keys``: of the one group ``values`` names (an
    indexed range, cheap enough for every write), or of all (one pass with ``row_number()``)."""
    if n is None:
        return 0
    if values is not None:
        same = sa.and_(*(k == v for k, v in zip(keys, values)))
        newest = sa.select(table.c.id).where(same).order_by(table.c.id.desc()).limit(n)
        return _count(conn.execute(sa.delete(table).where(same, table.c.id.not_in(newest))))
    rank = sa.func.row_number().over(partition_by=keys, order_by=table.c.id.desc()).label("rank")
    ranked = sa.select(table.c.id, rank).subquery()
    return _count(conn.execute(sa.delete(table).where(
        table.c.id.in_(sa.select(ranked.c.id).where(ranked.c.rank > n)))))


def _trim_rows(conn: Connection, table: Any, rows: int | None) -> int:
    """At most ``rows`` rows, the newest by id (ids have gaps where groups were trimmed: the cut is read, not
    computed)."""
    if rows is None:
        return 0
    cut = sa.select(table.c.id).order_by(table.c.id.desc()).offset(rows).limit(1).scalar_subquery()
    return _count(conn.execute(sa.delete(table).where(table.c.id <= cut)))


def _prune_measurements(conn: Connection, before: float) -> int:
    m = t.measurements
    newest = sa.select(sa.func.max(m.c.id)).group_by(m.c.signature).scalar_subquery()
    return _count(conn.execute(sa.delete(m).where(m.c.measured_at < before, m.c.id.not_in(newest))))


def op_compact(conn: Connection) -> str | None:
    """Give the pages that deletions freed back to the disk (SQLite; run on the writer *outside* a transaction:
    ``store.awrite(op_compact, transaction=False)``). A file made with ``auto_vacuum=INCREMENTAL``
    (``connect.make_engine`` asks for it before any table exists) hands back at most ``COMPACT_STEP_PAGES`` of its
    free pages per call with ``PRAGMA incremental_vacuum(N)``: call it again, as a new write, until it returns None
    (``compact``), so that the writes queued meanwhile are not held behind the whole; an older file (``auto_vacuum=NONE``) is rebuilt once with ``VACUUM``, which makes it
    INCREMENTAL from then on. The file shrinks at the next WAL checkpoint (:func:`checkpoint`). Returns what happened,
    for the log; None when nothing was to be given back, or for a server database (its space is its autovacuum's)."""
    if conn.dialect.name != "sqlite":
        return None
    raw = conn.connection.driver_connection  # the sqlite3 connection: executescript steps a PRAGMA to its end
    mode, free, page = (raw.execute(f"PRAGMA {p}").fetchone()[0] for p in ("auto_vacuum", "freelist_count",
                                                                           "page_size"))
    if mode != INCREMENTAL:
        pages = raw.execute("PRAGMA page_count").fetchone()[0]
        raw.executescript(f"PRAGMA auto_vacuum={INCREMENTAL}; VACUUM")
        after = raw.execute("PRAGMA page_count").fetchone()[0]
        return (f"rebuilt once with VACUUM to give space back from now on (auto_vacuum was {mode}, now INCREMENTAL): "
                f"{pages} -> {after} pages of {page} B ({free} were free)")
    if not free:
        return None
    step = min(free, COMPACT_STEP_PAGES)
    raw.executescript(f"PRAGMA incremental_vacuum({step})")
    return f"{step} free page(s) of {page} B given back (incremental_vacuum), {free - step} left"


async def compact(awrite: Callable[..., Any], max_steps: int = 100_000) -> list[str]:
    """Give every free page back, one step (``op_compact``) per write on the single writer (``awrite``: the store's
    ``awrite``), so that other writes run between steps. Returns what each step said."""
    said: list[str] = []
    while len(said) < max_steps and (step := await awrite(op_compact, transaction=False)) is not None:
        said.append(step)
    return said


def checkpoint(engine: Engine) -> str | None:
    """Truncate SQLite's write-ahead log (``PRAGMA wal_checkpoint(TRUNCATE)``) on a connection of its own, outside any
    transaction. Returns what happened, for the log; ``None`` for a server database (it has no such file)."""
    if engine.dialect.name != "sqlite":
        return None
    raw = engine.raw_connection()
    try:
        busy, pages, done = raw.cursor().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        raw.close()
    if busy:
        return f"write-ahead log not truncated: a reader or writer held it ({done} of {pages} pages copied back)"
    return "write-ahead log checkpointed and truncated"


__all__ = ["COMPACT_STEP_PAGES", "DAY", "Pruned", "RowBounds", "checkpoint", "compact", "op_compact", "op_prune", "trim_caches",
           "trim_events", "trim_measurements", "trim_peaks"]
