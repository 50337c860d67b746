"""Price sheets (prices.sheet): read ahead by the price book from a real store and real zoo files, they
price as the book does; whatever the book learns (a stored measurement, an accepted load, a dry run, a rescan)
makes the next sheet differ, read off the event loop; a plan on the loop takes the sheet held without any I/O.
(The audit-hook check of a plan on a sheet is in tests/test_purity.py.)"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from fitevict import planner as pl
from fitevict.budget import Budget
from fitevict.engines.llama_cpp.dryrun import DryRun
from fitevict.pricing.footprint import HOST, Term
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.request.catalog import Catalog
from fitevict.store import Store
from fitevict.engines.llama_cpp import dryrun as engine_dryrun
from fitevict.pricing.footprint import footprint_from_json
from fitevict.prices.book import PriceBook
from fitevict.units import MiB
from fitevict.zoo import write_zoo

CFG = LoadConfig(n_ctx=512, n_parallel=1)


@pytest.fixture(scope="module")
def zoo_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("sheet-zoo")
    write_zoo(d, only=["llama-gqa", "llama-tied"])
    return d


@pytest.fixture
def models(zoo_files: Path, tmp_path: Path) -> Path:
    """This test's own copies (a test may change a file on disk)."""
    d = tmp_path / "models"
    d.mkdir()
    for f in zoo_files.glob("*.gguf"):
        shutil.copy2(f, d / f.name)
    return d


@pytest.fixture
def book(tmp_path: Path):
    store = Store.open(f"sqlite:///{tmp_path / 'fitevict.db'}")
    b = PriceBook(store, tmp_path / "no-engine", "max-ram")
    b.engine_overhead[HOST] = 40 * MiB
    yield b
    store.close()


def _measured(fp, extra: int) -> dict:
    doc = json.loads(json.dumps(fp.to_json()).replace('"formula"', '"measured"'))
    doc["devices"][0]["model_bytes"] += extra
    doc["devices"][0]["total_bytes"] += extra
    doc["total_bytes"] += extra
    return doc


def test_a_sheet_prices_as_the_book_does(book: PriceBook, models: Path) -> None:
    path = models / "llama-gqa.gguf"
    sheet = book.read_sheet(path, CFG)
    for cfg in (CFG, CFG.with_(n_ctx=2048), CFG.with_(n_gpu_layers=3, devices=("CUDA0",))):
        assert sheet.signature(cfg) == book.signature(path, cfg)
        assert sheet.footprint(cfg) == book.footprint(path, cfg)
    assert book.read_sheet(path, CFG) is sheet  # nothing changed: the same sheet
    with pytest.raises(ValueError, match="adapters"):
        sheet.footprint(CFG.with_(loras=("/elsewhere/a.gguf",)))  # another adapter set has a sheet of its own


def test_a_stored_measurement_makes_the_next_sheet_differ(book: PriceBook, models: Path) -> None:
    path = models / "llama-gqa.gguf"
    before = book.read_sheet(path, CFG)
    priced = before.footprint(CFG)
    assert priced.device(HOST).model.source == "formula"
    doc = _measured(priced, 5 * MiB)
    book.store.put_measurement(book.signature(path, CFG), "llama-gqa", "llama-server", doc, total=doc["total_bytes"])
    book.forget()  # what the supervisor does once it stored the measurement
    after = book.read_sheet(path, CFG)
    assert after is not before and after.version > before.version
    assert after.footprint(CFG).device(HOST).model.source == "stored-measurement"
    assert after.footprint(CFG).total_bytes == priced.total_bytes + 5 * MiB
    assert before.footprint(CFG) == priced  # a sheet never changes: the old one still says what it said


