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
    client="the unload answers `200` (after the store's timeouts); requests after it are served as usual; `/health` "
           "says `degraded`, with the store's reason (`database is locked`) and what it refused",
    history="the refused `unload` is held, announced, and written in order once the lock is gone: `load`, `unload`, "
            "`load`, `load`, every one; the stopped seat's memory window (`seat_peaks`) too, and the memory sampler "
            "goes on",
    running="the stopped seat is gone; a stale seat record, if the store refused its removal, is forgotten as an "
            "orphan at the next start",
    lost="nothing")
def test_a_locked_database_loses_no_history_and_stops_nothing(tmp_path: Path, zoo: dict) -> None:
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
            assert r.status_code == 200 and r.json()["unloaded"] is True, r.text
            assert not engine_pids_of(fd.proc.pid)  # stopped all the same
            assert "not stored yet" in fd.log() and "database is locked" in fd.log()
            store = httpx.get(fd.base_url + "/health").json()["store"]
            assert store["ok"] is False and store["reason"] == "database is locked", store
            assert store["refused"]["history events"] >= 1 and store["held"]["history events"] >= 1
        finally:
            other.execute("ROLLBACK")
            other.close()
        for model in ("a", "b"):  # the scheduler knows a stopped: it loads again
            assert (r := ask(fd, model)).status_code == 200, r.text
        # the next event wrote the ones refused before it, in order
        events = poll(lambda: (h := history(fd)) and len([e for e in h if e["event"] == "load"]) == 3 and h,
                      "every load stored")
        assert [(e["event"], e["model"]) for e in reversed(events)] == [
            ("load", "a"), ("unload", "a"), ("load", "a"), ("load", "b")]
        supervisor_lines = [line for line in fd.log().splitlines()
                            if " fitevict.supervisor " in line or " fitevict.seat " in line]
        assert not [line for line in supervisor_lines if "failed" in line]  # no supervisor or seat task died of it
        # the memory sampler was refused the stopped seat's window: it held it, went on, and stored it
        assert "the memory peaks of a" in fd.log() and "the memory sampler failed" not in fd.log()
        poll(lambda: "a" in seat_peaks_of(fd.data_dir), "the refused memory window stored")
        store = poll(lambda: (h := httpx.get(fd.base_url + "/health").json())["store"]["ok"] and h["store"],
                     "the store healthy again")
        assert store["last_fault"]["refused"]["history events"] >= 1 and store["held"]["history events"] == 0
        assert "Traceback" not in fd.log()


@pytest.mark.fault(
    fault="the store's database file corrupt (not a database: random bytes) when the front door starts",
    client="normal answers",
    history="a new, empty store: the first event is the new `load`; the old file moved aside to "
            "`fitevict.db.corrupt-<unix time>`, kept byte for byte, and the server log says so (no traceback)",
    running="the door and its seats as usual",
    lost="the old history, unread (kept in the moved file)")
def test_a_corrupt_database_file_is_moved_aside_and_the_door_serves(tmp_path: Path, zoo: dict) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "a.gguf")
    (tmp_path / "data").mkdir()
    garbage = b"\x00not a database\xff" * 4096
    (tmp_path / "data" / "fitevict.db").write_bytes(garbage)
    with front_door(tmp_path, "--models-dir", str(models)) as fd:
        assert "could not be read (file is not a database): moved aside to" in fd.log()
        [aside] = fd.data_dir.glob("fitevict.db.corrupt-*[0-9]")
        assert aside.read_bytes() == garbage  # nothing deleted
        assert ask(fd, "a").status_code == 200
        poll(lambda: [e for e in history(fd) if e["event"] == "load"], "the load in the new store")
        assert "Traceback" not in fd.log()


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


def a_loaded(fd: FrontDoor) -> int:
    """Model a asked for, served and its load stored; its seat's pid."""
    assert (r := ask(fd, "a")).status_code == 200, r.text
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
    client="normal answers throughout (a load, an unload, history reads: never a traceback); `/health` lists the "
           "file moved aside (`store.moved_aside`: where, and SQLite's reason)",
    history="at the first refused write or read (\"database disk image is malformed\") the file is moved aside to "
            "`fitevict.db.corrupt-<unix time>` and a new, empty store opened in its place; what was refused "
            "meanwhile is held and written there, in order (`load` of the model asked for, then the `unload`), and "
            "the live seats' records written again",
    running="the door and its seats as usual",
    lost="the history and measurements stored before the corruption, unread (kept in the moved file)")
