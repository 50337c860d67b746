"""The store's database locked by another writer (past SQLite's busy timeout) while the front door swaps models:
clients are served and seats stop and load as if nothing happened; the events the store refused are kept, the
server log says which and why, and they are written, in order, once the lock is gone: no history is lost.

The store's file corrupt, at start or under a running door: it is moved aside (kept, unread) and a new store opened
in its place; while running, the events refused meanwhile are held and written to the new store, the live seats'
records too, and clients are served throughout."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import httpx
import pytest

from _frontdoor import FrontDoor, engine_pids_of, front_door, history, poll
from faultrows import FaultSeen

pytestmark = pytest.mark.e2e


def ask(fd: FrontDoor, model: str) -> httpx.Response:
    return httpx.post(fd.base_url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})


def unload(fd: FrontDoor, model: str) -> httpx.Response:
    return httpx.post(f"{fd.base_url}/v1/models/{model}/unload", timeout=120)


def seat_peaks_of(data: Path) -> list[str]:
    """The model of every memory window in the store, read-only."""
    with sqlite3.connect(f"file:{data / 'fitevict.db'}?mode=ro", uri=True) as db:
        return [r[0] for r in db.execute("SELECT model FROM seat_peaks")]


@pytest.mark.fault(
    fault="the store's database locked by another writer (`BEGIN EXCLUSIVE`, past SQLite's 5 s busy timeout) during "
          "an unload",
    kind="real door")
def test_a_locked_database_loses_no_history_and_stops_nothing(tmp_path: Path, zoo: dict,
                                                              fault_seen: FaultSeen) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for name in ("a", "b"):
        shutil.copyfile(zoo["llama-gqa"].path, models / f"{name}.gguf")
    cfg = tmp_path / "fitevict.toml"
    cfg.write_text("[policy]\nprompt_cache = false\n")
    with front_door(tmp_path, "--config", str(cfg), "--models-dir", str(models)) as fd:
        assert (r := ask(fd, "a")).status_code == 200, r.text
        poll(lambda: [e for e in history(fd) if e["event"] == "load"], "a's load stored")
        other = sqlite3.connect(str(fd.data_dir / "fitevict.db"), isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")  # another program holds the write lock
        try:
            r = unload(fd, "a")  # its stop cannot be recorded now
            assert fault_seen.client(r.status_code, "the unload, the database locked") == 200
            assert r.json()["unloaded"] is True, r.text
            # stopped all the same
            assert fault_seen.running(engine_pids_of(fd.proc.pid), "seats running after the unload") == []
            assert "not stored yet" in fd.log() and "database is locked" in fd.log()
            store = httpx.get(fd.base_url + "/health").json()["store"]
            assert store["ok"] is False
            assert fault_seen.client(store["reason"], "`/health` store.reason") == "database is locked", store
            assert store["refused"]["history events"] >= 1
            assert fault_seen.lost(store["held"]["history events"], "history events held in memory, not lost") >= 1
        finally:
            other.execute("ROLLBACK")
            other.close()
        for model in ("a", "b"):  # the scheduler knows a stopped: it loads again
            assert fault_seen.client((r := ask(fd, model)).status_code, "requests after it") == 200, r.text
        # the next event wrote the ones refused before it, in order
        events = poll(lambda: (h := history(fd)) and len([e for e in h if e["event"] == "load"]) == 3 and h,
                      "every load stored")
        assert fault_seen.history([f"{e['event']} {e['model']}" for e in reversed(events)], "history") == [
            "load a", "unload a", "load a", "load b"]
        supervisor_lines = [line for line in fd.log().splitlines()
                            if " fitevict.supervisor " in line or " fitevict.seat " in line]
        assert not [line for line in supervisor_lines if "failed" in line]  # no supervisor or seat task died of it
        # the memory sampler was refused the stopped seat's window: it held it, went on, and stored it
        assert "the memory peaks of a" in fd.log() and "the memory sampler failed" not in fd.log()
        poll(lambda: "a" in seat_peaks_of(fd.data_dir), "the refused memory window stored")
        store = poll(lambda: (h := httpx.get(fd.base_url + "/health").json())["store"]["ok"] and h["store"],
                     "the store healthy again")
        assert store["last_fault"]["refused"]["history events"] >= 1
        assert fault_seen.lost(store["held"]["history events"], "history events still held at the end") == 0
        assert fault_seen.history(fd.log().count("Traceback"), "tracebacks in the log") == 0


@pytest.mark.fault(
    fault="the store's database file corrupt (not a database: random bytes) when the front door starts",
    kind="real door")
def test_a_corrupt_database_file_is_moved_aside_and_the_door_serves(tmp_path: Path, zoo: dict,
                                                                   fault_seen: FaultSeen) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "a.gguf")
    (tmp_path / "data").mkdir()
    garbage = b"\x00not a database\xff" * 4096
    (tmp_path / "data" / "fitevict.db").write_bytes(garbage)
    with front_door(tmp_path, "--models-dir", str(models)) as fd:
        said = "could not be read (file is not a database): moved aside to"
        assert fault_seen.history(said in fd.log(), f"the log says {said!r}") is True
        [aside] = fd.data_dir.glob("fitevict.db.corrupt-*[0-9]")
        # nothing deleted
        assert fault_seen.lost(aside.read_bytes() != garbage, "the moved-aside file changed") is False
        assert fault_seen.client(ask(fd, "a").status_code, "a request") == 200
        loads = poll(lambda: [e for e in history(fd) if e["event"] == "load"], "the load in the new store")
        fault_seen.history([e["event"] for e in loads], "the new store's events")
        assert fault_seen.history(fd.log().count("Traceback"), "tracebacks in the log") == 0


def stored_seat_pids(data: Path) -> set[int]:
    with sqlite3.connect(f"file:{data / 'fitevict.db'}?mode=ro", uri=True) as db:
        return {r[0] for r in db.execute("SELECT pid FROM seats")}


def models_ab(tmp_path: Path, zoo: dict) -> Path:
    """A models folder with two small models, a and b."""
    models = tmp_path / "models"
    models.mkdir()
    for name in ("a", "b"):
        shutil.copyfile(zoo["llama-gqa"].path, models / f"{name}.gguf")
    return models


def a_loaded(fd: FrontDoor, seen: FaultSeen) -> int:
    """Model a asked for, served and its load stored; its seat's pid."""
    assert seen.client((r := ask(fd, "a")).status_code, "before the fault") == 200, r.text
    poll(lambda: [e for e in history(fd) if e["event"] == "load"], "a's load stored")
    [seat_a] = engine_pids_of(fd.proc.pid)
    return seat_a


