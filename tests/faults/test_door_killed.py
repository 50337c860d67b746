"""The front door killed (SIGKILL: no handler of its own runs) in the middle of a load, then started again on the
same data directory.

A seat dies with the door that started it (the kernel's parent-death signal, ``engines.process``), so the kill
leaves no engine running; what it leaves is the store's record of a seat whose load never ended. The restarted door
closes that record with an ``orphan`` event (the process no longer running), keeps no stale seat record, and serves
the next request with exactly one new seat.

The load is held by the fault shim (``faultshim.c``, hold-open): the new engine blocks before it opens the model
file, and says so in a marker file; the door is killed once the store's record of the seat says it is loading, while
the load waits for /health. A stop is held the same way: the seat stopped before its unload, the
door killed once the store's record of the seat says its stop began (``stopping:unload``), while the stop waits out
its grace period. A prompt save before an idle unload is held inside the engine: the fault shim (``faultshim.c``)
lets the engine write the first bytes of the slot file, then blocks it and says so in a marker file; the door is
killed on that marker, and the engine dies with it, leaving a partial file.
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
from _shim import build_shim, shim_env
from faultrows import FaultSeen
from fitevict.engines.process import alive, cmdline

pytestmark = pytest.mark.e2e


def chat(fd: FrontDoor) -> httpx.Response:
    return httpx.post(fd.base_url + "/v1/chat/completions", timeout=60, json={
        "model": "slow", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})


def stored_seats(data: Path, *columns: str) -> list[tuple]:
    """(pid, model, *columns) of every seat record in the door's SQLite store, read-only."""
    with sqlite3.connect(f"file:{data / 'fitevict.db'}?mode=ro", uri=True) as db:
        return [tuple(r) for r in db.execute(f"SELECT {', '.join(('pid', 'model', *columns))} FROM seats")]


def engines_of(model: Path) -> list[int]:
    """Every live llama-server on this machine that runs ``model``, whoever its parent."""
    pids = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()]
    return [p for p in pids if str(model) in cmdline(p) and alive(p)]


def kill_door_mid_load(fd: FrontDoor, flag: Path) -> tuple[int, list[BaseException]]:
    """Ask for the model with its engine held before it opens the model file (the shim's hold-open), SIGKILL the door
    once the store's record of the seat says it is loading. Returns the seat's pid and what the client got (its
    connection died with the door)."""
    poll(lambda: (p := httpx.get(fd.base_url + "/health").json()["prices_read_ahead"])["done"] == p["models"],
         "the prices read ahead (the dry run opens the file too)")
    flag.touch()
    t, got = in_flight(lambda: chat(fd))
    held = Path(f"{flag}.held")
    poll(held.exists, "the engine held before it opens the model", timeout=30)
    pid = int(held.read_text())
    assert pid == one_seat(fd)
    poll(lambda: {(pid, "slow", "starting"), (pid, "slow", "loading")} & set(stored_seats(fd.data_dir, "state")),
         "the seat's record", timeout=30)
    os.kill(fd.proc.pid, signal.SIGKILL)
    fd.proc.wait(30)
    t.join(30)
    flag.unlink()
    return pid, got


@pytest.mark.fault(
    fault="the front door `SIGKILL`ed while a load waits for `/health`, then started again on the same data dir",
    kind="real door")
