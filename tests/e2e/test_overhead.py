"""The engine process's own memory, calibrated once per binary at the peak of a filled context (on llama-gqa, which
is not checked here) and priced for each model with the parts that scale with it (``pricing.process``).

Each figure is checked against its own measurement, on a seat started as a seat starts, its allocator traced, its
context filled (``engines.llama_cpp.overhead.measure_filled``: PSS every 20 ms from spawn, the engine's own file
pages counted whole; they are priced apart, once per binary, ``pricing.pages``):

- the priced buffers against the buffers the engine reports (the allocator trace, to the byte): equal but for the
  dry run's rounding of the compute buffer (its log prints 0.01 MiB);
- the priced process overhead (calibrated + rules) against what the process held beyond those buffers and the
  binary's own file pages at its peak: within ``OVERHEAD_SLACK``; without the calibrated part it would miss by more;
- the host price against the peak: within the filled-context bounds (2% under, 10% over, or 4 MiB for a file under
  200 MiB); the first load, before any request, reads under it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fitevict.engines.llama_cpp.dryrun import dry_run
from fitevict.engines.llama_cpp.overhead import (CALIBRATION_CONFIG, CALIBRATION_MODEL, FilledSeat, calibrate_overhead,
                                       calibrated_overhead, measure_filled, model_terms,
                                                 shared_pages)
from fitevict.engines.llama_cpp.machine import host_buffers
from fitevict.pricing.footprint import HOST
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.logparse import PRECISION_BYTES
from fitevict.pricing.price import price
from fitevict.prices.overhead import with_engine_overhead
from fitevict.units import MiB

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from _filled import allowed, within  # noqa: E402

HERE = host_buffers()  # this machine's extra host buffers (its probe, else the rule table): as its engine places

pytestmark = pytest.mark.e2e

SEAT = LoadConfig(n_ctx=4096, n_parallel=1)
OVERHEAD_SLACK = 3 * MiB  # heap and arena pages a run holds or not; the calibration's runs agree within 0.2 MiB


@pytest.fixture(scope="module")
def calibrated(llama_server: Path, zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> int:
    mp = pytest.MonkeyPatch()
    mp.setenv("FITEVICT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))  # a fresh install: nothing stored
    try:
        assert calibrated_overhead(llama_server) is None
        rec = calibrate_overhead(llama_server, host=HERE)
        assert isinstance(rec, dict), rec
        assert calibrated_overhead(llama_server) == rec["overhead"]
        scaling = sum(t["bytes"] for t in rec["terms"])
        # the calibrated figure is what a seat of the calibration model holds beyond its buffers and its own scaling
        # parts on a run of its own, not only in the runs it was taken from
        again = measure_filled(llama_server, zoo[CALIBRATION_MODEL].path, CALIBRATION_CONFIG)
        assert isinstance(again, FilledSeat), again
        seen = again.peak_bytes - again.own_bytes - again.buffer_bytes - scaling  # the binary's own pages apart
        assert abs(rec["overhead"][HOST] - seen) <= OVERHEAD_SLACK, (rec["overhead"][HOST], seen)
        n_seq = CALIBRATION_CONFIG.n_ctx
        assert all(p + g == n_seq for run in rec["runs"] for p, g in run["tokens"])  # measured filled
        assert shared_pages(llama_server).bytes == rec["shared_pages"]["bytes"] > 0  # read back as measured
        yield rec["overhead"][HOST]
    finally:
        mp.undo()


@pytest.mark.parametrize("model", ["llama-medium", "qwen2-k256", "granitehybrid-moe"])
def test_each_figure_against_its_own_measurement(zoo: dict, llama_server: Path, calibrated: int,
                                                 model: str) -> None:
    assert model != CALIBRATION_MODEL
    path = zoo[model].path
    s = load_structure(path)
    dry = dry_run(llama_server.parent, path, SEAT)
    assert not hasattr(dry, "reason"), dry
    priced = price(s, SEAT, compute=dry.compute, context=dry.context, host=HERE)  # type: ignore[union-attr]
    buffers = priced.footprint.bytes_on(HOST)
    host = with_engine_overhead(priced.footprint, {HOST: calibrated}, terms=model_terms(s, SEAT, HERE)).bytes_on(HOST)
    overhead = host - buffers
    seat = measure_filled(llama_server, path, SEAT)
    assert isinstance(seat, FilledSeat), seat
    assert all(p + g == priced.n_ctx_seq for p, g in seat.tokens), seat.tokens  # every slot's context is full

    # buffers: the price against the engine's own account, to the byte but the dry run's 0.01 MiB
    assert abs(buffers - seat.buffer_bytes) <= PRECISION_BYTES, (buffers, seat.buffer_bytes)
    # the process beyond its buffers, at its peak, against the priced overhead
    seen = seat.peak_bytes - seat.own_bytes - seat.buffer_bytes  # the binary's own file pages are priced apart
    assert abs(overhead - seen) <= OVERHEAD_SLACK, (overhead, seen, calibrated)
    assert abs(overhead - calibrated - seen) > abs(overhead - seen)  # the calibrated part brings it closer
    # the whole host price of the only seat of its binary (it carries the binary's shared pages) against the peak,
    # and the first load under it
    host += shared_pages(llama_server).bytes
    under, over = allowed(seat.peak_bytes, path.stat().st_size)
    assert within(host, seat.peak_bytes, path.stat().st_size), (host, seat.peak_bytes, -under, over)
    assert seat.listen_bytes <= host, (seat.listen_bytes, host)


def test_the_supervisor_prices_a_first_load_with_the_process(tmp_path: Path, zoo: dict, llama_server: Path,
                                                            calibrated: int) -> None:
    """A fresh store (nothing learned from loads yet), the calibration above in the cache: the supervisor's first
    price of a model holds its buffers as the engine reports them and its process as measured through a filled
    context, each apart."""
    import asyncio
    import shutil

    from fitevict.request.catalog import Catalog
    from fitevict.config import load_config
    from fitevict.engines.llama_cpp.fill import PeakSampler, fill
    from fitevict.pricing.kv import resolve_context
    from fitevict.store import Store
    from fitevict.supervisor import Supervisor

    models = tmp_path / "models"
    models.mkdir()
    path = Path(shutil.copyfile(zoo["llama-q8_0"].path, models / "llama-q8_0.gguf"))
    cfg = load_config(None, env={}, overrides={"data_dir": str(tmp_path / "data"), "models_dirs": [str(models)],
                                               "budget.ram_limit": 4 * 1024**3})
    store = Store.open(cfg.store_url)

    async def scenario():
        sup = Supervisor(config=cfg, catalog=Catalog.from_config(cfg), store=store, engine_binary=llama_server)
        await sup.start()
        try:
            seat = await sup.load("llama-q8_0")
            first = seat.host_mem.host_bytes if seat.host_mem is not None else None
            rc = resolve_context(load_structure(path), seat.config)
            sampler = PeakSampler(seat.pid, phase="fill").start()  # type: ignore[arg-type]
            try:
                await asyncio.to_thread(fill, seat.base_url, rc.n_parallel, rc.n_ctx_seq)
            finally:
                sampler.stop()
            return seat, first, sampler.peak("fill")
        finally:
            await sup.shutdown()

    seat, first, peak = asyncio.run(scenario())
    predicted = seat.predicted.bytes_on(HOST)
    terms = model_terms(load_structure(path), seat.config, HERE)
    assert seat.overhead == calibrated + sum(t.bytes for t in terms)  # the calibration and the model's own rules
    assert "measured" in seat.predicted.host_source and any("tokenizer" in n for n in seat.predicted.notes)
    # buffers: the price against the load log (0.005 MiB per line: model, KV, compute, output; and the dry run's)
    assert seat.measured is not None
    assert abs(predicted - seat.overhead - seat.measured.bytes_on(HOST)) <= 5 * PRECISION_BYTES
    # the host price against PSS: the first load under it, the filled peak within the bounds. The only seat of its
    # binary carries the binary's shared pages (pricing.pages), measured by the calibration: its planned figure
    assert seat.seat.pages is not None and seat.seat.pages.source.startswith("measured")
    planned = predicted + seat.seat.pages.bytes
    assert first is not None and peak is not None and first <= planned
    size = path.stat().st_size
    assert within(planned, peak.alone, size), (planned, peak, allowed(peak.alone, size))
