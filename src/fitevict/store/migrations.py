"""Numbered schema migrations.

``MIGRATIONS`` is an ordered list of ``Migration(number, name, apply)``; ``apply(conn)`` runs
inside the one transaction that :func:`migrate` opens at store open. Each migration carries its
own table definitions, frozen as they were when it was written: never edit a released migration,
append a new one. ``schema_migrations`` records what has been applied, so reopening applies nothing.
A database that has a number this code does not know was written by a newer fitevict: refused.

Two fitevict processes may open one database at once. On SQLite the migration transaction starts
with ``BEGIN IMMEDIATE`` (the write lock), so the second waits. On PostgreSQL it first takes the
transaction-scoped advisory lock :data:`MIGRATION_LOCK_KEY`: without it both would see no
``schema_migrations`` table and both would create it, and the second would fail on a duplicate key.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from fitevict.store.records import EVENTS


MIGRATION_LOCK_KEY: int = int.from_bytes(hashlib.sha256(b"fitevict.store.migrate").digest()[:8], "big", signed=True)
"""The PostgreSQL advisory lock (``pg_advisory_xact_lock``) every fitevict takes before migrating a database."""


class StoreVersionError(RuntimeError):
    """The database's schema is not one this fitevict can use."""


@dataclass(frozen=True, slots=True)
class Migration:
    number: int
    name: str
    apply: Callable[[Connection], None]


def _id_column() -> sa.Column:
    # BIGINT on Postgres; INTEGER on SQLite so the column is the rowid alias and autoincrements.
    return sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True)


