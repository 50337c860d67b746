"""The front door killed (SIGKILL: no handler of its own runs) in the middle of a load, then started again on the
same data directory.

A seat dies with the door that started it (the kernel's parent-death signal, ``engines.process``), so the kill
leaves no engine running; what it leaves is the store's record of a seat whose load never ended. The restarted door
closes that record with an ``orphan`` event (the process no longer running), keeps no stale seat record, and serves
the next request with exactly one new seat.

The load is held mid-way by stopping the new seat (SIGSTOP) once its process exists and its record is stored, so
the door dies while the load waits for /health.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import threading
from pathlib import Path

import httpx
import pytest

from _frontdoor import FrontDoor, engine_pids_of, front_door, history, poll
from fitevict.engines.process import alive, cmdline

pytestmark = pytest.mark.e2e


def chat(fd: FrontDoor) -> httpx.Response:
    return httpx.post(fd.base_url + "/v1/chat/completions", timeout=60, json={
        "model": "slow", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})


def stored_seats(data: Path) -> list[tuple[int, str]]:
    """(pid, model) of every seat record in the door's SQLite store, read-only."""
    with sqlite3.connect(f"file:{data / 'fitevict.db'}?mode=ro", uri=True) as db:
        return [tuple(r) for r in db.execute("SELECT pid, model FROM seats")]


def engines_of(model: Path) -> list[int]:
    """Every live llama-server on this machine that runs ``model``, whoever its parent."""
    pids = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()]
    return [p for p in pids if str(model) in cmdline(p) and alive(p)]


def kill_door_mid_load(fd: FrontDoor) -> tuple[int, list[BaseException]]:
    """Ask for the model, stop its seat once it exists and is recorded, SIGKILL the door. Returns the seat's pid and
    what the client got (its connection died with the door)."""
    got: list[BaseException] = []

    def client() -> None:
        try:
            chat(fd)
        except httpx.TransportError as e:
            got.append(e)

    t = threading.Thread(target=client)
    t.start()
    [pid] = poll(lambda: len(m := [p for p in engine_pids_of(fd.proc.pid) if _is_seat(cmdline(p))]) == 1 and m,
                 "the seat's process", timeout=30)
    os.kill(pid, signal.SIGSTOP)
    poll(lambda: (pid, "slow") in stored_seats(fd.data_dir), "the seat's record", timeout=30)
    os.kill(fd.proc.pid, signal.SIGKILL)
    fd.proc.wait(30)
    t.join(30)
    return pid, got


def test_door_sigkill_during_a_load_then_restart(tmp_path: Path, zoo: dict) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "slow.gguf")
    cfg = tmp_path / "fitevict.toml"
    cfg.write_text("[policy]\nprompt_cache = false\n")
    args = ("--config", str(cfg), "--models-dir", str(models))
    with front_door(tmp_path, *args) as first:
        seat, got = kill_door_mid_load(first)
    try:
        assert len(got) == 1  # the client's connection died with the door: no answer, no hang
        poll(lambda: not alive(seat), f"seat {seat} killed with its door")
        assert not engines_of(models / "slow.gguf")
        assert stored_seats(tmp_path / "data") == [(seat, "slow")]  # the load that never ended
        assert not [e for e in history_of(tmp_path) if e[1] == "slow"]  # nothing recorded for it before
        with front_door(tmp_path, *args) as second:
            orphan = next(e for e in history(second) if e["event"] == "orphan")
            assert orphan["model"] == "slow" and orphan["details"]["pid"] == seat
            assert orphan["details"]["was_alive"] is False and "no longer running" in orphan["reason"]
            assert chat(second).status_code == 200
            running = engines_of(models / "slow.gguf")
            assert len(running) == 1 and running != [seat]  # one new seat, no duplicate
            assert [pid for pid, _ in stored_seats(tmp_path / "data")] == running  # no stale record
            assert [e["event"] for e in history(second) if e["model"] == "slow"] == ["load", "orphan"]
    finally:
        if alive(seat):
            os.kill(seat, signal.SIGKILL)


def _is_seat(argv: list[str]) -> bool:
    """A seat of the model (not the engine's calibration or a dry run the door may run meanwhile)."""
    return "--port" in argv and any(a.endswith("/slow.gguf") for a in argv)


def history_of(tmp_path: Path) -> list[tuple[str, str]]:
    """(event, model) of every history row in the store, read without a door."""
    with sqlite3.connect(f"file:{tmp_path / 'data' / 'fitevict.db'}?mode=ro", uri=True) as db:
        return [tuple(r) for r in db.execute("SELECT event, model FROM events")]
