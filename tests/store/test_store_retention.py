"""The store keeps what ``[logs]`` says: history by age and by rows, load records by age but never a configuration's
newest, seat peak windows by age; SQLite's write-ahead log is truncated by a checkpoint. Run on SQLite and
PostgreSQL (real databases)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fitevict.store import Event, Store
from fitevict.store.peaks import SeatPeaks, op_put_peaks, q_peaks
from fitevict.store.retention import DAY, checkpoint, op_prune

NOW = 1_900_000_000.0


def _event(age_days: float, i: int) -> Event:
    return Event(time=NOW - age_days * DAY + i * 1e-3, event="load", model=f"m{i % 3}")


def _peaks(model: str, age_days: float) -> SeatPeaks:
    t = NOW - age_days * DAY
    return SeatPeaks(seat_id=f"{model}-{age_days}", model=model, engine="llama-server", config={}, started_at=t - 60,
                     ended_at=t, samples=3, peak_pss_bytes=1 << 20, peak_rss_bytes=1 << 20, peak_gpu_bytes=None,
                     peak_available_drop_bytes=None, baseline_available_bytes=None)


def test_history_goes_by_age_then_by_rows(store: Store) -> None:
    old = [_event(age, i) for i, age in enumerate((400, 200, 100))]  # older than 90 days
    new = [_event(age, i) for i, age in enumerate((30, 20, 10, 5, 1), start=3)]
    for e in old + new:
        store.record_event(e)
    pruned = store.write(op_prune(NOW, 90, 3))
    kept = store.events(order="asc")
    assert [e.time for e in kept] == [e.time for e in new[-3:]]  # the newest three of those within 90 days
    assert pruned.events == len(old) + 2
    assert "older than" in pruned.reason() and "newest 3" in pruned.reason()


def test_no_bound_keeps_everything(store: Store) -> None:
    for i, age in enumerate((4000, 400, 1)):
        store.record_event(_event(age, i))
    pruned = store.write(op_prune(NOW, 0, 0))
    assert pruned.total == 0 and len(store.events()) == 3


def test_a_configurations_newest_load_record_stays_whatever_its_age(store: Store) -> None:
    ids = {}
    for sig, age in (("a", 300), ("a", 200), ("a", 1), ("b", 500), ("b", 400)):
        ids[(sig, age)] = store.put_measurement(sig, "m-" + sig, "llama-server", {"CPU": 1}, 1, 0, 1,
                                                measured_at=NOW - age * DAY)
    pruned = store.write(op_prune(NOW, 90, 0))
    assert pruned.measurements == 3  # a@300, a@200, b@500
    assert store.last_measurement("a").measured_at == NOW - 1 * DAY
    assert store.last_measurement("b").measured_at == NOW - 400 * DAY  # old, but b's only record left


def test_seat_peak_windows_go_by_age(store: Store) -> None:
    for model, age in (("old", 120), ("new", 2)):
        store.write(op_put_peaks(_peaks(model, age)))
    assert store.write(op_prune(NOW, 90, 0)).seat_peaks == 1
    assert [w.model for w in store.read(q_peaks())] == ["new"]


def test_checkpoint_truncates_sqlites_write_ahead_log(sqlite_url: str) -> None:
    with Store.open(sqlite_url) as store:
        for i in range(300):
            store.record_event(_event(1, i))
        wal = Path(sqlite_url.removeprefix("sqlite:///") + "-wal")
        assert os.path.getsize(wal) > 0
        said = checkpoint(store.engine)
        assert said == "write-ahead log checkpointed and truncated"
        assert os.path.getsize(wal) == 0
        assert len(store.events(limit=1000)) == 300  # nothing lost: the pages went into the database


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_server_database_has_no_write_ahead_file_to_truncate(store: Store) -> None:
    assert checkpoint(store.engine) is None
