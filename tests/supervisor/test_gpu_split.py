"""A load over two GPUs is split by their free memory, as llama.cpp splits by default: priced so, and started with
the same split (-ts), so the engine places its layers where they were priced. NVML is faked (the hardware edge)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fitevict.config import load_config
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.placement import default_split, layers_per_device
from fitevict.pricing.price import price
from fitevict.request.catalog import Catalog
from fitevict.store import Store
from fitevict.supervisor import Supervisor
from fitevict.units import GiB
from fitevict.zoo import write_zoo
from host.fake_nvml import FakeGpu, FakeNvml
from fitevict.engines.llama_cpp.machine import host_buffers

HERE = host_buffers()  # this machine's extra host buffers (its probe, else the rule table): as its engine places

ENGINE = """#!/bin/sh
case " $* " in
  *" --help "*) echo "usage: --fit --cache-ram --no-webui --log-verbosity --load-mode"; exit 0;;
  *) echo "not started by this test"; exit 1;;
esac
"""
TWO = ("CUDA0", "CUDA1")


@pytest.fixture
def setup(tmp_path: Path):
    engine = tmp_path / "bin" / "llama-server"
    engine.parent.mkdir()
    engine.write_text(ENGINE)
    engine.chmod(0o755)
    models = tmp_path / "models"
    write_zoo(models, only=["llama-gqa"])  # 3 blocks + the output: 4 offloadable layers
    cfg = load_config(None, env={}, overrides={"data_dir": str(tmp_path / "data"), "models_dirs": [str(models)]})
    store = Store.open(cfg.store_url)
    yield cfg, engine, store
    store.close()
    shutil.rmtree(tmp_path / "data", ignore_errors=True)


def _supervisor(cfg, engine: Path, store: Store, free_gib: tuple[int, int]) -> Supervisor:
    nvml = FakeNvml([FakeGpu(uuid=f"GPU-{i}", total=80 * GiB, used=(80 - f) * GiB) for i, f in enumerate(free_gib)])
    return Supervisor(config=cfg, catalog=Catalog.from_config(cfg), store=store, engine_binary=engine, nvml=nvml)


def test_the_split_follows_free_memory_in_price_and_argv(setup) -> None:
    cfg, engine, store = setup
    per_free: dict[tuple[int, int], tuple] = {}
    for free in ((60, 20), (20, 60)):
        sup = _supervisor(cfg, engine, store, free)
        plan = sup.plan("llama-gqa")
        assert plan.action == "load" and plan.config is not None and plan.config.devices == TWO
        # llama.cpp's rule over NVML's free memory: split points 0.75 (or 0.25) over 4 layers
        weights = default_split(TWO, {"CUDA0": free[0] * GiB, "CUDA1": free[1] * GiB})
        want = layers_per_device(3, 4, TWO, weights)
        assert want == ((3.0, 1.0) if free == (60, 20) else (1.0, 3.0))
        assert plan.config.tensor_split == want
        assert f"layers split {want[0]:g}/{want[1]:g} by free memory (nvml): {free[0]:.1f}/{free[1]:.1f} GiB" \
            in plan.reason and plan.split in plan.reason
        # priced per device as that split places the weights, not evenly
        fp = plan.footprint
        assert fp is not None
        model = tuple(fp.device(d).model.bytes for d in TWO)  # type: ignore[union-attr]
        exact = price(load_structure(sup.ask("llama-gqa").path),
                      plan.config.with_(tensor_split=want), host=HERE).footprint
        assert model == tuple(exact.device(d).model.bytes for d in TWO)  # type: ignore[union-attr]
        per_free[free] = model
        # the seat's argv carries the very split that was priced
        entry = sup.catalog.resolve("llama-gqa")
        argv = sup.launch_spec(entry, Path(entry.path), plan.config, 1).argv
        assert argv[argv.index("-ts") + 1] == f"{int(want[0])},{int(want[1])}"
        assert argv[argv.index("-dev") + 1] == "CUDA0,CUDA1"
        assert plan.to_json()["placement"]["tensor_split"] == list(want)
    # more free memory, more layers: the bytes move with the free memory
    (a0, a1), (b0, b1) = per_free[(60, 20)], per_free[(20, 60)]
    assert a0 > a1 and b1 > b0


def test_an_even_split_is_not_what_is_priced(setup) -> None:
    """The split matters: an even split of the same load puts other bytes on each device."""
    cfg, engine, store = setup
    plan = _supervisor(cfg, engine, store, (60, 20)).plan("llama-gqa")
    assert plan.config is not None and plan.footprint is not None
    even = price(load_structure(Path(Catalog.from_config(cfg).resolve("llama-gqa").path)),
                 LoadConfig(**{**plan.config.to_json(), "devices": TWO, "tensor_split": ()}), host=HERE).footprint
    assert even.device("CUDA0").model.bytes != plan.footprint.device("CUDA0").model.bytes  # type: ignore[union-attr]


def test_one_gpu_or_a_given_split_is_left_alone(setup) -> None:
    cfg, engine, store = setup
    nvml = FakeNvml([FakeGpu(total=80 * GiB, used=20 * GiB)])
    sup = Supervisor(config=cfg, catalog=Catalog.from_config(cfg), store=store, engine_binary=engine, nvml=nvml)
    plan = sup.plan("llama-gqa")
    assert plan.config is not None and plan.config.tensor_split == () and plan.split == ""


def test_a_resident_split_by_free_memory_still_serves_when_free_memory_moved(setup) -> None:
    """Once loaded, its own bytes change what is free, so a new plan would split otherwise: the resident still serves
    (the split is part of the placement, which any placement serves under max-gpu); an explicit -ts must match."""
    from fitevict import planner as pl
    from fitevict.budget import Budget

    cfg, _engine, _store = setup
    path = Path(Catalog.from_config(cfg).resolve("llama-gqa").path)
    s = load_structure(path)
    budget = Budget.declared({"CPU": "64GiB", "CUDA0": {"total": "80GiB", "free": "60GiB"},
                              "CUDA1": {"total": "80GiB", "free": "20GiB"}})
    req = pl.PlanRequest("m", LoadConfig(n_ctx=512), n_layer=s.n_layer + 1)
    price_fn = lambda _k, c: price(s, c, host=HERE).footprint  # noqa: E731
    first = pl.plan(req, [], budget, price_fn, pl.Policy(), 0.0)
    assert first.config is not None and first.config.tensor_split == (3.0, 1.0)
    moved = Budget.declared({"CPU": "64GiB", "CUDA0": {"total": "80GiB", "free": "20GiB"},
                             "CUDA1": {"total": "80GiB", "free": "60GiB"}})
    assert pl.plan(req, [], moved, price_fn, pl.Policy(), 0.0).config.tensor_split == (1.0, 3.0)  # type: ignore
    resident = pl.Resident("m", first.config, dict(first.needed_bytes))
    assert pl.plan(req, [resident], moved, price_fn, pl.Policy(), 1.0).action == "hit"
    fixed = pl.PlanRequest("m", LoadConfig(n_ctx=512, n_gpu_layers=-1, devices=TWO, tensor_split=(1.0, 3.0)),
                           alloc_mode="explicit", n_layer=s.n_layer + 1)
    again = pl.plan(fixed, [resident], moved, price_fn, pl.Policy(), 1.0)
    assert again.action != "hit" and again.config is not None and again.config.tensor_split == (1.0, 3.0)
    assert "requested -ts 1,3" in again.reason
