"""Prices read ahead: after start-up every model's price (its structure and the engine's dry run) is read in the
background, one model at a time, so that a first request waits for none of it. Real llama-server dry runs, a real
SQLite store."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import psutil

import pytest

from fitevict.config import load_config
from fitevict.request.catalog import Catalog
from fitevict.store import Store
from fitevict.supervisor import Supervisor

pytestmark = pytest.mark.e2e


class DryRunWatch:
    """The engine dry-run processes (``--fit on``) this process starts while the block runs, seen by a thread."""

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self._stop = threading.Event()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(0.002):
            for child in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    cmd = child.cmdline()
                    if "--fit" in cmd and cmd[cmd.index("--fit") + 1] == "on":
                        self.pids.add(child.pid)

    def __enter__(self) -> "DryRunWatch":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def served(tmp_path: Path, zoo: dict, names: tuple[str, ...]) -> tuple:
    """A models folder linking ``names`` from the zoo, its config (no file), catalog and a fresh SQLite store."""
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    for name in names:
        (models / f"{name}.gguf").symlink_to(zoo[name].path)
    cfg = load_config(None, env={}, overrides={"data_dir": str(tmp_path / "data"), "models_dirs": [str(models)]})
    return cfg, Catalog.from_config(cfg), Store.open(cfg.store_url)


def test_every_model_is_priced_ahead_and_a_broken_one_is_left_to_its_request(zoo: dict, tmp_path: Path,
                                                                             llama_server: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 7)  # a header cut short
    cfg, catalog, store = served(tmp_path, zoo, ("llama-gqa", "gemma2-swa"))

    async def scenario() -> None:
        sup = Supervisor(config=cfg, catalog=catalog, store=store, engine_binary=llama_server)
        keys = [e.key for e in catalog.entries()]
        assert sorted(keys) == ["broken", "gemma2-swa", "llama-gqa"]
        for key in ("llama-gqa", "gemma2-swa"):
            asked = sup.ask(key)
            assert not sup.prices.has_dry_run(asked.path, asked.request.config)
        await sup.read_prices_ahead(keys)
        assert sup.prices_ahead == {"done": 3, "models": 3}
        for key in ("llama-gqa", "gemma2-swa"):
            asked = sup.ask(key)
            assert sup.prices.compute_source(asked.path, asked.request.config) == "dry-run"
            assert sup.plan(key).action in ("load", "ram")  # priced from the sheet read ahead, no I/O on the way
        await sup.shutdown()

    try:
        asyncio.run(scenario())
    finally:
        store.close()


def test_two_askers_of_one_dry_run_share_it(zoo: dict, tmp_path: Path, llama_server: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FITEVICT_CACHE_DIR", str(tmp_path / "cache"))  # no dry run cached on disk yet
    cfg, catalog, store = served(tmp_path, zoo, ("llama-gqa",))

    async def scenario() -> None:
        sup = Supervisor(config=cfg, catalog=catalog, store=store, engine_binary=llama_server)
        asked = sup.ask("llama-gqa")
        path, conf = asked.path, asked.request.config
        with DryRunWatch() as watch:
            await asyncio.gather(sup.prices.dry_run(asked.entry, conf, path, ()),
                                 sup.prices.dry_run(asked.entry, conf, path, ()))
        assert len(watch.pids) == 1, f"{len(watch.pids)} engine dry runs for one file and configuration"
        assert sup.prices.has_dry_run(path, conf) and not sup.prices.dry_runs_under_way
        await sup.shutdown()

    try:
        asyncio.run(scenario())
    finally:
        store.close()


def test_shutdown_during_a_read_ahead_leaves_no_engine_process(zoo: dict, tmp_path: Path, llama_server: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FITEVICT_CACHE_DIR", str(tmp_path / "cache"))  # the dry run runs, it is not read from disk
    cfg, catalog, store = served(tmp_path, zoo, ("llama-medium",))

    async def scenario() -> None:
        sup = Supervisor(config=cfg, catalog=catalog, store=store, engine_binary=llama_server)
        sup.read_ahead(["llama-medium"])
        deadline = asyncio.get_running_loop().time() + 30
        while not sup.prices.dry_runs_under_way:  # the read-ahead task reaches its dry run
            assert asyncio.get_running_loop().time() < deadline, "the read-ahead never started its dry run"
            await asyncio.sleep(0.005)
        await sup.shutdown()
        left = [c for c in psutil.Process().children(recursive=True) if c.is_running()
                and c.status() != psutil.STATUS_ZOMBIE]
        assert not left, [c.cmdline() for c in left]

    try:
        asyncio.run(scenario())
    finally:
        store.close()
