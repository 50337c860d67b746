"""Seat logs stay within ``[logs]``: a model's newest ``logs.seats_per_model``, all within ``logs.seats_disk``, the
oldest going first; a running seat's log never goes.

Every seat writes a new ``-lv 4`` log to ``data_dir/seats``; real seats are started and stopped here against a
folder seeded with logs an earlier run left, and the folder is read after every load.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from _frontdoor import front_door, history, poll
from faultrows import FaultSeen
from fitevict.config import load_config
from fitevict.request.catalog import Catalog
from fitevict.store import Event, Store
from fitevict.store.queries import op_record_event
from fitevict.supervisor import Supervisor
from fitevict.seat.processes import prune_dir

pytestmark = pytest.mark.e2e
OLD_LOG = 50_000  # bytes in each log an earlier run left


def _logs(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in folder.glob("*.log")}


def _seed(folder: Path, n: int) -> list[str]:
    """``n`` logs of an earlier run, oldest first, dated an hour ago and before."""
    folder.mkdir(parents=True)
    names = []
    for i in range(n):
        p = folder / f"old-{i}.log"
        p.write_bytes(b"x" * OLD_LOG)
        t = 1_000_000 + i  # long ago, in order
        os.utime(p, (t, t))
        names.append(p.name)
    return names


@pytest.mark.fault(
    fault="seat logs over `logs.seats_disk` (the pruning rule alone)",
    kind="rule alone")
def test_prune_removes_oldest_first_and_never_a_kept_log(tmp_path: Path, fault_seen: FaultSeen) -> None:
    names = _seed(tmp_path / "seats", 6)
    keep = {tmp_path / "seats" / names[0]}  # the oldest, but a running seat's
    removed, freed = prune_dir(tmp_path / "seats", 3 * OLD_LOG, keep)
    gone = [names.index(p.name) for p in removed]
    assert fault_seen.lost(gone, "logs removed (their age rank of 6, 0 the oldest and kept)") == [1, 2, 3]
    assert freed == 3 * OLD_LOG
    left = [names.index(n) for n in sorted(_logs(tmp_path / "seats"))]
    assert fault_seen.running(left, "logs left (age rank)") == [0, 4, 5]
    # a budget that even the kept logs exceed: everything else goes, the kept ones stay
    removed, _ = prune_dir(tmp_path / "seats", 0, keep)
    left = [names.index(n) for n in sorted(_logs(tmp_path / "seats"))]
    assert fault_seen.running(left, "logs left with a budget of 0") == [0]


@pytest.mark.fault(
    fault="one model's seat logs over `logs.seats_per_model` (the pruning rule alone)",
    kind="rule alone")
def test_each_model_keeps_its_newest_logs_and_never_a_kept_one(tmp_path: Path, fault_seen: FaultSeen) -> None:
    folder = tmp_path / "seats"
    folder.mkdir()
    made: dict[str, list[str]] = {"qwen2.5-0.5b": [], "llama-3.2-1b": []}
    for i in range(8):  # interleaved in time: qwen2.5, llama, qwen2.5, ...
        model = list(made)[i % 2]
        p = folder / f"{model}-{i:08x}.log"
        p.write_bytes(b"x" * (100 + i))
        os.utime(p, (2_000_000 + i, 2_000_000 + i))
        made[model].append(p.name)
    keep = {folder / made["llama-3.2-1b"][0]}  # that model's oldest, a running seat's
    removed, freed = prune_dir(folder, 10**9, keep, per_model=2)
    left = set(_logs(folder))
    fault_seen.running(sorted(left), "logs left")
    assert left == {*made["qwen2.5-0.5b"][-2:], *made["llama-3.2-1b"][-2:], made["llama-3.2-1b"][0]}
    assert fault_seen.lost({p.name for p in removed}, "logs removed") == {
        *made["qwen2.5-0.5b"][:2], *made["llama-3.2-1b"][1:2]}
    assert freed == sum(100 + int(p.stem.rsplit("-", 1)[1], 16) for p in removed)


@pytest.mark.fault(
    fault="seat logs piling up in `data_dir/seats/` (every seat writes a new `-lv 4` log), real seats started and "
          "stopped with `logs.seats_disk` 0",
    kind="collaborator with stand-ins")
def test_seat_logs_stay_within_the_bound_and_running_logs_are_kept(tmp_path: Path, zoo: dict,
                                                                  llama_server: Path, fault_seen: FaultSeen) -> None:
    """A budget of 0: before each seat starts, every log goes but those of seats that run; so the folder holds
    exactly the running seats' logs after each load, whatever size the engine's logs have on this machine."""
    models = tmp_path / "models"
    models.mkdir()
    for name in ("a", "b", "c"):
        shutil.copyfile(zoo["llama-gqa"].path, models / f"{name}.gguf")
    seats = tmp_path / "data" / "seats"
    _seed(seats, 6)
    cfg = load_config(None, env={}, overrides={
        "data_dir": str(tmp_path / "data"), "models_dirs": [str(models)], "budget.ram_limit": 4 * 1024**3,
        "budget.ram_reserve": 0, "logs.seats_disk": 0, "policy.prompt_cache": False})
    store = Store.open(cfg.store_url)

    async def scenario() -> list[tuple[set[str], set[str]]]:
        sup = Supervisor(config=cfg, catalog=Catalog.from_config(cfg), store=store, engine_binary=llama_server)
        await sup.start()
        seen = []

        def look() -> None:  # (logs in the folder, logs of running seats)
            seen.append((set(_logs(seats)), {s.log_path.name for s in sup.seats.values()}))

        try:
            await sup.load("a")
            look()
            await sup.load("b")  # a runs: its log stays, over the budget
            look()
            await sup.unload("a")
            await sup.unload("b")
            await sup.load("c")  # a and b ended: their logs go
            look()
        finally:
            await sup.shutdown()
        return seen

    seen = asyncio.run(scenario())
    assert fault_seen.running([len(running) for _, running in seen], "seats running after each load") == [1, 2, 1]
    # the old logs and the ended seats' logs pruned, never a running one
    assert fault_seen.running([folder == running for folder, running in seen],
                              "the logs left are exactly the running seats' (after each load)") == [True] * 3
    ended = seen[1][1]
    assert fault_seen.lost(len(ended - seen[2][0]), "ended seats' logs removed, of 2") == len(ended) == 2
    events = store.events()
    kinds = fault_seen.history(sorted(e.event for e in events if e.event in ("load", "unload")), "events")
    assert kinds == ["load"] * 3 + ["unload"] * 3  # the last at shutdown


@pytest.mark.fault(
    fault="history and load records piling up in the store over months; its write-ahead log growing",
    kind="real door")
def test_the_door_prunes_its_store_and_says_its_data_folders_size(tmp_path: Path, zoo: dict,
                                                                  fault_seen: FaultSeen) -> None:
    import subprocess
    import sys

    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "a.gguf")
    now = time.time()
    with Store.open(f"sqlite:///{tmp_path / 'data' / 'fitevict.db'}") as store:
        for i in range(12):  # a year ago and on: beyond 30 days
            store.record_event(Event(time=now - (365 - i) * 86_400, event="load", model="a"))
        for i in range(3):  # this week
            store.record_event(Event(time=now - (3 - i) * 86_400, event="unload", model="a"))
    _seed(tmp_path / "data" / "seats", 2)
    cfg = tmp_path / "fitevict.toml"
    cfg.write_text("[logs]\nhistory_days = 30\n")
    with front_door(tmp_path, "--config", str(cfg), "--models-dir", str(models)) as fd:
        usage = poll(lambda: httpx.get(fd.base_url + "/health", timeout=10).json()["data_dir"], "the data folder read")
        kept = history(fd)
        # the year-old loads pruned at start-up
        assert fault_seen.history([e["event"] for e in kept], "events kept") == ["unload"] * 3
        said = "pruned 12 history event(s)"
        assert fault_seen.lost(fd.log().count(said), f"{said!r} logged") == 1
        on_disk = {p: p.stat().st_blocks * 512 for p in (tmp_path / "data").rglob("*") if p.is_file()}
        logs = fault_seen.client(usage["parts"]["seat logs"], "`/health` `data_dir.parts` seat logs, bytes")
        assert logs == sum(n for p, n in on_disk.items() if p.parent.name == "seats")
        assert usage["parts"]["store"] > 0 and usage["path"] == str(tmp_path / "data")
        ps = subprocess.run([sys.executable, "-m", "fitevict.cli", "ps", "--url", fd.base_url], capture_output=True,
                            text=True, timeout=60)
        assert fault_seen.client(ps.returncode, "`fitevict ps` exit code") == 0, ps.stderr
        assert "data folder" in ps.stdout and "seat logs" in ps.stdout


@pytest.mark.fault(
    fault="history written beyond `logs.history_rows` between two prunes (`logs.prune_seconds` 3600), in a store file "
          "made before it gave space back (`auto_vacuum` NONE) and swollen by 4,000 old events",
    kind="real door")
def test_the_history_bound_holds_between_prunes_and_the_store_file_shrinks(tmp_path: Path, zoo: dict,
                                                                           fault_seen: FaultSeen) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "a.gguf")
    db = tmp_path / "data" / "fitevict.db"
    start = time.time()
    old = [op_record_event(Event(time=start - 3600 + i * 0.1, event="load", model="old", reason="r" * 400))
           for i in range(4000)]
    with Store.open(f"sqlite:///{db}") as store:
        store.write(lambda conn: [op(conn) for op in old])
    with sqlite3.connect(db, isolation_level=None) as raw:  # a file as fitevict made them before: no auto_vacuum
        raw.executescript("PRAGMA auto_vacuum=NONE; VACUUM; PRAGMA wal_checkpoint(TRUNCATE)")
    swollen = db.stat().st_size
    cfg = tmp_path / "fitevict.toml"
    cfg.write_text("[logs]\nhistory_rows = 4\nprune_seconds = 3600\n[policy]\nprompt_cache = false\n")
    with front_door(tmp_path, "--config", str(cfg), "--models-dir", str(models)) as fd:
        poll(lambda: db.stat().st_size < swollen / 10, "the store file shrunk by the start-up round")
        said = "pruned 3996 history event(s)"
        assert fault_seen.lost(fd.log().count(said), f"{said!r} logged") == 1
        assert fault_seen.history("rebuilt once with VACUUM" in fd.log(), "the log says 'rebuilt once with VACUUM'")
        last = max(e["id"] for e in history(fd))
        for _ in range(3):  # six events, with no prune between
            r = httpx.post(fd.base_url + "/v1/chat/completions", timeout=120, json={
                "model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            assert fault_seen.client(r.status_code, "each request") == 200, r.text
            unloaded = httpx.post(f"{fd.base_url}/v1/models/a/unload", timeout=120).status_code
            assert fault_seen.client(unloaded, "each unload") == 200
            kept = poll(lambda: (h := history(fd)) and h[0]["event"] == "unload" and h[0]["id"] > last + 1 and h,
                        "the load and the unload recorded")
            last = kept[0]["id"]
            assert fault_seen.history(len(kept), "events after each write (bound 4)") <= 4
        assert [(e["event"], e["model"]) for e in kept] == [("unload", "a"), ("load", "a")] * 2
        assert fd.log().count("pruned ") == 1  # held by each write, not by another round
        shrunk = fault_seen.running(round(db.stat().st_size / swollen, 3), "the store file's size, of its size before")
        assert shrunk < 1 / 10
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as raw:
        # INCREMENTAL from now on
        assert fault_seen.running(raw.execute("PRAGMA auto_vacuum").fetchone()[0], "the file's auto_vacuum") == 2
