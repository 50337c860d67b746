"""A file's measured error corrects its price at another context: a real llama-server load at ctx 512 on a fresh
store, then a plan at ctx 1024 (no measurement of that signature, no dry run of it yet). The plan's compute is the
formula plus the error the 512 load showed, labelled as such, and it is nearer the engine's own figure at 1024 than
the formula alone; a restarted supervisor learns the same correction from the history."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from fitevict.config import load_config
from fitevict.engines.llama_cpp.dryrun import dry_run
from fitevict.pricing.footprint import HOST
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.price import price
from fitevict.request.catalog import Catalog
from fitevict.request.contract import Contract
from fitevict.store import Store
from fitevict.supervisor import Supervisor
from fitevict.zoo import write_zoo
from fitevict.engines.llama_cpp.machine import host_buffers

HERE = host_buffers()  # this machine's extra host buffers (its probe, else the rule table): as its engine places

pytestmark = pytest.mark.e2e


def test_a_load_at_one_ctx_corrects_the_plan_at_another(tmp_path: Path, llama_server: Path) -> None:
    models = tmp_path / "models"
    write_zoo(models, only=["llama-gqa"])
    cfg = load_config(None, env={}, overrides={"data_dir": str(tmp_path / "data"), "models_dirs": [str(models)],
                                               "budget.ram_reserve": 0})
    store = Store.open(cfg.store_url)
    catalog = Catalog.from_config(cfg)
    path = Path(catalog.resolve("llama-gqa").path)
    s = load_structure(path)
    figures: dict[str, object] = {}

    async def first() -> None:
        sup = Supervisor(config=cfg, catalog=catalog, store=store, engine_binary=llama_server)
        await sup.start()
        try:
            seat = await sup.load("llama-gqa", Contract(ctx=512))
            assert seat.measured is not None
            measured = seat.measured.device(HOST).compute.bytes  # type: ignore[union-attr]
            formula_512 = price(s, seat.config, host=HERE).footprint.device(HOST).compute.bytes  # type: ignore[union-attr]
            figures["error"] = measured - formula_512  # type: ignore[operator]
            assert figures["error"] != 0  # the formula is not exact for compute: there is something to correct
            assert await sup.unload("llama-gqa") is not None
            figures["plan"] = sup.plan("llama-gqa", Contract(ctx=1024))
        finally:
            await sup.shutdown()

    async def again() -> None:
        sup = Supervisor(config=cfg, catalog=catalog, store=store, engine_binary=llama_server)
        await sup.start()
        try:
            figures["again"] = sup.plan("llama-gqa", Contract(ctx=1024))
        finally:
            await sup.shutdown()

    try:
        asyncio.run(first())
        plan = figures["plan"]
        assert plan.config is not None and plan.config.n_ctx == 1024 and plan.footprint is not None  # type: ignore
        compute = plan.footprint.device(HOST).compute  # type: ignore[union-attr]
        formula = price(s, plan.config, host=HERE).footprint.device(HOST).compute  # type: ignore[union-attr]
        assert formula.source == "formula" and compute.source == "formula"
        assert compute.correction == figures["error"] and compute.bytes == formula.bytes + figures["error"]
        assert compute.label == "formula+correction" and "ctx 512" in compute.correction_from
        dev = next(d for d in plan.to_json()["footprint"]["devices"] if d["name"] == HOST)  # type: ignore[union-attr]
        assert dev["sources"]["compute"] == "formula+correction"
        assert dev["corrections"]["compute"] == {"bytes": figures["error"], "predicted_bytes": formula.bytes,
                                                 "from": compute.correction_from}
        # the model, KV cache and output are exact by formula: nothing corrects them
        host = plan.footprint.device(HOST)  # type: ignore[union-attr]
        assert {host.model.label, host.context.label, host.output.label} == {"formula"}, plan.footprint.notes
        # the engine's own figure at 1024: the corrected price is nearer than the formula
        truth = dry_run(llama_server.parent, path, plan.config)
        assert not hasattr(truth, "reason"), truth
        engine = truth.compute[HOST]  # type: ignore[union-attr]
        assert abs(compute.bytes - engine) < abs(formula.bytes - engine) / 2, (compute.bytes, formula.bytes, engine)
        figures["engine_1024"], figures["formula_1024"], figures["corrected_1024"] = engine, formula.bytes, compute.bytes
        # a restarted supervisor on the same store learns the same correction from the history
        asyncio.run(again())
        again_compute = figures["again"].footprint.device(HOST).compute  # type: ignore[union-attr]
        assert again_compute == compute
        print("correction figures:", {k: v for k, v in figures.items() if k not in ("plan", "again")})
    finally:
        store.close()
        shutil.rmtree(tmp_path / "data", ignore_errors=True)
