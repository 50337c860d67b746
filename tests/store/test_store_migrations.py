"""Opening a store: numbered migrations applied once, newer databases refused, SQLite settings."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from fitevict.store import MIGRATIONS, Migration, Store, StoreError, StoreVersionError, make_engine
from fitevict.store import schema
from fitevict.store.migrations import migrate


def _db_path(url: str) -> Path:
    return Path(sa.engine.make_url(url).database)


def _sql(url: str, statement: str, **params: object) -> list[tuple]:
    """Run one statement on its own connection, outside any store, and commit it."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            result = conn.execute(sa.text(statement), params)
            return [tuple(r) for r in result] if result.returns_rows else []
    finally:
        engine.dispose()


def _migration_rows(url: str) -> list[tuple]:
    return _sql(url, "SELECT number, name, applied_at FROM schema_migrations ORDER BY number")


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_open_applies_every_migration(db_url: str) -> None:
    Store.open(db_url).close()
    rows = _migration_rows(db_url)
    assert [(n, name) for n, name, _ in rows] == [(m.number, m.name) for m in MIGRATIONS]
    assert _tables(db_url) == {"schema_migrations", *(t.name for t in schema.TABLES)}


def test_open_creates_parent_dirs(sqlite_url: str) -> None:
    assert not _db_path(sqlite_url).parent.exists()
    Store.open(sqlite_url).close()
    assert _db_path(sqlite_url).is_file()


def test_reopen_applies_nothing(db_url: str) -> None:
    Store.open(db_url).close()
    first = _migration_rows(db_url)
    s = Store.open(db_url)
    try:
        # applied_at unchanged: the rows were not rewritten
        assert _migration_rows(db_url) == first
        with s.engine.connect() as conn:
            assert migrate(conn) == []
    finally:
        s.close()


def test_query_tables_match_the_migrated_schema(store: Store) -> None:
    insp = sa.inspect(store.engine)
    for table in schema.TABLES:
        migrated = {c["name"] for c in insp.get_columns(table.name)}
        assert migrated == {c.name for c in table.columns}, table.name


def test_wal_and_connection_pragmas_are_on(sqlite_url: str) -> None:
    with Store.open(sqlite_url) as store:
        # journal_mode is persistent in the file: a plain sqlite3 connection sees it too
        with sqlite3.connect(_db_path(sqlite_url)) as c:
            assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        got = store.read(
            lambda conn: tuple(
                conn.exec_driver_sql(f"PRAGMA {p}").scalar()
                for p in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
            )
        )
    # synchronous NORMAL is 1; busy_timeout is the default 5.0 s in ms
    assert got == ("wal", 1, 1, 5000)


def test_newer_database_is_refused_with_the_numbers(db_url: str) -> None:
    Store.open(db_url).close()
    newest = MIGRATIONS[-1].number
    _sql(
        db_url,
        "INSERT INTO schema_migrations (number, name, applied_at) VALUES (:n, 'from-a-newer-build', 0)",
        n=newest + 1,
    )
    with pytest.raises(StoreVersionError, match=rf"\[{newest + 1}\].*knows only 1\.\.{newest}.*Upgrade fitevict"):
        Store.open(db_url)


def test_renamed_migration_is_refused(db_url: str) -> None:
    Store.open(db_url).close()
    _sql(db_url, "UPDATE schema_migrations SET name = 'other-lineage' WHERE number = 1")
    with pytest.raises(StoreVersionError, match="other-lineage"):
        Store.open(db_url)


def test_a_failing_migration_leaves_nothing_behind(db_url: str) -> None:
    def half_done(conn: sa.Connection) -> None:
        conn.exec_driver_sql("CREATE TABLE half_done (x INTEGER)")
        raise RuntimeError("migration 2 broke")

    broken = (*MIGRATIONS, Migration(MIGRATIONS[-1].number + 1, "half-done", half_done))
    with pytest.raises(RuntimeError, match="migration 2 broke"):
        Store.open(db_url, migrations=broken)
    # one transaction for all pending migrations, DDL included: nothing persisted
    assert _tables(db_url) == set()
    Store.open(db_url).close()
    assert [r[0] for r in _migration_rows(db_url)] == [m.number for m in MIGRATIONS]


def test_migrations_must_be_numbered_in_order(db_url: str) -> None:
    gap = (*MIGRATIONS, Migration(MIGRATIONS[-1].number + 2, "gap", lambda conn: None))
    with pytest.raises(ValueError, match="numbered 1, 2, 3"):
        Store.open(db_url, migrations=gap)