def test_door_sigkill_during_a_load_then_restart(tmp_path: Path, tmp_path_factory, zoo: dict,
                                                 fault_seen: FaultSeen) -> None:
    models, args = _models_dir(tmp_path, zoo, "[policy]\nprompt_cache = false\n")
    flag = tmp_path / "hold"
    env = shim_env(build_shim(tmp_path_factory.mktemp("shim")), models, flag, "hold-open", exe="llama-server")
    with front_door(tmp_path, *args, env=env) as first:
        seat, got = kill_door_mid_load(first, flag)
    try:
        # the client's connection died with the door: no answer, no hang
        assert len(fault_seen.client([type(e) for e in got], "the request in flight raised")) == 1
        poll(lambda: not alive(seat), f"seat {seat} killed with its door")
        assert fault_seen.running(engines_of(models / "slow.gguf"), "seats of the model after the kill") == []
        assert stored_seats(tmp_path / "data") == [(seat, "slow")]  # the load that never ended
        assert not [e for e in history_of(tmp_path) if e[1] == "slow"]  # nothing recorded for it before
        with front_door(tmp_path, *args, env=env) as second:
            orphan = next(e for e in history(second) if e["event"] == "orphan")
            assert orphan["model"] == "slow" and orphan["details"]["pid"] == seat
            assert fault_seen.history(orphan["details"]["was_alive"], "after the restart, `orphan` was_alive") is False
            assert "no longer running" in orphan["reason"]
            assert fault_seen.history(orphan["details"]["interrupted"], "interrupted") == "load"
            assert "its load was interrupted" in orphan["reason"]
            assert fault_seen.client(chat(second).status_code, "after the restart") == 200
            running = engines_of(models / "slow.gguf")
            # one new seat, no duplicate
            assert fault_seen.running(len(running), "seats of the model after the restart") == 1 and running != [seat]
            # no stale record
            assert fault_seen.running([pid for pid, _ in stored_seats(tmp_path / "data")] == running,
                                      "the store's seat records are the running seats")
            events = [e["event"] for e in history(second) if e["model"] == "slow"]
            assert fault_seen.history(events, "its events (newest first)") == ["load", "orphan"]
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


def in_flight(call) -> tuple[threading.Thread, list[BaseException]]:
    """``call`` in a thread; what it raised when its connection died with the door."""
    got: list[BaseException] = []

    def client() -> None:
        try:
            call()
        except httpx.TransportError as e:
            got.append(e)

    t = threading.Thread(target=client)
    t.start()
    return t, got


def _models_dir(tmp_path: Path, zoo: dict, config: str) -> tuple[Path, tuple[str, ...]]:
    """A models folder with one model, ``slow``, and the door's arguments with ``config`` as its config file."""
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "slow.gguf")
    cfg = tmp_path / "fitevict.toml"
    cfg.write_text(config)
    return models, ("--config", str(cfg), "--models-dir", str(models))


def one_seat(fd: FrontDoor) -> int:
    [pid] = poll(lambda: len(m := [p for p in engine_pids_of(fd.proc.pid) if _is_seat(cmdline(p))]) == 1 and m,
                 "the seat's process", timeout=30)
    return pid


@pytest.mark.fault(
    fault="the front door `SIGKILL`ed during a stop (an unload waiting out its grace period), then started again on "
          "the same data dir",
    kind="real door")
def test_door_sigkill_during_a_stop_then_restart(tmp_path: Path, zoo: dict, fault_seen: FaultSeen) -> None:
    models, args = _models_dir(tmp_path, zoo, "[policy]\nprompt_cache = false\n")
    with front_door(tmp_path, *args) as first:
        assert chat(first).status_code == 200
        seat = one_seat(first)
        os.kill(seat, signal.SIGSTOP)  # its stop now waits out the grace period: the door dies in the middle
        t, got = in_flight(lambda: httpx.post(f"{first.base_url}/v1/models/slow/unload", timeout=60))
        poll(lambda: (seat, "slow", "stopping:unload") in stored_seats(first.data_dir, "state"), "the stop begun")
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(30)
        t.join(30)
    try:
        # the client's connection died with the door: no answer, no hang
        assert len(fault_seen.client([type(e) for e in got], "the unload in flight raised")) == 1
        poll(lambda: not alive(seat), f"seat {seat} killed with its door")
        assert fault_seen.running(alive(seat), "the seat alive after the kill") is False
        assert [e[0] for e in history_of(tmp_path)] == ["load"]  # the unload never ended
        with front_door(tmp_path, *args) as second:
            orphan = next(e for e in history(second) if e["event"] == "orphan")
            assert orphan["details"]["pid"] == seat
            assert fault_seen.history(orphan["details"]["interrupted"], "after the restart, `orphan` interrupted") == \
                "unload"
            assert orphan["details"]["was_alive"] is False and orphan["details"]["group_left"] is False
            assert "its unload was interrupted" in orphan["reason"]
            assert fault_seen.client(chat(second).status_code, "after the restart") == 200
            running = engines_of(models / "slow.gguf")
            # one new seat, no duplicate
            assert fault_seen.running(len(running), "seats of the model after the restart") == 1 and running != [seat]
            # no stale record
            assert fault_seen.running([pid for pid, _ in stored_seats(tmp_path / "data")] == running,
                                      "the store's seat records are the running seats")
            events = [e["event"] for e in history(second) if e["model"] == "slow"]
            assert fault_seen.history(events, "its events (newest first)") == ["load", "orphan", "load"]
            assert fault_seen.history(second.log().count("Traceback"), "tracebacks in the log") == 0
    finally:
        if alive(seat):
            os.kill(seat, signal.SIGKILL)