def corrupt(db: Path) -> None:
    """Everything of the database in its main file (a checkpoint), then random bytes over every page but the first:
    the header stays, every table is garbage ("database disk image is malformed")."""
    with sqlite3.connect(str(db), isolation_level=None) as conn:
        assert conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0  # not busy
    size = db.stat().st_size
    with db.open("r+b") as f:
        f.seek(4096)
        f.write(os.urandom(size - 4096))


@pytest.mark.fault(
    fault="the store's database file corrupted under a running front door (random bytes over every page but the "
          "first, after a checkpoint)",
    kind="real door")
def test_a_database_corrupted_under_a_running_door_is_replaced_and_the_door_serves(tmp_path: Path,
                                                                                   zoo: dict,
                                                                                   fault_seen: FaultSeen) -> None:
    models = models_ab(tmp_path, zoo)
    with front_door(tmp_path, "--models-dir", str(models)) as fd:
        seat_a = a_loaded(fd, fault_seen)
        corrupt(fd.data_dir / "fitevict.db")
        # its first record finds the file corrupt
        assert fault_seen.client((r := ask(fd, "b")).status_code, "a load after it") == 200, r.text
        moved = poll(lambda: httpx.get(fd.base_url + "/health").json()["store"]["moved_aside"], "the file moved")
        reason = fault_seen.client(moved[0]["reason"], "`/health` store.moved_aside reason")
        assert reason == "database disk image is malformed"
        [aside] = fd.data_dir.glob("fitevict.db.corrupt-*[0-9]")
        assert str(aside) == moved[0]["to"] and "found corrupt while running" in fd.log()
        # the live seats' records in the new store: a's (loaded before) written again, b's
        poll(lambda: stored_seat_pids(fd.data_dir) == set(engine_pids_of(fd.proc.pid)) | {seat_a}, "seat records")
        fault_seen.running(sorted(stored_seat_pids(fd.data_dir)) == sorted({*engine_pids_of(fd.proc.pid), seat_a}),
                           "the new store's seat records are the running seats")
        r = httpx.post(f"{fd.base_url}/v1/models/a/unload", timeout=120)
        assert fault_seen.client(r.status_code, "an unload") == 200 and r.json()["unloaded"] is True, r.text
        events = poll(lambda: len(h := history(fd)) >= 2 and h, "the events in the new store")
        assert fault_seen.history([f"{e['event']} {e['model']}" for e in reversed(events)], "the new store's history") \
            == ["load b", "unload a"]
        assert fault_seen.client((r := ask(fd, "a")).status_code, "a load after it") == 200, r.text
        assert fault_seen.history(fd.log().count("Traceback"), "tracebacks in the log") == 0


