"""The store keeps what ``[logs]`` says: history by age and by rows (the row bound held at every recorded event, not
only at a prune), load records by age but never a configuration's newest, and by rows: the newest N per
configuration and at most M in all, held at every record written (seat peak windows likewise), each cache at most M
entries; SQLite gives the pages a prune freed back to the disk in steps (incremental vacuum; an older file rebuilt
once) and its write-ahead log is truncated by a checkpoint. Run on SQLite and PostgreSQL (real databases)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from fitevict.store import Event, Store
from fitevict.store.peaks import SeatPeaks, op_put_peaks, q_peaks
import sqlalchemy as sa

from fitevict.store import schema as t
from fitevict.store.retention import COMPACT_STEP_PAGES, DAY, RowBounds, checkpoint, compact, op_compact, op_prune

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


def test_the_row_bound_holds_at_every_recorded_event(store: Store) -> None:
    store.history_rows = 3  # as the server sets it from logs.history_rows
    recorded = []
    for i in range(10):
        recorded.append(store.record_event(_event(1, i)))
        assert len(store.events(limit=1000)) == min(i + 1, 3)  # never more, with no prune between
    assert [e.id for e in store.events(order="asc")] == recorded[-3:]  # the newest three


def test_the_row_bound_holds_for_events_recorded_from_async_code(store: Store) -> None:
    store.history_rows = 2

    async def record() -> list[int]:
        return [await store.aio.record_event(_event(1, i)) for i in range(5)]

    ids = asyncio.run(record())
    assert [e.id for e in store.events(order="asc")] == ids[-2:]


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


def _measure(store: Store, sig: str, i: int) -> int:
    return store.put_measurement(sig, "m-" + sig, "llama-server", {"CPU": 1}, 1, 0, 1, measured_at=NOW - DAY + i)


def _per(store: Store, table: sa.TableClause, *keys: str) -> dict[tuple, list[int]]:
    """Each group's ids, oldest first."""
    rows = store.read(lambda c: c.execute(sa.select(table.c.id, *(table.c[k] for k in keys))
                                          .order_by(table.c.id)).all())
    out: dict[tuple, list[int]] = {}
    for r in rows:
        out.setdefault(tuple(r[1:]), []).append(r[0])
    return out


def test_load_records_keep_the_newest_per_configuration_at_every_write(store: Store) -> None:
    store.row_bounds = RowBounds(per_signature=3)  # as the server sets it from logs.records_per_signature
    written = {"a": [_measure(store, "a", i) for i in range(10)], "b": [_measure(store, "b", i) for i in range(2)]}
    assert _per(store, t.measurements, "signature") == {("a",): written["a"][-3:], ("b",): written["b"]}
    assert store.last_measurement("a").measured_at == NOW - DAY + 9  # prices still read the newest


def test_load_records_and_peak_windows_are_bounded_in_all(store: Store) -> None:
    store.row_bounds = RowBounds(rows=5)  # a new configuration per request: the per-configuration bound alone
    ids = [_measure(store, f"sig{i}", i) for i in range(12)]  # would let the table grow without end
    assert sorted(i for g in _per(store, t.measurements, "signature").values() for i in g) == ids[-5:]
    windows = [store.write(op_put_peaks(_peaks(f"m{i}", 1), store.row_bounds)) for i in range(8)]
    assert sorted(i for g in _per(store, t.seat_peaks, "model").values() for i in g) == windows[-5:]


def test_peak_windows_keep_the_newest_per_model_and_configuration(store: Store) -> None:
    bounds = RowBounds(per_signature=2)
    same = [store.write(op_put_peaks(_peaks("m", age), bounds)) for age in (5, 4, 3, 2, 1)]
    other = store.write(op_put_peaks(replace(_peaks("m", 1), config={"n_ctx": 4096}), bounds))
    assert _per(store, t.seat_peaks, "model", "config_json") == {("m", "{}"): same[-2:],
                                                                 ("m", '{"n_ctx": 4096}'): [other]}


def test_a_prune_bounds_what_was_written_before_the_bounds(store: Store) -> None:
    for sig in ("a", "b"):
        for i in range(6):
            _measure(store, sig, i)
    for i in range(7):
        store.compute_put(f"key{i}", {"CPU": i})
    pruned = store.write(op_prune(NOW, 0, 0, RowBounds(per_signature=4, rows=6)))
    assert {k: len(v) for k, v in _per(store, t.measurements, "signature").items()} == {("a",): 2, ("b",): 4}
    assert pruned.measurements == 6  # 2 per configuration beyond 4, then 2 of a's beyond 6 in all
    assert store.read(lambda c: c.execute(sa.select(sa.func.count()).select_from(t.compute_cache)).scalar()) == 6
    assert pruned.caches == 1


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


