"""What only a server database shows: processes racing to migrate or upsert, a dropped connection, collations, URLs."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from fitevict.store import MIGRATIONS, Event, Store, StoreError, make_engine
from fitevict.store.migrations import MIGRATION_LOCK_KEY

# A fitevict that knows one migration more than this one, whose extra migration announces itself and then
# holds its transaction open until a line arrives on stdin.
_MIGRATING_CHILD = """
import sys
from fitevict.store import MIGRATIONS, Migration, Store

def held(conn):
    print("inside", flush=True)
    sys.stdin.readline()

with Store.open(sys.argv[1], migrations=(*MIGRATIONS, Migration(len(MIGRATIONS) + 1, "held", held))):
    print("open", flush=True)
"""


def _one(url: str, statement: str, **params: object) -> object:
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            return conn.execute(sa.text(statement), params).scalar()
    finally:
        engine.dispose()


def _await_server(url: str, what: str, query: str, **params: object) -> None:
    """Wait (30 s at most) until ``query`` counts at least one row: the server's own view of another session's state."""
    deadline = time.monotonic() + 30
    while not _one(url, query, **params):
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def test_two_processes_migrating_at_once_take_turns_on_the_advisory_lock(pg_url: str) -> None:
    cmd = [sys.executable, "-c", _MIGRATING_CHILD, pg_url]
    first = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None and first.stdin is not None
        assert first.stdout.readline() == "inside\n"  # first holds the migration transaction, half applied
        second = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        try:
            # the second waits for the first's advisory lock (not for a table lock, and without failing)
            hi, lo = (MIGRATION_LOCK_KEY >> 32) & 0xFFFFFFFF, MIGRATION_LOCK_KEY & 0xFFFFFFFF
            _await_server(
                pg_url,
                "the second process waits on the migration lock",
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND classid::bigint = :hi AND objid::bigint = :lo AND objsubid = 1",
                hi=hi,
                lo=lo,
            )
            first.stdin.write("\n")
            first.stdin.flush()
            out_first, _ = first.communicate(timeout=60)
            out_second, _ = second.communicate(timeout=60)
        finally:
            second.kill()
            second.wait()
    finally:
        first.kill()
        first.wait()
    assert (first.returncode, second.returncode) == (0, 0)
    assert out_first == "open\n"
    assert out_second == "open\n"  # it found every migration applied: "held" ran once, in the first process
    rows = _one(pg_url, "SELECT string_agg(number::text || ':' || name, ',' ORDER BY number) FROM schema_migrations")
    assert rows == ",".join([f"{m.number}:{m.name}" for m in MIGRATIONS] + [f"{len(MIGRATIONS) + 1}:held"])


def test_many_threads_opening_one_new_database_all_succeed(pg_url: str) -> None:
    # without the lock every opener but one fails on a duplicate key creating schema_migrations
    barrier = threading.Barrier(6)

    def open_close(_: int) -> None:
        barrier.wait(30)
        Store.open(pg_url).close()

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(open_close, range(6)))
    assert _one(pg_url, "SELECT count(*) FROM schema_migrations") == len(MIGRATIONS)


def _waiting_on_a_lock(url: str) -> str:
    return "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"


def test_upsert_of_a_key_another_process_is_inserting_updates_it(pg_url: str) -> None:
    a, b = Store.open(pg_url), Store.open(pg_url)
    try:
        inside, release = threading.Event(), threading.Event()

        def insert_and_hold(conn: sa.Connection) -> None:
            conn.execute(
                sa.text("INSERT INTO compute_cache (key, value_json, created_at) VALUES ('k', :v, 0)"), {"v": '{"CPU":1}'}
            )
            inside.set()
            assert release.wait(30), "test never released the first writer"

        held = a.submit(insert_and_hold)
        held.add_done_callback(lambda _: inside.set())  # a failure shows at held.result() instead of a 30 s wait
        assert inside.wait(30) and not held.done()
        with ThreadPoolExecutor(1) as pool:
            upsert = pool.submit(b.compute_put, "k", {"CPU": 2})
            # b's INSERT ... ON CONFLICT waits for a's uncommitted row; an UPDATE-then-INSERT would match
            # nothing now and fail on the key once a commits
            _await_server(pg_url, "the second store's upsert waits on the first's row", _waiting_on_a_lock(pg_url))
            release.set()
            held.result(30)
            upsert.result(30)
        assert a.compute_get("k") == {"CPU": 2}
    finally:
        release.set()
        a.close()
        b.close()


def test_writer_replaces_a_connection_the_server_dropped(pg_url: str, pg_admin: Engine) -> None:
    with Store.open(pg_url) as store:
        store.record_event(Event(time=1.0, event="load", model="before"))
        backend = store.write(lambda conn: conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        with pg_admin.connect() as conn:
            name = conn.execute(sa.text("SELECT application_name FROM pg_stat_activity WHERE pid = :p"), {"p": backend})
            assert name.scalar_one() == "fitevict"
            assert conn.execute(sa.select(sa.func.pg_terminate_backend(backend))).scalar_one() is True
        # the next write finds the connection gone before it runs, reconnects, and lands
        new_id = store.record_event(Event(time=2.0, event="load", model="after"))
        assert [(e.id, e.model) for e in store.events(order="asc")][-1] == (new_id, "after")
        assert store.write(lambda conn: conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()) != backend
        assert [e.model for e in store.events(order="asc")] == ["before", "after"]


@pytest.fixture
def pg_url_english(pg_admin: Engine, pg_database: Callable[[str], str]) -> str:
    """A database whose default collation is ICU English, where "a" < "B" (in C, "B" < "a")."""
    with pg_admin.connect() as conn:
        if not conn.exec_driver_sql("SELECT count(*) FROM pg_collation WHERE collprovider = 'i'").scalar():
            pytest.skip("this PostgreSQL server was built without ICU collations")
    return pg_database("LOCALE_PROVIDER icu ICU_LOCALE 'en' LOCALE 'C'")


def test_model_sort_is_by_code_point_on_a_database_with_a_language_collation(pg_url_english: str) -> None:
    names = ["b", "B", "a", "A", "_x", "é"]
    with Store.open(pg_url_english) as store:
        default_order = store.read(
            lambda conn: [r[0] for r in conn.execute(sa.text(
                "SELECT model FROM (VALUES ('b'), ('B'), ('a'), ('A'), ('_x'), ('é')) AS v(model) ORDER BY model"
            ))]
        )
        assert default_order != sorted(names)  # the database alone would sort by language rules
        for i, name in enumerate(names):
            store.record_event(Event(time=float(i), event="load", model=name))
        assert [e.model for e in store.events(sort_by="model", order="asc")] == sorted(names)


# ---- URLs: no server needed ----


def test_bare_postgresql_url_uses_psycopg() -> None:
    engine = make_engine("postgresql://fe:secret@db.invalid/fe")
    try:
        assert (engine.dialect.name, engine.dialect.driver) == ("postgresql", "psycopg")
    finally:
        engine.dispose()


def test_missing_postgres_driver_names_the_extra() -> None:
    with pytest.raises(StoreError, match=r"needs the PostgreSQL driver 'pg8000'.*pip install 'fitevict\[postgres\]'"):
        make_engine("postgresql+pg8000://fe@db.invalid/fe")


def test_other_backends_are_refused_with_the_two_forms() -> None:
    with pytest.raises(StoreError, match=r"backend 'mysql'.*sqlite:////path.*postgresql\+psycopg://"):
        make_engine("mysql://fe:secret@db.invalid/fe")
