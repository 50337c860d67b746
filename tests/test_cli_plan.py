"""`fitevict plan MODEL --json`: the planner through the CLI, on declared machines and residents, priced by the
server's own price book (the same store, the same learned overheads and measurements) and the same policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fitevict.cli import app
from fitevict.pricing.footprint import HOST
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.price import price
from fitevict.units import MiB, format_size
from fitevict.zoo import write_zoo
from fitevict.engines.llama_cpp.machine import host_buffers

HERE = host_buffers()  # this machine's extra host buffers (its probe, else the rule table): as its engine places


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("plan-zoo")
    write_zoo(d, only=["llama-medium", "llama-moe"])
    return d


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store of each test's own (the offline plan reads what was learned from it, as the server does)."""
    d = tmp_path / "plan-data"
    monkeypatch.setenv("FITEVICT_DATA_DIR", str(d))
    return d


def host_bytes(path: Path, ctx: int) -> int:
    """What the server's price book asks on the host for ``path`` at ``ctx`` (-np 1): the formula plus the engine
    process's own calibrated overhead and, for the door's first seat of the engine, its binary's shared pages, as
    ``fitevict plan`` prices it."""
    from fitevict.cli.serve import engine_binary
    from fitevict.config import load_config
    from fitevict.store import Store
    from fitevict.prices.learned import prime_price_book
    from fitevict.prices.book import PriceBook

    cfg = load_config(None, env={"FITEVICT_DATA_DIR": os.environ["FITEVICT_DATA_DIR"]})
    binary = engine_binary(cfg)
    with Store.open(cfg.store_url) as store:
        book = PriceBook(store, binary.parent, cfg.policy.default_alloc_mode)
        prime_price_book(book, store, binary, calibrate=False)
        fp = book.footprint(path, LoadConfig(n_ctx=ctx, n_parallel=1))
        # the first seat of its engine carries the engine binary's shared file pages (pricing.pages) as well
        return fp.bytes_on(HOST) + (fp.pages.bytes if fp.pages is not None else 0)


def plan(*args: str, env: dict[str, str] | None = None) -> dict:
    r = CliRunner().invoke(app, ["plan", *args, "--json"], env={"FITEVICT_CONFIG": "", **(env or {})})
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_refusal_carries_the_largest_ctx_that_fits(zoo_dir: Path) -> None:
    med = zoo_dir / "llama-medium.gguf"
    ram = host_bytes(med, 4096) - 1 * MiB  # 1 MiB short of ctx 4096
    out = plan("llama-medium", "--models-dir", str(zoo_dir), "--ram", str(ram), "--ctx", "4096")
    assert out["action"] == "refuse" and out["evict"] == []
    assert out["needed_bytes"][HOST] == host_bytes(med, 4096) > out["available_bytes"][HOST]
    largest = out["largest_ctx"]
    assert largest is not None and largest % 256 == 0
    assert host_bytes(med, largest) <= ram < host_bytes(med, largest + 256)  # re-priced: it really fits, +256 not
    assert str(largest) in out["reason"] + out["remedy"]
    assert out["budget"]["devices"][0]["total"]["source"] == "declared"


def test_lru_evicts_only_what_it_must(zoo_dir: Path, tmp_path: Path) -> None:
    med = zoo_dir / "llama-medium.gguf"
    need = host_bytes(med, 4096)
    residents = [
        {"key": "old", "bytes": {HOST: 200 * MiB}, "last_used": 1.0},
        {"key": "newer", "bytes": {HOST: 200 * MiB}, "last_used": 2.0},
        {"key": "pinned-oldest", "bytes": {HOST: 200 * MiB}, "last_used": 0.5, "pinned": True},
    ]
    f = tmp_path / "res.json"
    f.write_text(json.dumps(residents))
    # room for the medium model plus two residents, not three: exactly one must go. The medium model stays
    # under half the budget (need / (need + 450 MiB) < 0.5), so it is not exclusive.
    ram = need + 450 * MiB
    assert need / ram < 0.5
    out = plan("llama-medium", "--models-dir", str(zoo_dir), "--ram", str(ram), "--residents", str(f))
    assert out["action"] in ("load", "ram") and [e["key"] for e in out["evict"]] == ["old"]
    assert out["free_bytes_after"][HOST] >= 0
    assert out["placement"]["ctx"] == 4096 and out["placement"]["n_gpu_layers"] == 0


def test_moe_spills_experts_before_layers(zoo_dir: Path) -> None:
    moe = load_structure(zoo_dir / "llama-moe.gguf")
    full = price(moe, LoadConfig(n_ctx=4096, n_parallel=1, n_gpu_layers=moe.n_layer + 1, devices=("CUDA0",)), host=HERE)
    gpu_all = full.footprint.bytes_on("CUDA0")
    # a GPU a little too small for everything: the plan keeps every layer and moves experts to the CPU
    out = plan("llama-moe", "--models-dir", str(zoo_dir), "--ram", "4GiB", "--gpu", f"CUDA0={gpu_all - 1}")
    assert out["action"] == "partial", out["reason"]
    assert out["placement"]["n_gpu_layers"] == moe.n_layer + 1 and out["placement"]["n_cpu_moe"] >= 1
    assert out["needed_bytes"]["CUDA0"] <= gpu_all - 1


