"""Seat logs stay within ``engine.seat_logs_disk``: the oldest go first, a running seat's log never does.

Every seat writes a new ``-lv 4`` log to ``data_dir/seats``; real seats are started and stopped here against a
folder seeded with logs an earlier run left, and the folder is read after every load.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from fitevict.config import load_config
from fitevict.request.catalog import Catalog
from fitevict.store import Store
from fitevict.supervisor import Supervisor
from fitevict.supervisor.processes import prune_dir

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


def test_prune_removes_oldest_first_and_never_a_kept_log(tmp_path: Path) -> None:
    names = _seed(tmp_path / "seats", 6)
    keep = {tmp_path / "seats" / names[0]}  # the oldest, but a running seat's
    removed, freed = prune_dir(tmp_path / "seats", 3 * OLD_LOG, keep)
    assert [p.name for p in removed] == names[1:4] and freed == 3 * OLD_LOG
    assert sorted(_logs(tmp_path / "seats")) == [names[0], *names[4:]]
    # a budget that even the kept logs exceed: everything else goes, the kept ones stay
    removed, _ = prune_dir(tmp_path / "seats", 0, keep)
    assert sorted(_logs(tmp_path / "seats")) == [names[0]]


def test_seat_logs_stay_within_the_bound_and_running_logs_are_kept(tmp_path: Path, zoo: dict,
                                                                  llama_server: Path) -> None:
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
        "budget.ram_reserve": 0, "engine.seat_logs_disk": 0, "policy.prompt_cache": False})
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
    assert [len(running) for _, running in seen] == [1, 2, 1]
    for folder, running in seen:
        assert folder == running  # the old logs and the ended seats' logs pruned, never a running one
    ended = seen[1][1]
    assert not ended & seen[2][0]
    events = store.events()
    assert sorted(e.event for e in events if e.event in ("load", "unload")) == ["load"] * 3 + ["unload"] * 3  # the last at shutdown