def test_a_database_corrupted_under_a_running_door_is_replaced_and_the_door_serves(tmp_path: Path,
                                                                                   zoo: dict) -> None:
    models = models_ab(tmp_path, zoo)
    with front_door(tmp_path, "--models-dir", str(models)) as fd:
        seat_a = a_loaded(fd)
        corrupt(fd.data_dir / "fitevict.db")
        assert (r := ask(fd, "b")).status_code == 200, r.text  # its first record finds the file corrupt
        moved = poll(lambda: httpx.get(fd.base_url + "/health").json()["store"]["moved_aside"], "the file moved")
        assert moved[0]["reason"] == "database disk image is malformed"
        [aside] = fd.data_dir.glob("fitevict.db.corrupt-*[0-9]")
        assert str(aside) == moved[0]["to"] and "found corrupt while running" in fd.log()
        # the live seats' records in the new store: a's (loaded before) written again, b's
        poll(lambda: stored_seat_pids(fd.data_dir) == set(engine_pids_of(fd.proc.pid)) | {seat_a}, "seat records")
        r = httpx.post(f"{fd.base_url}/v1/models/a/unload", timeout=120)
        assert r.status_code == 200 and r.json()["unloaded"] is True, r.text
        events = poll(lambda: len(h := history(fd)) >= 2 and h, "the events in the new store")
        assert [(e["event"], e["model"]) for e in reversed(events)] == [("load", "b"), ("unload", "a")]
        assert (r := ask(fd, "a")).status_code == 200, r.text
        assert "Traceback" not in fd.log()


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
    client="normal answers throughout (a load, an unload, history reads); `/health` lists the lost file "
           "(`store.lost_files`: \"the store's file ... was deleted while fitevict ran\" or \"... replaced by another "
           "file ...\"); before the fix the writes went on into the deleted file and `/health` said `ok`, and with "
           "the seat log folder gone every later load failed (`502`, FileNotFoundError)",
    history="the next write finds the file is not the one opened (before it writes: its device and inode) and the "
            "store opens again at its path: a new, empty one, or the copy put there; the refused event is held and "
            "written there (`load` of the model asked for, then the `unload`), the live seats' records written "
            "again; all of it still there after a restart",
    running="the door and its seats as usual; the seat log folder made again at the next load",
    lost="what the removed or replaced file held (by whoever removed it)")
@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_store_file_lost_under_a_running_door_is_opened_again(tmp_path: Path, zoo: dict, how: str) -> None:
    models = models_ab(tmp_path, zoo)
    with front_door(tmp_path, "--models-dir", str(models)) as fd:
        seat_a = a_loaded(fd)
        with sqlite3.connect(str(fd.data_dir / "fitevict.db")) as live, \
                sqlite3.connect(str(tmp_path / "backup.db")) as copy:
            live.backup(copy)  # the copy holds a's load
        lose_store(fd.data_dir, how)
        assert (r := ask(fd, "b")).status_code == 200, r.text  # its load's record finds the file lost
        lost = poll(lambda: httpx.get(fd.base_url + "/health").json()["store"]["lost_files"], "the file found lost")
        assert lost[0]["reason"].startswith("the store's file ") and \
            ("was deleted while" if how == "deleted" else "was replaced by another file while") in lost[0]["reason"]
        poll(lambda: stored_seat_pids(fd.data_dir) == set(engine_pids_of(fd.proc.pid)) | {seat_a}, "seat records")
        assert unload(fd, "a").status_code == 200
        want = [("load", "b"), ("unload", "a")] if how == "deleted" else [("load", "a"), ("load", "b"), ("unload", "a")]
        poll(lambda: [(e["event"], e["model"]) for e in reversed(history(fd))] == want, f"history {want}")
        assert "Traceback" not in fd.log()
    with front_door(tmp_path, "--models-dir", str(models)) as fd:
        stored = [(e["event"], e["model"]) for e in reversed(history(fd)) if e["event"] in ("load", "unload")]
        assert stored[:len(want)] == want, stored