PROMPT = " ".join(f"Rule {i}: answer briefly." for i in range(40))  # ~250 tokens: saved at an idle unload


def kv_files(data: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in (data / "kv").iterdir()}


@pytest.mark.fault(
    fault="the front door `SIGKILL`ed during a prompt (KV) save before an idle unload, the engine held after the "
          "first bytes of its slot file, then started again on the same data dir",
    kind="real door")
def test_door_sigkill_during_a_kv_save_then_restart(tmp_path: Path, tmp_path_factory, zoo: dict,
                                                    fault_seen: FaultSeen) -> None:
    models, args = _models_dir(tmp_path, zoo, "[policy]\nprompt_cache_min_tokens = 64\nidle_unload_seconds = 1\n")
    flag = tmp_path / "hold"
    env = shim_env(build_shim(tmp_path_factory.mktemp("shim")), tmp_path / "data" / "kv", flag, "hold")

    def ask(fd: FrontDoor) -> httpx.Response:
        return httpx.post(fd.base_url + "/v1/chat/completions", timeout=60, json={
            "model": "slow", "max_tokens": 3, "messages": [{"role": "system", "content": PROMPT},
                                                          {"role": "user", "content": "hi"}]})

    with front_door(tmp_path, *args, env=env) as first:
        assert ask(first).status_code == 200
        saved = poll(lambda: [e for e in history(first, event="idle-unload") if e["details"].get("kv_saved")],
                     "the first prompt saved")[0]["details"]["kv_saved"][0]
        complete = kv_files(first.data_dir)
        assert complete == {saved["file"]: saved["bytes"], saved["file"] + ".json": complete[saved["file"] + ".json"]}
        flag.touch()  # the next save is held inside the engine after its first bytes
        assert ask(first).status_code == 200
        held = Path(f"{flag}.held")
        poll(held.exists, "the engine held in its prompt save", timeout=30)
        engine = int(held.read_text())
        assert engine in engine_pids_of(first.proc.pid)
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(30)
    try:
        poll(lambda: not alive(engine), f"seat {engine} killed with its door")
        assert fault_seen.running(alive(engine), "the seat alive after the kill") is False
        partial = {n: size for n, size in kv_files(tmp_path / "data").items() if n not in complete}
        # a slot file cut short, no record
        assert fault_seen.lost(len(partial), "slot files cut short") == 1
        assert not next(iter(partial)).endswith(".json")
        assert 0 < next(iter(partial.values())) < saved["bytes"]
        flag.unlink()
        with front_door(tmp_path, *args, env=env) as second:
            # the partial file removed, the complete one kept
            assert fault_seen.running(kv_files(second.data_dir) == complete,
                                      "after the restart, the saved prompts are the complete save alone") is True
            assert f"saved prompt {next(iter(partial))} removed: a slot file without a record" in second.log()
            orphan = next(e for e in history(second) if e["event"] == "orphan")
            assert orphan["details"]["pid"] == engine
            assert fault_seen.history(orphan["details"]["interrupted"], "`orphan` interrupted") == "idle-unload"
            assert fault_seen.client(ask(second).status_code, "after the restart") == 200
            restored = poll(lambda: history(second, event="kv-restore"), "the complete save restored")
            assert fault_seen.history(restored[0]["details"]["file"] == saved["file"],
                                      "`kv-restore` of the complete save") is True
            assert fault_seen.history(second.log().count("Traceback"), "tracebacks in the log") == 0
    finally:
        if alive(engine):
            os.kill(engine, signal.SIGKILL)
