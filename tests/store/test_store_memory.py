"""SQLite's hold on the door's memory is bounded (store.connect.SQLITE_HEAP_BYTES), by SQLite's own count."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from fitevict.host import heap
from fitevict.store.connect import SQLITE_HEAP_BYTES, make_engine

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
