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

from _frontdoor import FrontDoor, front_door, history, poll
from _shim import build_shim, shim_env

pytestmark = pytest.mark.e2e


def ask(fd: FrontDoor, model: str) -> httpx.Response:
    return httpx.post(fd.base_url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})


def store_health(fd: FrontDoor) -> dict:
    return httpx.get(fd.base_url + "/health", timeout=30).json()["store"]


@pytest.mark.fault(
    fault="the data directory full (`ENOSPC` on every write and fsync under it, in the door and its seats: an "
          "`LD_PRELOAD` shim) during an unload and a load, then space back",
    client="normal answers throughout (`200`: the unload, a load of the same model, history reads); `/health` says "
           "`status: degraded` and, under `store`, `database or disk is full`, the figures refused (history events, "
           "seat records, memory peaks) and the events held",
    history="the `unload` and the `load` made while full are held in memory and written, in order, within seconds of "
            "space returning, with no new event: `load`, `unload`, `load`; `/health` is `ok` again, the fault kept "
            "as `last_fault`",
    running="the seat loaded while full, as usual; nothing stopped by a refused write",
    lost="nothing (the held events are lost only if the door stops before space returns: the log counts them)")
def test_a_full_data_directory_loses_no_history_and_stops_nothing(tmp_path: Path, tmp_path_factory,
                                                                   zoo: dict) -> None:
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
            assert r.status_code == 200 and r.json()["unloaded"] is True, r.text
            assert (r := ask(fd, "a")).status_code == 200, r.text  # loads it again, on a full disk
            store = poll(lambda: (s := store_health(fd))["held"]["history events"] == 2 and s, "both events held")
            assert store["ok"] is False and store["reason"] == "database or disk is full", store
            assert store["refused"]["history events"] >= 2 and store["refused"]["seat records"] >= 1, store
            assert httpx.get(fd.base_url + "/health").json()["status"] == "degraded"
            assert [e["event"] for e in history(fd)] == ["load"]  # reads still work: what was stored before
        finally:
            full.unlink()
        # space is back: the held events are written by the retry, in order, with no new event
        events = poll(lambda: len(h := history(fd)) == 3 and h, "the held events written")
        assert [e["event"] for e in reversed(events)] == ["load", "unload", "load"]
        store = poll(lambda: (s := store_health(fd))["ok"] and not any(s["held"].values()) and s,
                     "the store healthy again, nothing held (the memory sampler's window stored at its next reading)")
        assert set(store["held"]) == {"history events", "memory peaks (seat_peaks)"}
        assert store["last_fault"]["reason"] == "database or disk is full"
        assert httpx.get(fd.base_url + "/health").json()["status"] == "ok"
        assert "the store refuses writes from now on" in fd.log() and "the store takes writes again" in fd.log()
        assert "Traceback" not in fd.log()