def _m0001_initial(conn: Connection) -> None:
    md = sa.MetaData()
    big = sa.BigInteger
    sa.Table(
        "measurements",
        md,
        _id_column(),
        sa.Column("signature", sa.Text, nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("engine", sa.Text, nullable=False),
        sa.Column("measured_at", sa.Float, nullable=False),
        sa.Column("footprint_json", sa.Text, nullable=False),
        sa.Column("host_committed_bytes", big, nullable=True),
        sa.Column("host_mapped_bytes", big, nullable=True),
        sa.Column("total_bytes", big, nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Index("ix_measurements_signature_time", "signature", "measured_at"),
    )
    sa.Table(
        "compute_cache",
        md,
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("value_json", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    vocabulary = ", ".join(f"'{e}'" for e in V1_EVENTS)  # constants of this module, not user input
    sa.Table(
        "events",
        md,
        _id_column(),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("event", sa.Text, nullable=False),
        sa.Column("model", sa.Text, nullable=True),
        sa.Column("engine", sa.Text, nullable=True),
        sa.Column("seconds", sa.Float, nullable=True),
        sa.Column("vram_bytes", big, nullable=True),
        sa.Column("host_bytes", big, nullable=True),
        sa.Column("offloaded_bytes", big, nullable=True),
        sa.Column("strategy", sa.Text, nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("freed_bytes", big, nullable=True),
        sa.Column("request_id", sa.Text, nullable=True),
        sa.Column("predicted_bytes", big, nullable=True),
        sa.Column("measured_bytes", big, nullable=True),
        sa.Column("details_json", sa.Text, nullable=False),
        sa.CheckConstraint(f"event IN ({vocabulary})", name="ck_events_event"),
        sa.Index("ix_events_time", "time"),
        sa.Index("ix_events_model_time", "model", "time"),
        sa.Index("ix_events_event_time", "event", "time"),
    )
    sa.Table(
        "seats",
        md,
        sa.Column("seat_id", sa.Text, primary_key=True),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("engine", sa.Text, nullable=False),
        sa.Column("pid", sa.Integer, nullable=True),
        sa.Column("pgid", sa.Integer, nullable=True),
        sa.Column("port", sa.Integer, nullable=True),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("log_path", sa.Text, nullable=True),
        sa.Column("config_json", sa.Text, nullable=False),
        sa.Column("fitevict_pid", sa.Integer, nullable=False),
    )
    md.create_all(conn)


# The history vocabulary as migration 1 wrote it; later vocabularies come with a migration of their own.
V1_EVENTS: tuple[str, ...] = ("load", "evict", "unload", "idle-unload", "fail", "refuse", "crash", "orphan")


V2_EVENTS: tuple[str, ...] = (*V1_EVENTS[:5], "reject", *V1_EVENTS[5:], "leak")


def _m0002_events_vocabulary(conn: Connection) -> None:
    """``reject`` (a measurement the guard refused) and ``leak`` join the history vocabulary."""
    _events_vocabulary(conn, V2_EVENTS)


V4_EVENTS: tuple[str, ...] = (*V2_EVENTS, "pressure", "kv-restore")


def _m0004_pressure_event(conn: Connection) -> None:
    """``pressure`` (memory given back to other programs) and ``kv-restore`` (a saved prompt restored) join the
    history vocabulary."""
    _events_vocabulary(conn, V4_EVENTS)


V6_EVENTS: tuple[str, ...] = (*V4_EVENTS, "outgrew")


def _m0006_outgrew_event(conn: Connection) -> None:
    """``outgrew`` (a seat whose reading exceeded its price by more than budget.outgrow_margin) joins the history
    vocabulary."""
    _events_vocabulary(conn, V6_EVENTS)


def _m0007_recycle_event(conn: Connection) -> None:
    """``recycle`` (a seat outgrowing its price, drained and stopped to be loaded again: policy.recycle_outgrown)
    joins the history vocabulary."""
    _events_vocabulary(conn, EVENTS)


def _m0008_event_figures(conn: Connection) -> None:
    """The events table's byte figures named for what they hold. ``measured_bytes`` held the buffers the engine
    reported (a load's), and an ``outgrew`` event's reading: it becomes ``engine_reported_bytes``. ``predicted_bytes``
    is the whole price a seat is planned at, and the new ``buffers_predicted_bytes`` the engine buffers alone as
    priced. Rows written before: a ``load``, ``reject`` or ``fail`` kept the buffers alone in ``predicted_bytes``:
    they move to ``buffers_predicted_bytes``, and ``predicted_bytes`` becomes the whole price of the footprint the
    row recorded (``details.predicted``; NULL where it recorded none); an ``outgrew`` row keeps the engine's figure
    it recorded (``details.allocated_bytes``), its reading staying in ``host_bytes``/``vram_bytes`` and details, and
    its seat's whole price where it recorded one."""
    conn.execute(sa.text("ALTER TABLE events RENAME COLUMN measured_bytes TO engine_reported_bytes"))
    conn.execute(sa.text("ALTER TABLE events ADD COLUMN buffers_predicted_bytes BIGINT"))
    t = sa.table("events", sa.column("id", sa.BigInteger), sa.column("event", sa.Text),
                 sa.column("predicted_bytes", sa.BigInteger), sa.column("engine_reported_bytes", sa.BigInteger),
                 sa.column("buffers_predicted_bytes", sa.BigInteger), sa.column("details_json", sa.Text))
    rows = conn.execute(sa.select(t.c.id, t.c.event, t.c.predicted_bytes, t.c.details_json)
                        .where(t.c.event.in_(("load", "reject", "fail", "outgrew")))).all()
    for r in rows:
        try:
            d = json.loads(r.details_json)
        except ValueError:
            d = {}
        whole = _whole_price(d.get("predicted")) if isinstance(d, dict) else None
        if r.event == "outgrew":
            alloc = d.get("allocated_bytes") if isinstance(d, dict) else None
            values = {"engine_reported_bytes": alloc if isinstance(alloc, int) else None, "predicted_bytes": whole}
        else:
            values = {"buffers_predicted_bytes": r.predicted_bytes, "predicted_bytes": whole}
        conn.execute(sa.update(t).where(t.c.id == r.id).values(**values))


def _whole_price(fp: object) -> int | None:
    """A recorded footprint's whole price (as ``Footprint.whole_bytes`` counted it when this was written): host
    mapped + committed, and each GPU's buffers, overhead and learned growth; None when ``fp`` is not one."""
    if not isinstance(fp, dict) or not isinstance(fp.get("host"), dict):
        return None
    host = fp["host"]
    total = int(host.get("mapped_bytes") or 0) + int(host.get("committed_bytes") or 0)
    extra = {**(fp.get("overhead") or {})}
    for dev, n in (fp.get("grown") or {}).items():
        extra[dev] = extra.get(dev, 0) + n
    for dev in fp.get("devices") or []:
        name = str(dev.get("name", ""))
        if name.startswith("CPU") or name.endswith("_Host") or re.fullmatch(r"[A-Za-z]+\d+", name) is None:
            continue  # host memory (its buffers are in the host figure above)
        total += int(dev.get("total_bytes") or 0) + int(extra.get(name, 0))
    return total


def _events_vocabulary(conn: Connection, events: Sequence[str]) -> None:
    """Replace the events table's CHECK with one for ``events``."""
    vocabulary = ", ".join(f"'{e}'" for e in events)  # constants, not user input
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("ALTER TABLE events DROP CONSTRAINT ck_events_event"))
        conn.execute(sa.text(f"ALTER TABLE events ADD CONSTRAINT ck_events_event CHECK (event IN ({vocabulary}))"))
        return
    # SQLite cannot alter a constraint: rebuild the table with the new one, rows and indexes kept
    old = conn.execute(sa.text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'events'")).scalar_one()
    start = old.index("CONSTRAINT ck_events_event CHECK (")
    end = old.index(")", old.index("event IN (", start) + len("event IN (")) + 1
    new = old[:start] + f"CONSTRAINT ck_events_event CHECK (event IN ({vocabulary}))" + old[end + 1:]
    indexes = conn.execute(sa.text("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'events' "
                                   "AND sql IS NOT NULL")).scalars().all()
    conn.execute(sa.text("ALTER TABLE events RENAME TO events_v1"))
    conn.execute(sa.text(new))
    conn.execute(sa.text("INSERT INTO events SELECT * FROM events_v1"))
    conn.execute(sa.text("DROP TABLE events_v1"))
    for sql in indexes:
        conn.execute(sa.text(sql))


def _m0003_seat_peaks(conn: Connection) -> None:
    md = sa.MetaData()
    big = sa.BigInteger
    sa.Table(
        "seat_peaks",
        md,
        _id_column(),
        sa.Column("seat_id", sa.Text, nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("engine", sa.Text, nullable=False),
        sa.Column("config_json", sa.Text, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float, nullable=False),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("peak_pss_bytes", big, nullable=True),
        sa.Column("peak_rss_bytes", big, nullable=True),
        sa.Column("peak_gpu_bytes", big, nullable=True),
        sa.Column("peak_available_drop_bytes", big, nullable=True),
        sa.Column("baseline_available_bytes", big, nullable=True),
        sa.Column("details_json", sa.Text, nullable=False),
        sa.Index("ix_seat_peaks_model_time", "model", "started_at"),
    )
    md.create_all(conn)


def _m0005_gguf_structures(conn: Connection) -> None:
    """What a GGUF file's header says for pricing, kept per host and file so that it is parsed once per change."""
    md = sa.MetaData()
    big = sa.BigInteger
    sa.Table(
        "gguf_structures",
        md,
        sa.Column("host", sa.Text, primary_key=True),
        sa.Column("path", sa.Text, primary_key=True),
        sa.Column("size", big, nullable=False),
        sa.Column("mtime_ns", big, nullable=False),
        sa.Column("inode", big, nullable=False),
        sa.Column("parser", sa.Text, nullable=False),
        sa.Column("structure_json", sa.Text, nullable=False),
        sa.Column("parsed_at", sa.Float, nullable=False),
    )
    md.create_all(conn)


def _m0009_bound_indexes(conn: Connection) -> None:
    """Indexes the row bounds read (``retention``): each cache's newest entries, and a seat's configuration's newest
    peak windows."""
    for sql in ("CREATE INDEX ix_compute_cache_created ON compute_cache (created_at)",
                "CREATE INDEX ix_gguf_structures_parsed ON gguf_structures (parsed_at)",
                "CREATE INDEX ix_seat_peaks_model_id ON seat_peaks (model, id)",
                "CREATE INDEX ix_measurements_signature_id ON measurements (signature, id)"):
        conn.execute(sa.text(sql))


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial", _m0001_initial),
    Migration(2, "events vocabulary: reject, leak", _m0002_events_vocabulary),
    Migration(3, "seat_peaks", _m0003_seat_peaks),
    Migration(4, "events vocabulary: pressure, kv-restore", _m0004_pressure_event),
    Migration(5, "gguf_structures", _m0005_gguf_structures),
    Migration(6, "events vocabulary: outgrew", _m0006_outgrew_event),
    Migration(7, "events vocabulary: recycle", _m0007_recycle_event),
    Migration(8, "events: engine_reported_bytes, buffers_predicted_bytes", _m0008_event_figures),
    Migration(9, "indexes for the row bounds", _m0009_bound_indexes),
)

_md = sa.MetaData()
schema_migrations = sa.Table(
    "schema_migrations",
    _md,
    sa.Column("number", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("applied_at", sa.Float, nullable=False),
)


def _check_sequence(migrations: Sequence[Migration]) -> None:
    numbers = [m.number for m in migrations]
    if numbers != list(range(1, len(numbers) + 1)):
        raise ValueError(f"migrations must be numbered 1, 2, 3, ... in order; got {numbers}")


def migrate(conn: Connection, migrations: Sequence[Migration] = MIGRATIONS, *, where: str = "") -> list[int]:
    """Apply the migrations ``conn``'s database lacks, all in one transaction. Returns the numbers applied.

    Raises :class:`StoreVersionError` when the database records a migration this code does not know
    (written by a newer fitevict) or one whose name differs (a different lineage).
    """
    _check_sequence(migrations)
    known = {m.number: m for m in migrations}
    applied_now: list[int] = []
    with conn.begin():
        if conn.dialect.name == "postgresql":
            # Held until this transaction ends; a second migrating process waits here, then finds everything applied.
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(MIGRATION_LOCK_KEY)))
        _md.create_all(conn, tables=[schema_migrations], checkfirst=True)
        rows = conn.execute(sa.select(schema_migrations.c.number, schema_migrations.c.name)).all()
        applied = {int(n): name for n, name in rows}
        newest_known = max(known, default=0)
        unknown = sorted(n for n in applied if n not in known)
        if unknown:
            raise StoreVersionError(
                f"the store{where} has schema migration(s) {unknown} but this fitevict knows only 1..{newest_known}: "
                "it was written by a newer fitevict. Upgrade fitevict, or point store_url at another database."
            )
        for n, name in applied.items():
            if known[n].name != name:
                raise StoreVersionError(
                    f"the store{where} records migration {n} as {name!r} but this fitevict's migration {n} is "
                    f"{known[n].name!r}: the database comes from another build. Point store_url at another database."
                )
        for m in migrations:
            if m.number in applied:
                continue
            m.apply(conn)
            conn.execute(sa.insert(schema_migrations).values(number=m.number, name=m.name, applied_at=time.time()))
            applied_now.append(m.number)
    return applied_now