def lose_store(data: Path, how: str) -> None:
    """``deleted``: the whole data directory removed (store, its -wal and -shm, seat logs, saved prompts), as a
    cleaner would; ``replaced``: the store's file replaced by a copy taken earlier (``backup.db``, renamed over it),
    as a restore from a copy would."""
    if how == "deleted":
        shutil.rmtree(data)
    else:
        os.replace(data.parent / "backup.db", data / "fitevict.db")


@pytest.mark.fault(
    fault="the data directory removed under a running front door (store, seat logs, saved prompts: `rm -r`), or the "
          "store's file replaced by an older copy (renamed over it)",
    kind="real door")
@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_store_file_lost_under_a_running_door_is_opened_again(tmp_path: Path, zoo: dict, how: str,
                                                                fault_seen: FaultSeen) -> None:
    models = models_ab(tmp_path, zoo)
    with front_door(tmp_path, "--models-dir", str(models)) as fd:
        seat_a = a_loaded(fd, fault_seen)
        with sqlite3.connect(str(fd.data_dir / "fitevict.db")) as live, \
                sqlite3.connect(str(tmp_path / "backup.db")) as copy:
            live.backup(copy)  # the copy holds a's load
        lose_store(fd.data_dir, how)
        # its load's record finds the file lost
        assert fault_seen.client((r := ask(fd, "b")).status_code, "a load after it") == 200, r.text
        lost = poll(lambda: httpx.get(fd.base_url + "/health").json()["store"]["lost_files"], "the file found lost")
        reason = fault_seen.client(lost[0]["reason"].replace(str(fd.data_dir), "<data>"),
                                   "`/health` store.lost_files reason")
        assert reason.startswith("the store's file ") and \
            ("was deleted while" if how == "deleted" else "was replaced by another file while") in lost[0]["reason"]
        poll(lambda: stored_seat_pids(fd.data_dir) == set(engine_pids_of(fd.proc.pid)) | {seat_a}, "seat records")
        fault_seen.running(sorted(stored_seat_pids(fd.data_dir)) == sorted({*engine_pids_of(fd.proc.pid), seat_a}),
                           "the store's seat records are the running seats")
        assert fault_seen.client(unload(fd, "a").status_code, "an unload") == 200
        want = [("load", "b"), ("unload", "a")] if how == "deleted" else [("load", "a"), ("load", "b"), ("unload", "a")]
        poll(lambda: [(e["event"], e["model"]) for e in reversed(history(fd))] == want, f"history {want}")
        fault_seen.history([f"{e['event']} {e['model']}" for e in reversed(history(fd))], "history")
        assert fault_seen.history(fd.log().count("Traceback"), "tracebacks in the log") == 0
    with front_door(tmp_path, "--models-dir", str(models)) as fd:
        stored = [(e["event"], e["model"]) for e in reversed(history(fd)) if e["event"] in ("load", "unload")]
        assert fault_seen.history(stored[:len(want)] == want, "the same history after a restart") is True, stored