def _file(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///"))


def _fill(store: Store, n: int) -> None:
    for i in range(n):
        store.record_event(Event(time=NOW - DAY + i, event="load", model="m", reason="r" * 400))


def _pragma(url: str, name: str) -> int:
    with sqlite3.connect(_file(url)) as raw:
        return raw.execute(f"PRAGMA {name}").fetchone()[0]


def test_a_prune_gives_its_pages_back_to_the_disk(sqlite_url: str) -> None:
    with Store.open(sqlite_url) as store:
        _fill(store, 3000)
        checkpoint(store.engine)
        full = _file(sqlite_url).stat().st_size
        assert store.write(op_prune(NOW, 0, 10)).events == 2990
        said = store.submit(op_compact, transaction=False).result()
        assert said is not None and "given back (incremental_vacuum)" in said
        checkpoint(store.engine)
        assert _file(sqlite_url).stat().st_size < full / 5  # measured: about 1.6 MiB down to under 0.1 MiB
        assert len(store.events(limit=1000)) == 10
        assert store.submit(op_compact, transaction=False).result() is None  # nothing left to give back
    assert _pragma(sqlite_url, "auto_vacuum") == 2  # INCREMENTAL, from the file's first table


def test_free_pages_go_back_in_steps_each_its_own_write(sqlite_url: str) -> None:
    """Each step gives back at most COMPACT_STEP_PAGES, so no one write holds the writer for the whole; ``compact``
    takes as many steps as that needs."""
    with Store.open(sqlite_url) as store:
        store.write(lambda c: c.execute(sa.insert(t.events), [  # about 12 MiB of history, in one write
            {"time": NOW - DAY + i, "event": "load", "model": "m", "reason": "r" * 400, "details_json": "{}"}
            for i in range(25_000)]))
        store.write(op_prune(NOW, 0, 10))
        free = _pragma(sqlite_url, "freelist_count")
        assert free > 2 * COMPACT_STEP_PAGES
        first = store.submit(op_compact, transaction=False).result()
        assert first == f"{COMPACT_STEP_PAGES} free page(s) of 4096 B given back (incremental_vacuum), " \
                        f"{free - COMPACT_STEP_PAGES} left"
        assert _pragma(sqlite_url, "freelist_count") == free - COMPACT_STEP_PAGES
        steps = asyncio.run(compact(store.awrite))
        assert len(steps) == -(-(free - COMPACT_STEP_PAGES) // COMPACT_STEP_PAGES) and steps[-1].endswith(" 0 left")
        assert _pragma(sqlite_url, "freelist_count") == 0 and len(store.events(limit=1000)) == 10


def test_an_older_file_is_rebuilt_once_then_gives_pages_back(sqlite_url: str) -> None:
    with Store.open(sqlite_url) as store:
        _fill(store, 3000)
    with sqlite3.connect(_file(sqlite_url), isolation_level=None) as raw:  # as fitevict made files before
        raw.executescript("PRAGMA auto_vacuum=NONE; VACUUM")
    assert _pragma(sqlite_url, "auto_vacuum") == 0
    with Store.open(sqlite_url) as store:
        checkpoint(store.engine)
        full = _file(sqlite_url).stat().st_size
        store.write(op_prune(NOW, 0, 1000))
        said = store.submit(op_compact, transaction=False).result()
        assert said is not None and said.startswith("rebuilt once with VACUUM") and "auto_vacuum was 0" in said
        checkpoint(store.engine)
        rebuilt = _file(sqlite_url).stat().st_size
        assert rebuilt < full / 2
        store.write(op_prune(NOW, 0, 10))
        assert "incremental_vacuum" in store.submit(op_compact, transaction=False).result()
        checkpoint(store.engine)
        assert _file(sqlite_url).stat().st_size < rebuilt / 5
        assert len(store.events(limit=1000)) == 10
    assert _pragma(sqlite_url, "auto_vacuum") == 2


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_server_databases_space_is_its_autovacuums(store: Store) -> None:
    _fill(store, 20)
    store.write(op_prune(NOW, 0, 5))
    assert store.submit(op_compact, transaction=False).result() is None
    assert len(store.events()) == 5


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_server_database_has_no_write_ahead_file_to_truncate(store: Store) -> None:
    assert checkpoint(store.engine) is None
