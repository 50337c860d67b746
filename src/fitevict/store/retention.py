"""What the store keeps: history and load records within ``[logs]`` (by age and by rows), the space they leave
given back to the disk, and SQLite's write-ahead log checkpointed so that it does not grow without end.

- history events older than ``logs.history_days`` go, and an event goes once ``logs.history_rows`` newer ones were
  recorded (:func:`trim_events`: by id, at every recorded event as well as at each prune, so the bound holds
  between prunes too);
- engine-reported load records (``measurements``) older than that go too, but never a configuration's newest one:
  prices are made from it;
- seat peak windows and cached structures/compute figures older than that go (they are made again when needed).

One write function prunes it all in one transaction (the single writer); :func:`op_compact` then gives the freed
pages back to the disk (SQLite's ``auto_vacuum=INCREMENTAL``; on the writer, outside a transaction), and
:func:`checkpoint` truncates SQLite's WAL, which is when the file shrinks. PostgreSQL's space is its autovacuum's:
it reuses the room of deleted rows and gives the file's tail back; fitevict runs no VACUUM there.
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


def op_prune(now: float, history_days: float, history_rows: int) -> Callable[[Connection], Pruned]:
    """A write function: remove what ``[logs]`` no longer keeps (0 days or 0 rows: no bound of that kind)."""
    before = now - history_days * DAY if history_days > 0 else None
    rows = history_rows if history_rows > 0 else None

    def fn(conn: Connection) -> Pruned:
        events = _prune_events(conn, before, rows)
        if before is None:
            return Pruned(events=events, rows=rows)
        return Pruned(events=events, measurements=_prune_measurements(conn, before),
                      seat_peaks=_count(conn.execute(sa.delete(t.seat_peaks).where(t.seat_peaks.c.ended_at < before))),
                      caches=_count(conn.execute(sa.delete(t.compute_cache).where(t.compute_cache.c.created_at < before)))
                      + _count(conn.execute(sa.delete(t.gguf_structures).where(t.gguf_structures.c.parsed_at < before))),
                      before=before, rows=rows)

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


def _prune_measurements(conn: Connection, before: float) -> int:
    m = t.measurements
    newest = sa.select(sa.func.max(m.c.id)).group_by(m.c.signature).scalar_subquery()
    return _count(conn.execute(sa.delete(m).where(m.c.measured_at < before, m.c.id.not_in(newest))))


def op_compact(conn: Connection) -> str | None:
    """Give the pages that deletions freed back to the disk (SQLite; run on the writer *outside* a transaction:
    ``store.awrite(op_compact, transaction=False)``). A file made with ``auto_vacuum=INCREMENTAL``
    (``connect.make_engine`` asks for it before any table exists) hands its free pages back with ``PRAGMA
    incremental_vacuum``; an older file (``auto_vacuum=NONE``) is rebuilt once with ``VACUUM``, which makes it
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
    raw.executescript("PRAGMA incremental_vacuum")
    return f"{free} free page(s) of {page} B given back (incremental_vacuum)"


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


__all__ = ["DAY", "Pruned", "checkpoint", "op_compact", "op_prune", "trim_events"]
