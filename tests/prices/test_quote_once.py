"""A request is priced once: the price sheet read when it is queued is its quote, and the plan and the seat's
prediction use that quote while it is current (real Supervisor, real llama-server, real SQLite store). The price
book is spied on, not replaced: every call goes through to it and is counted."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from fitevict.config import load_config
from fitevict.request.catalog import Catalog
from fitevict.store import Store
from fitevict.supervisor import Supervisor

pytestmark = pytest.mark.e2e


def _spy(book, calls: list[tuple[str, object]]) -> None:
    """Count the book's price reads (``sheet``, ``sheet_now``) and keep what each returned."""
    for name in ("sheet", "sheet_now"):
        real = getattr(book, name)
        if asyncio.iscoroutinefunction(real):
            async def spied(*a, _real=real, _name=name, **k):
                got = await _real(*a, **k)
                calls.append((_name, got))
                return got
        else:
            def spied(*a, _real=real, _name=name, **k):
                got = _real(*a, **k)
                calls.append((_name, got))
                return got
        setattr(book, name, spied)


def test_a_cold_load_reads_its_price_once_and_plans_and_predicts_with_that_quote(tmp_path: Path, zoo: dict,
                                                                                 llama_server: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "a.gguf")
    cfg = load_config(None, env={}, overrides={
        "data_dir": str(tmp_path / "data"), "models_dirs": [str(models)], "budget.ram_limit": 4 * 1024**3,
        "budget.ram_reserve": 0, "policy.prompt_cache": False, "server.read_prices_ahead": False})
    store = Store.open(cfg.store_url)
    calls: list[tuple[str, object]] = []

    async def scenario():
        sup = Supervisor(config=cfg, catalog=Catalog.from_config(cfg), store=store, engine_binary=llama_server)
        await sup.start()
        try:
            _spy(sup.prices, calls)
            await sup.load("a")
            seat = sup.seats["a"]
            return seat.predicted, seat.config
        finally:
            await sup.shutdown()

    predicted, config = asyncio.run(scenario())
    store.close()
    assert [name for name, _ in calls] == ["sheet"]  # once, when queued: not again for the plan or the seat
    quote = calls[0][1]
    assert predicted == quote.footprint(config)  # the seat's prediction is the quote's price
