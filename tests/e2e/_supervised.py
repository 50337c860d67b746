"""What the supervisor tests share: a config, catalog and fresh store for a test, a supervisor over them, and a
scenario run to its end."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from fitevict.config import load_config
from fitevict.request.catalog import Catalog
from fitevict.store import Store
from fitevict.supervisor import Supervisor


def run(coro_fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run a test's async scenario in a fresh event loop; its result."""
    return asyncio.run(coro_fn())


def make(tmp_path: Path, models_dir: Path, llama_server: Path, *, ram_limit: int, toml: str | None = None,
         **over: Any):
    """Config (a TOML file when ``toml`` is given, plus overrides), catalog and a fresh SQLite store."""
    overrides = {"data_dir": str(tmp_path / "data"), "models_dirs": [str(models_dir)], "budget.ram_limit": ram_limit,
                 "budget.ram_reserve": 0, "engine.release_timeout_seconds": 20, **over}
    path = None
    if toml is not None:
        path = tmp_path / "fitevict.toml"
        path.write_text(toml)
    cfg = load_config(path, env={}, overrides=overrides)
    store = Store.open(cfg.store_url)
    return cfg, Catalog.from_config(cfg), store


def supervisor(cfg, catalog, store, llama_server: Path) -> Supervisor:
    """A supervisor over ``make``'s config, catalog and store, starting ``llama_server``."""
    return Supervisor(config=cfg, catalog=catalog, store=store, engine_binary=llama_server)