def test_in_memory_sqlite_is_refused_with_remedy() -> None:
    with pytest.raises(StoreError, match="needs a file"):
        make_engine("sqlite://")


def test_a_v1_history_upgrades_to_the_new_vocabulary_with_its_rows(db_url: str) -> None:
    """A store written before ``reject``/``leak`` existed: migration 2 keeps every row and index, and then
    accepts the new events while still refusing unknown ones."""
    from fitevict.store.records import Event

    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            assert migrate(conn, MIGRATIONS[:1]) == [1]
    finally:
        engine.dispose()
    _sql(db_url, "INSERT INTO events (time, event, model, details_json) VALUES (1.0, 'load', 'm', '{}')")
    with pytest.raises(sa.exc.IntegrityError):
        _sql(db_url, "INSERT INTO events (time, event, model, details_json) VALUES (2.0, 'reject', 'm', '{}')")
    s = Store.open(db_url)
    try:
        s.record_event(Event(time=3.0, event="reject", model="m", engine="llama-server", reason="guard", details={}))
        assert [(e.event, e.time) for e in s.events(order="asc")] == [("load", 1.0), ("reject", 3.0)]
    finally:
        s.close()
    with pytest.raises(sa.exc.IntegrityError):
        _sql(db_url, "INSERT INTO events (time, event, model, details_json) VALUES (4.0, 'bogus', 'm', '{}')")
    assert {"ix_events_time", "ix_events_model_time", "ix_events_event_time"} <= {
        i["name"] for i in sa.inspect(sa.create_engine(db_url, poolclass=NullPool)).get_indexes("events")}


def test_history_written_before_the_figures_were_renamed_reads_as_what_it_holds(db_url: str) -> None:
    """A store at migration 7: a load kept the buffers alone in ``predicted_bytes`` and the engine's buffers in
    ``measured_bytes``, an outgrew event its reading there. Migration 8 renames ``measured_bytes`` to
    ``engine_reported_bytes``, moves a load's buffers to ``buffers_predicted_bytes`` and sets ``predicted_bytes`` to
    the whole price of the footprint the row recorded (host mapped + committed, each GPU's buffers and overhead)."""
    import json

    from fitevict.pricing.footprint import DeviceFootprint, Footprint, Term

    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            assert migrate(conn, MIGRATIONS[:7]) == list(range(1, 8))
    finally:
        engine.dispose()
    mib = 1 << 20
    fp = Footprint((DeviceFootprint("CPU", *(Term(n * mib, "formula") for n in (10, 2, 3, 1))),
                    DeviceFootprint("CUDA0", *(Term(n * mib, "formula") for n in (100, 20, 30, 1)))),
                   host_mapped_bytes=10 * mib, host_committed_bytes=24 * mib, overhead=(("CUDA0", 250 * mib),))
    assert fp.whole_bytes == 34 * mib + 151 * mib + 250 * mib
    insert = ("INSERT INTO events (time, event, model, predicted_bytes, measured_bytes, host_bytes, details_json) "
              "VALUES (:t, :e, 'm', :p, :m, :h, :d)")
    _sql(db_url, insert, t=1.0, e="load", p=fp.total_bytes, m=fp.total_bytes + 5, h=40 * mib,
         d=json.dumps({"predicted": fp.to_json()}))
    _sql(db_url, insert, t=2.0, e="load", p=7 * mib, m=8 * mib, h=None, d="{}")  # recorded no footprint
    _sql(db_url, insert, t=3.0, e="outgrew", p=40 * mib, m=70 * mib, h=70 * mib,
         d=json.dumps({"reading_bytes": 70 * mib, "allocated_bytes": 30 * mib, "predicted": fp.to_json()}))
    _sql(db_url, insert, t=4.0, e="evict", p=16 * mib, m=None, h=20 * mib, d="{}")
    s = Store.open(db_url)
    try:
        load, bare, grew, evict = s.events(order="asc")
    finally:
        s.close()
    assert (load.predicted_bytes, load.buffers_predicted_bytes, load.engine_reported_bytes) == (
        fp.whole_bytes, fp.total_bytes, fp.total_bytes + 5)
    assert (bare.predicted_bytes, bare.buffers_predicted_bytes, bare.engine_reported_bytes) == (None, 7 * mib, 8 * mib)
    assert (grew.engine_reported_bytes, grew.host_bytes, grew.predicted_bytes) == (30 * mib, 70 * mib, fp.whole_bytes)
    assert (evict.predicted_bytes, evict.buffers_predicted_bytes) == (16 * mib, None)  # only the rows named move
