"""Prices on real device backends against the engine's traced buffers: RPC devices served by real rpc-servers on
loopback, and a Vulkan device (Mesa's lavapipe, a CPU-type device named with GGML_VK_VISIBLE_DEVICES).

Each placement is priced as ``fitevict price`` prices it (the backend rules its probe learned from the engine,
compute from the engine's own dry run of that placement) and then loaded under the allocator trace: model, context
and output must equal the traced bytes on every device, compute within 1 %."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from fitevict.engines.base import Unavailable
from fitevict.engines.llama_cpp.devcheck import check, rpc_servers
from fitevict.engines.llama_cpp.devprobe import learned_rules
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.zoo.recipes import MAMBA2_BY_STATE

VULKAN_ENV = {"GGML_VK_VISIBLE_DEVICES": "0"}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from fitevict.zoo import write_zoo
    from fitevict.zoo.write import write_gguf

    dest = tmp_path_factory.mktemp("device-zoo")
    out = {m.name: m.path for m in write_zoo(dest, only=("llama-gqa", "llama-moe", "granitehybrid-moe", "mamba"))}
    for r in MAMBA2_BY_STATE:  # two pure mamba2 models outside the zoo
        write_gguf(r, dest / f"{r.name}.gguf")
        out[r.name] = dest / f"{r.name}.gguf"
    return out


def _assert_exact(res: object) -> None:
    assert not isinstance(res, Unavailable), res
    assert res.ok, res.failures()  # type: ignore[union-attr]


def test_rpc_device_prices_to_the_engines_buffers(engine_bin_dir: Path, zoo: dict[str, Path]) -> None:
    """All layers, then 2 layers, on one rpc-server's device: its buffers are named RPC0[HOST:PORT] and live in
    the other process; the host keeps token_embd (no RPC host buffer type: the CPU's own list)."""
    with rpc_servers(engine_bin_dir, 1) as (ep,):
        for ngl in (99, 2):
            cfg = LoadConfig(n_ctx=1024, n_parallel=1, devices=("RPC0",), rpc=(ep,), n_gpu_layers=ngl)
            res = check(engine_bin_dir, zoo["llama-gqa"], cfg)
            _assert_exact(res)
            assert any(t.device == "RPC0" and t.term == "model" and t.traced for t in res.terms)  # type: ignore[union-attr]
        rules = learned_rules(engine_bin_dir / "llama-server", ("RPC0",), (ep,))["RPC0"]
        assert rules.source == "probe" and rules.host_buffer is None  # learned from the engine: RPC has none


@pytest.mark.parametrize("model,extra", [
    pytest.param("llama-gqa", {}, id="llama"),
    pytest.param("llama-gqa", {"flash_attn": "off"}, id="llama-fa-off"),
    pytest.param("granitehybrid-moe", {}, id="hybrid"),
])
def test_a_pipeline_over_two_rpc_servers_prices_to_the_engines_buffers(
        engine_bin_dir: Path, zoo: dict[str, Path], model: str, extra: dict) -> None:
    """-ts 1,3 over two rpc-servers (RPC0 and RPC1, both allocating buffers named RPC0[...]), every layer offloaded:
    llama.cpp runs the pipeline (4 copies of each split input). The dry run's figure for RPC1 holds 4 copies of the
    norm of the layer where RPC1 takes over, which the load keeps on RPC1 (pricing/pipeline); priced without them,
    every term on every device meets its target."""
    from fitevict.engines.llama_cpp.dryrun import dry_run
    from fitevict.pricing.gguf import load_structure
    from fitevict.pricing.pipeline import GGML_SCHED_MAX_COPIES

    with rpc_servers(engine_bin_dir, 2) as eps:
        cfg = LoadConfig(n_ctx=1024, n_parallel=1, devices=("RPC0", "RPC1"), rpc=eps, n_gpu_layers=99,
                         tensor_split=(1.0, 3.0), **extra)
        res = check(engine_bin_dir, zoo[model], cfg)
        dry = dry_run(engine_bin_dir, zoo[model], cfg)  # the same dry run, from its cache
    _assert_exact(res)
    assert not isinstance(dry, Unavailable), dry
    priced = next(t.priced for t in res.terms if t.device == "RPC1" and t.term == "compute")  # type: ignore[union-attr]
    norm = load_structure(zoo[model]).n_embd * 512 * 4
    assert dry.compute["RPC1"] - priced == GGML_SCHED_MAX_COPIES * norm  # what the rule took off the engine's figure


NO_PIPELINE_MISS = ("known miss: without pipeline parallelism (-nkvo) the dry run still gives RPC1's first norm to "
                    "RPC0, and the allocator's layout decides the difference (-0.50 MiB here, within one norm; "
                    "priced as the dry run says, with a note)")


def test_two_rpc_servers_without_the_pipeline(engine_bin_dir: Path, zoo: dict[str, Path]) -> None:
    """-ts 1,3 with -nkvo: no pipeline; the caches stay in host memory. Model, KV and output are exact."""
    with rpc_servers(engine_bin_dir, 2) as eps:
        cfg = LoadConfig(n_ctx=1024, n_parallel=1, devices=("RPC0", "RPC1"), rpc=eps, n_gpu_layers=99,
                         tensor_split=(1.0, 3.0), kv_offload=False, flash_attn="on")
        res = check(engine_bin_dir, zoo["llama-gqa"], cfg)
    assert not isinstance(res, Unavailable), res
    assert [f for f in res.failures() if " compute:" not in f] == []  # model, KV and output, always
    assert {"RPC0", "RPC1"} <= {t.device for t in res.terms if t.term == "model" and t.traced}
    compute = [f for f in res.failures() if " compute:" in f]
    if compute:  # reported as what it is, never passed: model, KV and output above must hold regardless
        pytest.xfail(f"{NO_PIPELINE_MISS}: {compute}")


def test_moe_experts_on_the_cpu_with_an_rpc_device(engine_bin_dir: Path, zoo: dict[str, Path]) -> None:
    with rpc_servers(engine_bin_dir, 1) as (ep,):
        cfg = LoadConfig(n_ctx=1024, n_parallel=1, devices=("RPC0",), rpc=(ep,), n_gpu_layers=99, n_cpu_moe=1)
        _assert_exact(check(engine_bin_dir, zoo["llama-moe"], cfg))


def test_fitevict_price_takes_rpc_flags(engine_bin_dir: Path, zoo: dict[str, Path],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI accepts --rpc, -dev, -ngl, -ts and -nkvo as llama-server does, and prices the RPC devices."""
    from typer.testing import CliRunner

    from fitevict.cli import app

    monkeypatch.setenv("FITEVICT_LLAMA_SERVER", str(engine_bin_dir / "llama-server"))
    with rpc_servers(engine_bin_dir, 2) as eps:
        r = CliRunner().invoke(app, ["price", str(zoo["llama-gqa"]), "-c", "1024", "-np", "1", "--rpc", ",".join(eps),
                                     "-dev", "RPC0,RPC1", "-ngl", "99", "-ts", "1,1", "-nkvo", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    devs = {d["name"]: d for d in doc["devices"]}
    assert {"RPC0", "RPC1"} <= set(devs)
    assert all(devs[d]["context_bytes"] == 0 and devs[d]["model_bytes"] > 0 for d in ("RPC0", "RPC1"))  # -nkvo
    assert devs["RPC0"]["sources"]["compute"] == "dry-run"
    assert [r["buffer"] for r in doc["device_rules"]] == [f"RPC0[{e}]" for e in eps]


def _vulkan_bin_dir() -> Path:
    from fitevict.engines.llama_cpp.install import engine_root

    d = engine_root() / "build-vulkan" / "bin"
    if not (d / "llama-server").is_file():
        pytest.skip(f"no Vulkan build of the engine at {d} (fitevict engine install llama.cpp --vulkan)")
    out = subprocess.run([str(d / "llama-server"), "--list-devices"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **VULKAN_ENV})
    if "Vulkan0" not in out.stdout + out.stderr:
        pytest.skip("the Vulkan build lists no Vulkan0: no Vulkan driver (Debian: mesa-vulkan-drivers for lavapipe)")
    return d


@pytest.mark.parametrize("model,cfg", [
    ("llama-gqa", LoadConfig(n_ctx=1024, n_parallel=1, devices=("Vulkan0",), n_gpu_layers=99)),
    ("llama-gqa", LoadConfig(n_ctx=1024, n_parallel=1, devices=("Vulkan0",), n_gpu_layers=2, mmap=False)),
    ("llama-moe", LoadConfig(n_ctx=1024, n_parallel=1, devices=("Vulkan0",), n_gpu_layers=99, n_cpu_moe=1)),
    ("granitehybrid-moe", LoadConfig(n_ctx=1024, n_parallel=1, devices=("Vulkan0",), n_gpu_layers=99)),
    ("mamba", LoadConfig(n_ctx=1024, n_parallel=1, devices=("Vulkan0",), n_gpu_layers=99)),
    ("mamba", LoadConfig(n_ctx=1024, n_parallel=1, devices=("Vulkan0",), n_gpu_layers=2, mmap=False)),
    ("mamba2-state16", LoadConfig(n_ctx=1024, n_parallel=1, devices=("Vulkan0",), n_gpu_layers=99)),
    ("mamba2-state128", LoadConfig(n_ctx=1024, n_parallel=1, devices=("Vulkan0",), n_gpu_layers=99)),
])
def test_vulkan_device_prices_to_the_engines_buffers(zoo: dict[str, Path], model: str, cfg: LoadConfig,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """On lavapipe: all layers, some layers without mmap (Vulkan_Host weights), MoE experts on the CPU, a mamba2
    hybrid, a mamba and two pure mamba2 models whose weights the device cannot all run (they stay on the host, as
    the probe learned for each model's own dimensions)."""
    d = _vulkan_bin_dir()
    for k, v in VULKAN_ENV.items():
        monkeypatch.setenv(k, v)
    _assert_exact(check(d, zoo[model], cfg))


def test_vulkan_turns_away_a_mamba2_scan_by_the_models_state_not_the_weights_shape(
        zoo: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Two pure mamba2 models whose ``ssm_a`` has the same type and shape ({1, 8}, f32): ggml-vulkan runs the
    SSM_SCAN the loader tests it in for a state of 128, not of 16. The probe learns each from the engine, per model
    dimensions (``pricing/backends.op_context``), and the prices follow: state 16 keeps ``ssm_a`` on the host."""
    from fitevict.pricing.backends import op_context, weight_kind
    from fitevict.pricing.gguf import load_structure

    d = _vulkan_bin_dir()
    for k, v in VULKAN_ENV.items():
        monkeypatch.setenv(k, v)
    cfg = LoadConfig(n_ctx=1024, n_parallel=1, devices=("Vulkan0",), n_gpu_layers=99)
    kinds = {}
    for name in ("mamba2-state16", "mamba2-state128"):
        _assert_exact(check(d, zoo[name], cfg))
        s = load_structure(zoo[name])
        a = next(t for t in s.tensors if t.name == "blk.0.ssm_a")
        kinds[name] = weight_kind(a.name, a.ggml_type.name, a.shape, op_context(s))
    assert kinds["mamba2-state16"][:3] == kinds["mamba2-state128"][:3]  # the same weight, to the op
    rules = learned_rules(d / "llama-server", ("Vulkan0",))["Vulkan0"]
    assert rules.source == "probe"
    assert kinds["mamba2-state16"] in rules.rejects and kinds["mamba2-state128"] in rules.accepts
