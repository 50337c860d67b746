"""Stall detection and the load deadline, with a real process that never becomes healthy."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from fitevict.config import load_config
from fitevict.request.catalog import Catalog
from fitevict.store import Store
from fitevict.supervisor import LoadFailed, Supervisor
from fitevict.zoo import write_zoo

FAKE = """#!/bin/sh
case " $* " in
  *" --help "*) echo "usage: --fit --cache-ram --no-webui --log-verbosity --load-mode"; exit 0;;
  *" --fit off "*) echo "loading model (never finishes)"; exec sleep 600;;
  *) echo "dry run unsupported by this engine"; exit 1;;
esac
"""


def test_a_load_with_no_memory_progress_fails_as_stalled(tmp_path: Path) -> None:
    engine = tmp_path / "bin" / "llama-server"
    engine.parent.mkdir()
    engine.write_text(FAKE)
    engine.chmod(0o755)
    models = tmp_path / "models"
    write_zoo(models, only=["llama-gqa"])
    cfg = load_config(None, env={}, overrides={
        "data_dir": str(tmp_path / "data"), "models_dirs": [str(models)], "engine.stall_seconds": 1.0,
        "engine.health_timeout_seconds": 60, "engine.stop_grace_seconds": 2})
    store = Store.open(cfg.store_url)

    async def scenario() -> None:
        sup = Supervisor(config=cfg, catalog=Catalog.from_config(cfg), store=store, engine_binary=engine)
        await sup.start()
        try:
            with pytest.raises(LoadFailed) as e:
                await sup.load("llama-gqa")
            assert "stalled" in str(e.value) and "engine.stall_seconds" in str(e.value)
            assert sup.seats == {}
        finally:
            await sup.shutdown()

    try:
        asyncio.run(scenario())
        fails = store.events(event="fail")
        assert len(fails) == 1 and "stalled" in fails[0].reason and fails[0].engine_reported_bytes is None
        assert store.seats() == []  # the stalled process was stopped and forgotten
        assert not Path(f"/proc/{fails[0].details['pid']}").exists()
    finally:
        store.close()
        shutil.rmtree(tmp_path / "data", ignore_errors=True)
