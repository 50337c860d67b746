"""SQLite's hold on the door's memory is bounded (store.connect.SQLITE_HEAP_BYTES), by SQLite's own count, and its
descriptors do not climb with reads at once (store.connect.SQLITE_READERS)."""

from __future__ import annotations

import os
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sqlalchemy as sa

from fitevict.host import heap
from fitevict.store import Store
from fitevict.store.connect import SQLITE_HEAP_BYTES, SQLITE_READERS, make_engine
from fitevict.store.records import Event

MiB = 2**20


def test_pooled_readers_caches_stay_within_the_bound(tmp_path: Path) -> None:
    """Four readers each scan 20 MiB of rows, kept open together: unbounded, each cache would keep its 2 MiB (what
    they add is measured: SQLite counts the whole process, other connections' pages too)."""
    sqlite3.connect(":memory:").execute("PRAGMA soft_heap_limit=0")  # process-wide: as no store had set it
    before = heap.held()["sqlite"]
    if isinstance(before, str):
        pytest.skip(before)
    engine = make_engine(f"sqlite:///{tmp_path / 'big.db'}")
    with engine.begin() as c:
        c.exec_driver_sql("CREATE TABLE t(x BLOB)")
        c.exec_driver_sql("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) "
                          "INSERT INTO t SELECT randomblob(1000) FROM n")
    readers = [engine.connect() for _ in range(4)]
    try:
        for r in readers:
            assert r.execute(sa.text("SELECT count(*), sum(length(x)) FROM t")).one() == (20000, 20000 * 1000)
        held = heap.held()["sqlite"]  # the process's count: other connections' (earlier tests') are in it too
        assert held["in_use_bytes"] - before["in_use_bytes"] <= SQLITE_HEAP_BYTES + MiB, (before, held)
    finally:
        for r in readers:
            r.close()
        engine.dispose()


def _store_descriptors(db: Path) -> int:
    """This process's descriptors on the store's files (the database, its WAL and its shared memory)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith(str(db))
        except OSError:
            continue  # closed since listed
    return n


def test_reads_at_once_leave_the_store_holding_the_same_descriptors(tmp_path: Path) -> None:
    """More reads at once than the store has readers: those beyond wait for one, all are answered, and the store
    holds as many descriptors at the peak and after as before (readers opened on demand kept each new peak's)."""
    db = tmp_path / "fitevict.db"
    at_once = SQLITE_READERS + 3
    with Store.open(f"sqlite:///{db}") as store:
        store.record_event(Event(time=1.0, event="load", model="m"))
        before = _store_descriptors(db)
        holding, go = threading.Semaphore(0), threading.Event()

        def read(conn: sa.Connection) -> int:
            holding.release()
            assert go.wait(60)  # every read holds its connection until the test lets them go
            return conn.exec_driver_sql("SELECT count(*) FROM events").scalar_one()

        with ThreadPoolExecutor(at_once) as pool:
            answers = [pool.submit(store.read, read) for _ in range(at_once)]
            try:
                for _ in range(SQLITE_READERS):
                    assert holding.acquire(timeout=30), "the store's readers did not all take a read"
                assert _store_descriptors(db) == before  # the peak: every reader held, the rest waiting for one
            finally:
                go.set()
            assert [a.result(60) for a in answers] == [1] * at_once
        assert _store_descriptors(db) == before
