"""A first load's host price holds against the seat's peak PSS once every slot's context is full.

The price is the server's for a first load: rules, this machine's host buffer table, the engine's dry-run compute
and the engine process's overhead: the part calibrated here on a fresh cache (at the peak of a filled context of
llama-gqa, which is not checked here) and the parts that scale with the model (``pricing.process``). The seat is
started as a seat starts, its process tree's PSS sampled every 20 ms from spawn through the load and through every
slot filled with ``n_ctx_seq - 32`` prompt tokens and 32 generated (``bench/_filled.py``). The price may fall 2%
under the peak or exceed it by 10%, or 4 MiB either way for a model file under 200 MiB. The peak counts the engine
binary's own pages whole, as for a seat alone (as the calibration does): PSS splits them with every other process
of the same binary, which on a shared machine would read several MiB less for reasons that are not the price's.
(A first load, before any request, reads under its price by design: the price holds what the seat grows to.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fitevict.engines.overhead import CALIBRATION_MODEL, calibrate_overhead
from fitevict.engines.machine import host_buffers
from fitevict.pricing.footprint import HOST
from fitevict.pricing.loadconfig import LoadConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from _filled import allowed, predict, run_filled, within  # noqa: E402

HERE = host_buffers()  # this machine's extra host buffers (its probe, else the rule table): as its engine places

pytestmark = pytest.mark.e2e

SEAT = LoadConfig(n_ctx=4096, n_parallel=2)
MODELS = ("llama-tied", "granitehybrid-moe", "gemma3-swa")  # dense GQA, hybrid MoE, sliding window


@pytest.fixture(scope="module")
def overhead(llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> int:
    mp = pytest.MonkeyPatch()
    mp.setenv("FITEVICT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))  # a fresh install
    try:
        rec = calibrate_overhead(llama_server)
        assert isinstance(rec, dict), rec
        yield int(rec["overhead"][HOST])
    finally:
        mp.undo()


@pytest.mark.parametrize("model", MODELS)
def test_price_holds_against_peak_pss_of_a_filled_context(zoo: dict, llama_server: Path, overhead: int,
                                                         model: str, tmp_path: Path) -> None:
    assert model != CALIBRATION_MODEL  # a model the overhead was measured on cannot check it
    path = zoo[model].path
    pred = predict(llama_server, path, SEAT, HERE, overhead)
    got = run_filled(llama_server, path, SEAT, pred, tmp_path / "seat.log")
    assert all(p + g == pred.n_ctx_seq for p, g in got.tokens), got.tokens  # every slot's context is full
    size = path.stat().st_size
    under, over = allowed(got.peak_fill, size)
    detail = (f"predicted {pred.host:,} B ({pred.buffers:,} buffers + {pred.calibrated:,} calibrated + "
              f"{dict(pred.terms)} scaling), peak PSS {got.peak_fill:,} B with the binary counted whole "
              f"({got.peak_fill_pss:,} B as read, {got.neighbours} processes of the same binary beside it; load "
              f"{got.peak_load:,} B), logged buffers {got.logged_buffers}; allowed -{under:,} / +{over:,} B")
    assert within(pred.host, got.peak_fill, size), detail
