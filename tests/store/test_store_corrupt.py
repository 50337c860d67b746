"""A SQLite store file SQLite cannot read is moved aside (kept, renamed) and a new store starts in its place; a
locked or healthy one is never moved."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from fitevict.store import Store
from fitevict.store.records import Event


@pytest.mark.parametrize("garbage", [b"not a database at all " * 5000, b"SQLite format 3\x00" + b"\xff" * 8000],
                         ids=["other-file", "malformed"])
def test_a_corrupt_file_is_moved_aside_and_a_new_store_starts(tmp_path: Path, garbage: bytes) -> None:
    db = tmp_path / "fitevict.db"
    db.write_bytes(garbage)
    with Store.open(f"sqlite:///{db}") as store:
        store.record_event(Event(time=1.0, event="load", model="m"))
        assert [e.model for e in store.events()] == ["m"]
    [aside] = tmp_path.glob("fitevict.db.corrupt-*[0-9]")
    assert aside.read_bytes() == garbage  # kept, byte for byte


def test_a_locked_store_is_not_moved(tmp_path: Path) -> None:
    db = tmp_path / "fitevict.db"
    Store.open(f"sqlite:///{db}").close()
    other = sqlite3.connect(str(db), isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(sa.exc.OperationalError, match="locked"):
            Store.open(f"sqlite:///{db}", busy_timeout_s=0.1)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert not list(tmp_path.glob("*.corrupt-*"))
    Store.open(f"sqlite:///{db}").close()
