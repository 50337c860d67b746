"""The data directory full (ENOSPC) under a running front door: an LD_PRELOAD shim (``faultshim.c``) fails every
write and fsync to a file under the data directory with ENOSPC while a flag file exists, in the door and in its
seats, as a full disk does. The door keeps serving (a swap included); ``/health`` says the store is ``degraded``,
with the database's reason and which figures it refused; the events it could not store are held in memory and
written, in order, once space returns, with no new event needed; no client sees a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from _frontdoor import FrontDoor, engine_pids_of, front_door, history, poll
from _shim import build_shim, shim_env
from faultrows import FaultSeen

pytestmark = pytest.mark.e2e


def ask(fd: FrontDoor, model: str) -> httpx.Response:
    return httpx.post(fd.base_url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})


def store_health(fd: FrontDoor) -> dict:
    return httpx.get(fd.base_url + "/health", timeout=30).json()["store"]


@pytest.mark.fault(
    fault="the data directory full (`ENOSPC` on every write and fsync under it, in the door and its seats: an "
          "`LD_PRELOAD` shim) during an unload and a load, then space back",
    kind="real door")
def test_a_full_data_directory_loses_no_history_and_stops_nothing(tmp_path: Path, tmp_path_factory,
                                                                   zoo: dict, fault_seen: FaultSeen) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "a.gguf")
    full = tmp_path / "full"
    env = shim_env(build_shim(tmp_path_factory.mktemp("shim")), tmp_path / "data", full, "enospc")
    with front_door(tmp_path, "--models-dir", str(models), env=env) as fd:
        assert (r := ask(fd, "a")).status_code == 200, r.text
        poll(lambda: [e for e in history(fd) if e["event"] == "load"], "a's load stored")
        full.touch()  # the disk is full from now on
        try:
            r = httpx.post(f"{fd.base_url}/v1/models/a/unload", timeout=120)
            assert fault_seen.client(r.status_code, "the unload on a full disk") == 200
            assert r.json()["unloaded"] is True, r.text
            # loads it again, on a full disk
            assert fault_seen.client((r := ask(fd, "a")).status_code, "a load on a full disk") == 200, r.text
            store = poll(lambda: (s := store_health(fd))["held"]["history events"] == 2 and s, "both events held")
            assert fault_seen.lost(store["held"]["history events"], "history events held in memory, not lost") == 2
            assert store["ok"] is False
            assert fault_seen.client(store["reason"], "`/health` store.reason") == "database or disk is full", store
            assert store["refused"]["history events"] >= 2 and store["refused"]["seat records"] >= 1, store
            assert fault_seen.client(httpx.get(fd.base_url + "/health").json()["status"], "`/health` status") == \
                "degraded"
            # reads still work: what was stored before
            assert fault_seen.history([e["event"] for e in history(fd)], "history read on a full disk") == ["load"]
        finally:
            full.unlink()
        # space is back: the held events are written by the retry, in order, with no new event
        events = poll(lambda: len(h := history(fd)) == 3 and h, "the held events written")
        assert fault_seen.history([e["event"] for e in reversed(events)], "space back: history") == \
            ["load", "unload", "load"]
        assert fault_seen.running(len(engine_pids_of(fd.proc.pid)), "seats running") == 1
        store = poll(lambda: (s := store_health(fd))["ok"] and not any(s["held"].values()) and s,
                     "the store healthy again, nothing held (the memory sampler's window stored at its next reading)")
        assert set(store["held"]) == {"history events", "memory peaks (seat_peaks)"}
        assert store["last_fault"]["reason"] == "database or disk is full"
        assert fault_seen.client(httpx.get(fd.base_url + "/health").json()["status"], "then `/health` status") == "ok"
        assert "the store refuses writes from now on" in fd.log() and "the store takes writes again" in fd.log()
        assert fault_seen.history(fd.log().count("Traceback"), "tracebacks in the log") == 0