def test_unknown_model_lists_close_matches(zoo_dir: Path) -> None:
    r = CliRunner().invoke(app, ["plan", "llama-medum", "--models-dir", str(zoo_dir)], env={"FITEVICT_CONFIG": ""})
    assert r.exit_code == 2 and "llama-medium" in r.output


def test_plan_fits_an_80_column_terminal(zoo_dir: Path) -> None:
    med = zoo_dir / "llama-medium.gguf"
    ram = host_bytes(med, 4096) - 1 * MiB
    r = subprocess.run([sys.executable, "-m", "fitevict.cli", "plan", "llama-medium", "--models-dir", str(zoo_dir),
                        "--ram", str(ram), "--ctx", "4096"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "80", "FITEVICT_CONFIG": ""})  # FITEVICT_DATA_DIR: ours
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in r.stdout, r.stdout
    assert lines[0].startswith("refuse llama-medium:")
    header = next(line for line in lines if line.startswith("device"))
    assert header.split() == ["device", "needed", "budget", "free", "now", "free", "after", "avail."]
    cpu = lines[lines.index(header) + 2]  # the row under the header's rule
    assert format_size(host_bytes(med, 4096)) in cpu  # the figure in full, not cut


def test_the_offline_plan_is_the_servers_plan(zoo_dir: Path, tmp_path: Path) -> None:
    """The same state (store with a measurement, config, declared machine, no residents) gives the same verdict and
    the same numbers from ``fitevict plan`` and from the server's supervisor."""
    import asyncio

    from fitevict.cli.serve import engine_binary
    from fitevict.config import load_config
    from fitevict.budget import Budget
    from fitevict.request.catalog import Catalog
    from fitevict.request.contract import Contract
    from fitevict.store import Store
    from fitevict.supervisor import Supervisor

    med = zoo_dir / "llama-medium.gguf"
    before = host_bytes(med, 4096)
    ram = before + 64 * MiB
    cfg = load_config(None, env={"FITEVICT_DATA_DIR": os.environ["FITEVICT_DATA_DIR"]},
                      overrides={"models_dirs": [str(zoo_dir)]})
    declared = Budget.declared({HOST: {"total": ram, "reserve": 0}})

    async def server_plan() -> dict:
        with Store.open(cfg.store_url) as store:
            sup = Supervisor(config=cfg, catalog=Catalog.from_config(cfg), store=store,
                             engine_binary=engine_binary(cfg), budget_fn=lambda: declared)
            # a measurement stored by an earlier load of the same signature: both must price by it
            sig = sup.prices.signature(med, sup.ask("llama-medium", Contract()).request.config)
            fp = sup.prices.footprint(med, sup.ask("llama-medium", Contract()).request.config)
            doc = json.loads(json.dumps(fp.to_json()).replace('"formula"', '"engine-reported"'))
            extra = 5 * MiB  # measured 5 MiB above the formula: a plan that reads the store says so
            doc["devices"][0]["model_bytes"] += extra
            doc["devices"][0]["total_bytes"] += extra
            # a stored measurement is the engine's buffers: the process's own memory is priced on top of it
            doc["host"]["committed_bytes"] += extra - doc.pop("overhead", {}).get(HOST, 0)
            doc["total_bytes"] += extra
            store.put_measurement(sig, "llama-medium", "llama-server", doc, total=doc["total_bytes"])
            await sup.start()
            try:
                return sup.plan("llama-medium").to_json()
            finally:
                await sup.shutdown()

    server = asyncio.run(server_plan())
    offline = plan("llama-medium", "--models-dir", str(zoo_dir), "--ram", str(ram))
    offline.pop("budget", None)
    assert server["action"] == offline["action"] == "ram"
    assert offline["needed_bytes"][HOST] == before + 5 * MiB  # priced by the stored measurement, not the formula
    for k in ("needed_bytes", "free_bytes_after", "placement", "evict", "reason"):
        assert offline[k] == server[k], k


def test_a_unified_device_s_bytes_are_planned_against_the_host_too(zoo_dir: Path) -> None:
    base = ("llama-medium", "--models-dir", str(zoo_dir), "--ctx", "4096", "--gpu", "Vulkan0=1GiB")
    whole = plan(*base, "--ram", "8GiB")  # separate memories: all layers on Vulkan0, the rest on the host
    assert whole["action"] == "load"
    host, vk = whole["needed_bytes"]["CPU"], whole["needed_bytes"]["Vulkan0"]
    assert vk > 64 * MiB
    # RAM for the host's part and 64 MiB more: separate memories still load it whole ...
    args = (*base, "--ram", str(host + 64 * MiB))
    assert plan(*args)["action"] == "load"
    # ... but declared unified, Vulkan0's bytes are RAM too: counted on the host, they do not fit there whole
    out = plan(*args, env={"FITEVICT_UMA": "Vulkan0=true"})
    assert out["action"] != "load", out["reason"]
    if out["action"] == "partial":
        assert out["needed_bytes"]["CPU"] <= host + 64 * MiB  # the host's part and Vulkan0's together
    vk_budget = next(d for d in out["budget"]["devices"] if d["name"] == "Vulkan0")
    assert vk_budget["unified"] and vk_budget["unified_source"] == "declared"
    r = CliRunner().invoke(app, ["plan", *args], env={"FITEVICT_CONFIG": "", "FITEVICT_UMA": "Vulkan0=true",
                                                      "COLUMNS": "200"})
    assert "Vulkan0 (unified: counted in CPU too)" in r.output and "carved out of RAM" in r.output, r.output
