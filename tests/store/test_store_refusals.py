"""What the store refuses, on real SQLite files: each refused write counted by the figure it held, with SQLite's
reason, until a write succeeds (``store.faults``); a file corrupted under an open store moved aside and a new store
opened in its place, which takes the next writes (``Store.renew``)."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from fitevict.store import Store
from fitevict.store.connect import StoreFileLost
from fitevict.store.records import Event, SeatRecord


def wait_for(fn, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (got := fn()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return got


def test_refused_writes_are_counted_by_figure_until_a_write_succeeds(tmp_path: Path) -> None:
    db = tmp_path / "fitevict.db"
    with Store.open(f"sqlite:///{db}", busy_timeout_s=0.1) as store:
        other = sqlite3.connect(str(db), isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")  # another writer holds the lock past the busy timeout
        for write in (lambda: store.record_event(Event(time=1.0, event="load", model="m")),
                      lambda: store.seat_upsert(SeatRecord("s1", "m", "llama-server", "ready", 1.0, os.getpid())),
                      lambda: store.record_event(Event(time=2.0, event="unload", model="m"))):
            with pytest.raises(sa.exc.OperationalError):
                write()
        now = store.faults.to_json()
        assert now["ok"] is False and now["reason"] == "database is locked"
        assert now["refused"] == {"history events": 2, "seat records": 1}
        other.execute("ROLLBACK")
        other.close()
        store.record_event(Event(time=3.0, event="load", model="m"))
        after = store.faults.to_json()
        assert after["ok"] is True and after["refused"] == {} and after["reason"] is None
        assert after["last_fault"]["refused"] == {"history events": 2, "seat records": 1}
        assert after["last_fault"]["since"] <= after["last_fault"]["until"]


def corrupt(db: Path) -> None:
    """Every page but the first overwritten, after a checkpoint put everything in the main file."""
    with sqlite3.connect(str(db), isolation_level=None) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = db.stat().st_size
    with db.open("r+b") as f:
        f.seek(4096)
        f.write(os.urandom(size - 4096))


def test_a_file_corrupted_under_an_open_store_is_moved_aside_and_a_new_store_takes_writes(tmp_path: Path) -> None:
    db = tmp_path / "fitevict.db"
    with Store.open(f"sqlite:///{db}") as store:
        renewed: list[int] = []
        store.renewed.append(lambda: renewed.append(1))
        store.record_event(Event(time=1.0, event="load", model="m"))
        corrupt(db)
        with pytest.raises(sa.exc.DatabaseError, match="malformed"):
            store.record_event(Event(time=2.0, event="unload", model="m"))
        [moved] = wait_for(lambda: store.faults.to_json()["moved_aside"], "the corrupt file moved aside")
        assert moved["reason"] == "database disk image is malformed" and Path(moved["to"]).is_file()
        assert [p.name for p in tmp_path.glob("fitevict.db.corrupt-*[0-9]")] == [Path(moved["to"]).name]
        wait_for(lambda: renewed, "the renewed hooks")
        store.record_event(Event(time=2.0, event="unload", model="m"))  # the new store takes it
        assert [(e.event, e.model) for e in store.events()] == [("unload", "m")]
        assert store.faults.ok
    with Store.open(f"sqlite:///{db}") as again:  # the new file is a healthy store
        assert [e.event for e in again.events()] == ["unload"]


def test_a_locked_file_is_never_renewed(tmp_path: Path) -> None:
    db = tmp_path / "fitevict.db"
    with Store.open(f"sqlite:///{db}", busy_timeout_s=0.1) as store:
        other = sqlite3.connect(str(db), isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        with pytest.raises(sa.exc.OperationalError):
            store.record_event(Event(time=1.0, event="load", model="m"))
        other.execute("ROLLBACK")
        other.close()
        store.record_event(Event(time=2.0, event="load", model="m"))
        assert store.faults.to_json()["moved_aside"] == [] and not list(tmp_path.glob("*.corrupt-*"))
        assert [e.time for e in store.events()] == [2.0]


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_file_lost_under_an_open_store_is_never_written_and_the_store_opens_again(tmp_path: Path,
                                                                                    how: str) -> None:
    """Deleted (with its -wal and -shm, as ``rm fitevict.db*`` does) or replaced by another store's file: the next
    write is refused before it runs (it would go to a file no one can open again), and the store opens again at its
    path, taking the writes after."""
    db = tmp_path / "fitevict.db"
    with Store.open(f"sqlite:///{db}") as store:
        renewed: list[int] = []
        store.renewed.append(lambda: renewed.append(1))
        store.record_event(Event(time=1.0, event="load", model="m"))
        if how == "deleted":
            for f in tmp_path.glob("fitevict.db*"):
                f.unlink()
        else:
            with Store.open(f"sqlite:///{tmp_path / 'other.db'}") as other:
                other.record_event(Event(time=0.5, event="load", model="other"))
            os.replace(tmp_path / "other.db", db)
        with pytest.raises(StoreFileLost, match=f"the store's file {db} was {'deleted' if how == 'deleted' else 'replaced'}"):
            store.record_event(Event(time=2.0, event="unload", model="m"))
        [lost] = wait_for(lambda: store.faults.to_json()["lost_files"], "the lost file said")
        assert str(db) in lost["reason"] and store.faults.to_json()["moved_aside"] == []
        wait_for(lambda: renewed, "the renewed hooks")
        store.record_event(Event(time=2.0, event="unload", model="m"))
        want = [("unload", "m")] if how == "deleted" else [("unload", "m"), ("load", "other")]
        assert [(e.event, e.model) for e in store.events()] == want
    with Store.open(f"sqlite:///{db}") as again:
        assert [(e.event, e.model) for e in again.events()] == want
