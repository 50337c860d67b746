"""What a new seat is priced at (``seat.price.SeatPrices``), over a real price book on a real SQLite store, a real
catalog and real GGUF files: the entry and file a request loads; its prediction, the request's quote while it is
current (the book not read again) and the book's sheet once the book has changed; a GPU placement's engine dry run
first, once (the engine's dry run itself stands in at its edge); a transformers folder's own process overhead as
priced; and the price again without repacking, from which the file loads with -nr."""

from __future__ import annotations

import dataclasses

import asyncio
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from fitevict import planner as pl
from fitevict.config import load_config
from fitevict.engines.llama_cpp.dryrun import DryRun
from fitevict.pricing.footprint import HOST, Term
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.engines.llama_cpp import dryrun as engine_dryrun
from fitevict.prices.book import PriceBook
from fitevict.request.catalog import Catalog
from fitevict.schedule.scheduler import Waiter
from fitevict.seat.price import SeatPrices
from fitevict.store import Store
from fitevict.units import MiB
from fitevict.zoo import write_zoo

CFG = LoadConfig(n_ctx=512, n_parallel=1)
GPU = CFG.with_(n_gpu_layers=-1, devices=("CUDA0",))


@pytest.fixture(scope="module")
def zoo_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("seatprice-zoo")
    write_zoo(d, only=["llama-gqa"])
    return d / "llama-gqa.gguf"


@pytest.fixture
def parts(zoo_file: Path, tmp_path: Path):
    models = tmp_path / "models"
    models.mkdir()
    path = models / "a.gguf"
    shutil.copy2(zoo_file, path)
    cfg = load_config(None, env={}, overrides={"data_dir": str(tmp_path / "data"), "models_dirs": [str(models)]})
    store = Store.open(f"sqlite:///{tmp_path / 'fitevict.db'}")
    book = PriceBook(store, tmp_path / "no-engine", "max-ram")
    reads: list[Path] = []
    real_sheet = book.sheet

    async def sheet(p, c):  # every read of the book's sheet goes through, counted
        reads.append(p)
        return await real_sheet(p, c)

    book.sheet = sheet  # type: ignore[method-assign]
    planning = SimpleNamespace(path_for=lambda request: Path(request.path))
    yield SimpleNamespace(path=path, book=book, reads=reads,
                          prices=SeatPrices(book, Catalog.from_config(cfg), planning))  # type: ignore[arg-type]
    store.close()


def _waiter(path: Path, quote=None, cfg: LoadConfig = CFG) -> Waiter:
    return Waiter(request=pl.PlanRequest("a", cfg, alloc_mode="max-ram", path=str(path), quote=quote), arrived=0.0)


def test_a_request_loads_its_catalog_entry_and_the_file_it_names(parts) -> None:
    entry, path = parts.prices.asked(_waiter(parts.path))
    assert entry.key == "a" and Path(entry.path) == parts.path and path == parts.path


def test_a_current_quote_is_the_prediction_and_a_changed_book_prices_again(parts) -> None:
    async def go():
        quote = await parts.book.sheet(parts.path, CFG)
        entry, path = parts.prices.asked(_waiter(parts.path, quote))
        parts.reads.clear()
        held = await parts.prices.predicted(_waiter(parts.path, quote), entry, CFG, path)
        assert held == quote.footprint(CFG) and parts.reads == []  # priced once: the book not read again
        doc = json.loads(json.dumps(held.to_json()).replace('"formula"', '"measured"'))
        doc["devices"][0]["model_bytes"] += 5 * MiB
        doc["devices"][0]["total_bytes"] += 5 * MiB
        doc["total_bytes"] += 5 * MiB
        parts.book.store.put_measurement(parts.prices.signature(path, CFG), "a", "llama-server", doc,
                                         total=doc["total_bytes"])
        parts.book.forget()  # a measurement stored: the quote is stale
        again = await parts.prices.predicted(_waiter(parts.path, quote), entry, CFG, path)
        assert parts.reads == [path] and again != held
        assert again.device(HOST).model.source == "stored-measurement"
        assert again.total_bytes == held.total_bytes + 5 * MiB

    asyncio.run(go())


def test_a_gpu_placement_runs_the_engines_dry_run_first_and_once(parts, monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[LoadConfig] = []

    def dry_run(engine_dir, path, cfg, **kw) -> DryRun:
        runs.append(cfg)
        return DryRun(compute={"CUDA0": 7 * MiB, HOST: 1 * MiB}, context=None)

    monkeypatch.setattr(engine_dryrun, "dry_run", dry_run)

    async def go():
        entry, path = parts.prices.asked(_waiter(parts.path, cfg=GPU))
        cpu = await parts.prices.predicted(_waiter(parts.path), entry, CFG, path)
        assert runs == [] and cpu.device(HOST).compute.source == "formula"  # no GPU, no dry run
        first = await parts.prices.predicted(_waiter(parts.path, cfg=GPU), entry, GPU, path)
        again = await parts.prices.predicted(_waiter(parts.path, cfg=GPU), entry, GPU, path)
        assert runs == [GPU]  # once per file and configuration
        assert first.device("CUDA0").compute == Term(7 * MiB, "dry-run") and again == first

    asyncio.run(go())


def test_a_transformers_seat_carries_its_own_process_overhead_another_engine_none(parts) -> None:
    parts.book.torch_overhead = 900 * MiB
    entry, _path = parts.prices.asked(_waiter(parts.path))
    assert parts.prices.own_overhead(dataclasses.replace(entry, engine="transformers"), CFG) == 900 * MiB
    assert parts.prices.own_overhead(entry, CFG) is None  # llama-server: its build's calibrated overhead instead


def test_the_price_without_repacking_is_the_books_from_then_on(parts) -> None:
    book, path = parts.book, parts.path
    assert book.repacks(path)
    version = book.version

    ran = []

    async def dry_run(entry, cfg, p, extra_args) -> None:  # the engine's dry run of the -nr configuration, recorded
        ran.append((p, cfg))

    book.dry_run = dry_run
    entry, _ = parts.prices.asked(_waiter(path))

    async def go():
        return await parts.prices.without_repack(entry, path, CFG)

    got = asyncio.run(go())
    assert ran == [(path, CFG)]  # its compute priced by the engine's own dry run of that configuration
    assert not book.repacks(path) and book.version > version  # planned and started with -nr from now on
    assert got == book.read_sheet(path, CFG).footprint(CFG)
    assert parts.prices.host_buffers() == book.host.label()
