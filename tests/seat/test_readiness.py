"""What a healthy seat starts with (``seat.readiness.Readiness``), over a real price book on a real SQLite store and a
real prompt keep on disk: the shrink decided for its model and context (taken once), the saved prompts of its own
signature (only where its engine keeps prompts and ``policy.prompt_cache`` is on), the repack crash it was loaded
after, and the engine overhead it is counted with (the one its price was made with, else the book's calibrated
figure; a transformers seat's own process, as priced; per GPU, only its own devices)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from fitevict.config import load_config
from fitevict.pricing.footprint import HOST
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.prices.book import PriceBook
from fitevict.prices.overhead import with_engine_overhead
from fitevict.seat.crash import RepackCrash
from fitevict.seat.readiness import Readiness
from fitevict.store import Store
from fitevict.supervisor.kvkeep import PromptKeep
from fitevict.units import GiB, MiB

from . import fakeparts

CALIBRATED = {HOST: 40 * MiB, "CUDA0": 300 * MiB, "CUDA1": 310 * MiB}


@pytest.fixture
def book(tmp_path: Path):
    store = Store.open(f"sqlite:///{tmp_path / 'fitevict.db'}")
    b = PriceBook(store, tmp_path / "no-engine", "max-ram")
    b.engine_overhead.update(CALIBRATED)
    b.overhead_origin = "calibrated"
    yield b
    store.close()


def _keep(tmp_path: Path) -> PromptKeep:
    """A prompt keep holding one saved prompt of the seat's signature ("sig") and one of another."""
    keep = PromptKeep(tmp_path / "kv", min_tokens=1, disk_budget=GiB)
    root = keep.prepare()
    for name, sig in (("mine.bin", "sig"), ("theirs.bin", "other-sig")):
        (root / name).write_bytes(b"\0" * 64)
        (root / f"{name}.json").write_text(json.dumps({
            "file": name, "model": "m", "signature": sig, "engine": "build@cpu", "tokens": 300, "bytes": 64,
            "saved_at": 1.0, "save_seconds": 0.01, "prompt_per_second": 900.0}))
    return keep


def _ready(tmp_path: Path, book: PriceBook, seat, *, prompt_cache: bool = True, shrinks: dict | None = None,
           crash: RepackCrash | None = None) -> dict:
    cfg = load_config(None, env={}, overrides={"data_dir": str(tmp_path), "policy.prompt_cache": prompt_cache})
    shrinks = {} if shrinks is None else shrinks
    asyncio.run(Readiness(shrinks, _keep(tmp_path), cfg, book).ready(seat, crash))
    return shrinks


def test_a_ready_seat_takes_its_own_shrink_once_and_the_saved_prompts_of_its_signature(tmp_path: Path,
                                                                                       book: PriceBook) -> None:
    mine, bigger = {"asked": 8192, "loaded": 2048}, {"asked": 8192, "loaded": 4096}
    shrinks = {("m", 2048): mine, ("m", 4096): bigger, ("b", 2048): {"asked": 4096, "loaded": 2048}}
    seat = fakeparts.seat(tmp_path)  # model "m" at n_ctx 2048, signature "sig"
    left = _ready(tmp_path, book, seat, shrinks=shrinks)
    assert seat.shrunk_from == mine
    assert set(left) == {("m", 4096), ("b", 2048)}  # taken once; another context's and another model's stay
    assert [s.file for s in seat.kv_candidates] == ["mine.bin"]  # never another signature's
    again = fakeparts.seat(tmp_path, port=2)
    _ready(tmp_path, book, again, shrinks=left)
    assert again.shrunk_from is None  # nothing decided for it: it loaded at the context asked


def test_no_saved_prompt_is_offered_without_the_prompt_cache_or_an_engine_that_keeps_prompts(
        tmp_path: Path, book: PriceBook) -> None:
    off = fakeparts.seat(tmp_path)
    _ready(tmp_path, book, off, prompt_cache=False)
    assert off.kv_candidates == []
    torch = fakeparts.seat(tmp_path, port=2)
    torch.engine = "transformers"  # its slots are not saved to disk
    _ready(tmp_path, book, torch)
    assert torch.kv_candidates == []


def test_the_repack_crash_it_was_loaded_after_is_kept(tmp_path: Path, book: PriceBook) -> None:
    crash = RepackCrash("SIGSEGV", 1.5, "/tmp/first.log", 80 * MiB, 60 * MiB, "CPU_REPACK")
    seat = fakeparts.seat(tmp_path)
    _ready(tmp_path, book, seat, crash=crash)
    assert seat.repack_crash is crash


def test_the_overhead_is_the_one_its_price_was_made_with_else_the_calibrated_figure(tmp_path: Path,
                                                                                  book: PriceBook) -> None:
    plain = fakeparts.seat(tmp_path)  # priced without the process overhead
    _ready(tmp_path, book, plain)
    assert plain.overhead == 40 * MiB and "calibrated" in plain.overhead_label
    priced = fakeparts.seat(tmp_path, port=2)
    priced.predicted = with_engine_overhead(fakeparts.PRICE, {HOST: 55 * MiB})
    _ready(tmp_path, book, priced)
    assert priced.overhead == 55 * MiB  # what its price counted, not the book's figure now


def test_a_gpu_seat_counts_the_overhead_of_its_own_devices_only(tmp_path: Path, book: PriceBook) -> None:
    seat = fakeparts.seat(tmp_path, config=LoadConfig(n_ctx=2048, n_parallel=1, devices=("CUDA0",),
                                                      n_gpu_layers=-1))
    _ready(tmp_path, book, seat)
    assert seat.gpu_overhead == {"CUDA0": 300 * MiB}


def test_a_transformers_seat_is_counted_with_its_own_process_as_priced(tmp_path: Path, book: PriceBook) -> None:
    seat = fakeparts.seat(tmp_path)
    seat.engine, seat.predicted_overhead = "transformers", 900 * MiB
    _ready(tmp_path, book, seat)
    assert seat.overhead == 900 * MiB  # never the llama-server build's calibration
    assert seat.overhead_label.startswith("stored-measurement: this machine's transformers seats' own process")
    unknown = fakeparts.seat(tmp_path, port=2)
    unknown.engine = "transformers"  # no transformers seat measured here yet
    _ready(tmp_path, book, unknown)
    assert unknown.overhead is None and unknown.overhead_label.startswith("unavailable, because")
    assert unknown.figures(HOST)["overhead_bytes"] is None  # never a 0 standing in for what is not known
