"""One writer: every write runs on one thread; readers see committed data without waiting."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from fitevict.store import Event, NestedWriteError, Store, StoreClosedError


def _count(store: Store) -> int:
    return store.read(lambda c: c.execute(sa.text("SELECT COUNT(*) FROM events")).scalar_one())


def test_many_threads_all_land_through_one_writer(store: Store) -> None:
    threads, each = 8, 50

    def work(t: int) -> tuple[list[int], set[int]]:
        ids = [store.record_event(Event(time=float(t * 1000 + i), event="load", model=f"m{t}")) for i in range(each)]
        ran_on = {store.write(lambda conn: threading.get_ident()) for _ in range(3)}
        return ids, ran_on

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(work, range(threads)))
    all_ids = [i for ids, _ in results for i in ids]
    assert _count(store) == threads * each
    assert len(set(all_ids)) == threads * each
    writers = set().union(*(ran for _, ran in results))
    assert writers == {store.writer_thread_ident}
    assert threading.get_ident() not in writers


def test_reader_sees_committed_data_while_writer_is_busy(store: Store) -> None:
    store.record_event(Event(time=1.0, event="load", model="committed"))
    inside, release = threading.Event(), threading.Event()

    def slow_write(conn: sa.Connection) -> int:
        conn.execute(sa.text("INSERT INTO events (time, event, model, details_json) VALUES (2.0, 'load', 'pending', '{}')"))
        inside.set()
        assert release.wait(30), "test never released the writer"
        return 1

    fut = store.submit(slow_write)
    assert inside.wait(30)
    # the write transaction is open and holds the lock; a reader is not blocked and sees only committed rows
    assert [e.model for e in store.events()] == ["committed"]
    assert not fut.done()
    release.set()
    assert fut.result(30) == 1
    assert [e.model for e in store.events()] == ["pending", "committed"]


def test_failed_write_rolls_back_and_writer_goes_on(store: Store) -> None:
    def half(conn: sa.Connection) -> None:
        conn.execute(sa.text("INSERT INTO events (time, event, details_json) VALUES (1.0, 'load', '{}')"))
        raise RuntimeError("second step failed")

    with pytest.raises(RuntimeError, match="second step failed"):
        store.write(half)
    assert _count(store) == 0
    store.record_event(Event(time=2.0, event="load"))
    assert _count(store) == 1


def test_nested_write_is_refused_not_deadlocked(store: Store) -> None:
    def outer(conn: sa.Connection) -> None:
        store.record_event(Event(time=1.0, event="load"))

    with pytest.raises(NestedWriteError, match="one function"):
        store.write(outer)


def test_close_finishes_queued_writes_then_refuses(db_url: str) -> None:
    s = Store.open(db_url)
    futs = [s.submit(lambda conn, i=i: conn.execute(
        sa.text("INSERT INTO events (time, event, details_json) VALUES (:t, 'load', '{}')"), {"t": float(i)}
    ).rowcount) for i in range(20)]
    s.close()
    assert [f.result(0) for f in futs] == [1] * 20
    with pytest.raises(StoreClosedError, match="closed"):
        s.record_event(Event(time=1.0, event="load"))
    s.close()  # idempotent
    with Store.open(db_url) as again:
        assert _count(again) == 20


def test_two_stores_on_one_file_both_write(db_url: str) -> None:
    # e.g. the server and a CLI command: two writers, serialised by SQLite's lock and busy_timeout
    a, b = Store.open(db_url), Store.open(db_url)
    try:
        def burst(s: Store, tag: str) -> None:
            for i in range(40):
                s.record_event(Event(time=float(i), event="load", model=tag))

        with ThreadPoolExecutor(2) as pool:
            list(pool.map(burst, (a, b), ("a", "b")))
        assert len(a.events(model="b", limit=100)) == 40
        assert len(b.events(model="a", limit=100)) == 40
    finally:
        a.close()
        b.close()