def test_a_learned_load_and_a_dry_run_rebuild_the_sheet_off_the_loop(book: PriceBook, models: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = models / "llama-tied.gguf"
    monkeypatch.setattr(engine_dryrun, "dry_run", lambda *a, **k: DryRun(compute={HOST: 7 * MiB}, context=None))
    entry = SimpleNamespace(mmproj=None)

    async def go() -> None:
        first = await book.sheet(path, CFG)
        assert first.footprint(CFG).device(HOST).compute.source == "formula"
        await book.dry_run(entry, CFG, path, ())  # type: ignore[arg-type]
        # until its rebuild is ready, a plan on the loop takes the sheet held (labelled stale), without I/O
        assert book.sheet_now(path, CFG) is first and not book.current(first)
        dried = await book.sheet(path, CFG)
        assert dried is not first and book.current(dried)
        assert dried.footprint(CFG).device(HOST).compute == Term(7 * MiB, "dry-run")
        measured = _measured(first.footprint(CFG), 3 * MiB)
        book.learn(path, CFG.with_(n_ctx=256), footprint_from_json(measured))
        learned = await book.sheet(path, CFG)
        assert learned is not dried and learned.correction is not None and dried.correction is None
        assert learned.footprint(CFG).device(HOST).model.correction == 3 * MiB  # learned at ctx 256, applied at 512
        await book.settled()
        assert book.sheet_now(path, CFG) is learned  # the rebuild the change started found nothing more to read

    asyncio.run(go())


def test_a_rescan_rereads_a_changed_file_and_reads_the_added_models(book: PriceBook, models: Path,
                                                                    tmp_path: Path) -> None:
    from fitevict.config import load_config

    gqa, tied = models / "llama-gqa.gguf", models / "llama-tied.gguf"
    cfg = load_config(None, env={"FITEVICT_DATA_DIR": str(tmp_path / "data")}, overrides={"models_dirs": [str(models)]})
    catalog = Catalog.from_config(cfg)

    async def go() -> None:
        held = await book.sheet(gqa, CFG)
        os.utime(gqa, ns=(held.ident[2] + 10**9, held.ident[2] + 10**9))  # the file changed on disk
        book.rescanned([catalog.resolve("llama-tied")])
        await book.settled()
        now = book._sheets.get((str(gqa), ()))
        assert now is not None and now is not held and now.ident[2] == held.ident[2] + 10**9
        assert any(k[0] == str(tied) for k in book._sheets)  # read ahead of its first request

    asyncio.run(go())


def test_a_plan_on_the_loop_reads_nothing_once_its_sheet_is_held(book: PriceBook, models: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = models / "llama-gqa.gguf"
    req = pl.PlanRequest("llama-gqa", CFG, "max-gpu", 4)
    budget = Budget.declared({HOST: "4GiB", "CUDA0": "2MiB"})

    def no_io(*_a, **_k):
        raise AssertionError("I/O while planning")

    async def go() -> pl.Plan:
        await book.sheet(path, CFG)  # what the supervisor does before the request is queued (Supervisor._wait)
        assert (str(path), ()) in book._sheets
        book.forget()  # and something changed since: the plan still takes the sheet held
        with monkeypatch.context() as m:
            m.setattr(Path, "stat", no_io)
            m.setattr(Path, "is_dir", no_io)
            m.setattr(book, "store", SimpleNamespace())
            m.setattr(book, "structure", no_io)
            sheet = book.sheet_now(path, CFG)
            return pl.plan(req, [], budget, lambda _k, c: sheet.footprint(c), pl.Policy(), 0.0)

    plan = asyncio.run(go())
    assert plan.action in ("partial", "ram", "load") and plan.footprint is not None


def test_what_an_old_version_of_a_file_taught_goes_when_the_file_changes(book: PriceBook, models: Path) -> None:
    """A file rewritten or touched many times over a server's life holds what its current version taught, not one
    set of facts per version it ever had."""
    path = models / "llama-gqa.gguf"
    measured = book.footprint(path, CFG)
    for i in range(5):
        book.learn(path, CFG, measured)  # a load of this version was measured
        book.no_repack(path)
        assert book.has_dry_run(path, CFG) is False  # the book looks at the file as it is now
        st = path.stat()
        os.utime(path, ns=(st.st_mtime_ns + 10**9, st.st_mtime_ns + 10**9))  # the file changed on disk
    book.has_dry_run(path, CFG)
    kept = {k for d in (book._learned, book._grown, book._quant) for k in d} | book._no_repack
    assert [k for k in kept if k[0] == str(path)] == []  # the 5 old versions' facts are gone
    book.learn(path, CFG, measured)
    assert len(book._learned) == 1
