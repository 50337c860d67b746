"""Prices against the real engine: every zoo model under several configurations, term by term.

Each case starts the real llama-server with ``-dev none -lv 4`` and the allocator trace preloaded
(engines/llama_cpp/buftrace.c), reads its load log until every buffer is logged (the server is stopped right after its
compute buffer is reserved), and compares with ``price``: model, context and output buffers to the byte, cell
counts and context sizes exactly, the compute buffer (the engine's ``--fit`` dry run, printed in MiB with 2
decimals) within that print's rounding.
Configurations llama.cpp refuses must be refused by pricing too, naming the same reason.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fitevict.engines.llama_cpp.dryrun import DryRun, Unavailable, capture_load_log, dry_run, dry_run_compute
from fitevict.pricing.buftrace import parse_exact_log
from fitevict.pricing.gguf import PricingError, load_structure
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.logparse import PRECISION_BYTES, parse_load_log
from fitevict.pricing.price import price
from fitevict.units import MiB
from fitevict.zoo import ZOO_NAMES, rewrite_arch
from fitevict.engines.llama_cpp.machine import host_buffers

HERE = host_buffers()  # this machine's extra host buffers (its probe, else the rule table): as its engine places

pytestmark = pytest.mark.e2e

CONFIGS: dict[str, LoadConfig] = {
    "c1000-no-np": LoadConfig(n_ctx=1000),  # not a multiple of 256; no -np: 4 unified slots
    "np1": LoadConfig(n_ctx=2048, n_parallel=1),
    "np3": LoadConfig(n_ctx=4096, n_parallel=3),  # 1536 per slot
    "np3-uneven": LoadConfig(n_ctx=2000, n_parallel=3),  # 2048 / 3 = 682 -> 768 per slot, n_ctx 2304
    "q8_0-fa": LoadConfig(n_ctx=2048, n_parallel=1, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="on"),
    "ub128": LoadConfig(n_ctx=1000, n_parallel=2, n_ubatch=128, n_batch=512),
    "no-mmap": LoadConfig(n_ctx=1000, mmap=False),  # -lm none
    "c0": LoadConfig(n_ctx=0),
    "c0-np2": LoadConfig(n_ctx=0, n_parallel=2),
    "fa-off": LoadConfig(n_ctx=1000, n_parallel=1, flash_attn="off"),
    "swa-full": LoadConfig(n_ctx=1000, swa_full=True),
}
SWA_ONLY = {"swa-full"}
# A k-quant copy made by the engine's own llama-quantize (deterministic): Q4_K (repacked on AVX2), Q6_K, and the
# Q5_0 / Q8_0 fallbacks for rows of 320 that are not a multiple of 256.
QUANTIZED = {"qwen2-k256.Q4_K_M": ("qwen2-k256", "Q4_K_M")}
MODELS = [*ZOO_NAMES, *QUANTIZED]
CASES = [(m, c) for m in MODELS for c in CONFIGS if c not in SWA_ONLY or "swa" in m]


@pytest.fixture(scope="module")
def models(zoo: dict, engine_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Zoo paths plus the llama-quantize copies in QUANTIZED."""
    out = {name: m.path for name, m in zoo.items()}
    dest = tmp_path_factory.mktemp("quantized")
    for name, (source, qtype) in QUANTIZED.items():
        target = dest / f"{name}.gguf"
        r = subprocess.run([str(engine_bin_dir / "llama-quantize"), str(zoo[source].path), str(target), qtype, "1"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        out[name] = target
    return out


def _mib2(n: int | None) -> str:
    assert n is not None
    return f"{n / MiB:.2f}"


@pytest.mark.parametrize("model, config", CASES)
def test_price_matches_the_load_log(models: dict[str, Path], engine_bin_dir: Path, model: str, config: str) -> None:
    path = models[model]
    cfg = CONFIGS[config]
    s = load_structure(path)
    try:
        compute = dry_run_compute(engine_bin_dir, path, cfg, use_cache=False)
        p = price(s, cfg, compute=compute if isinstance(compute, dict) else None, host=HERE)
    except PricingError as refused:
        cap = capture_load_log(engine_bin_dir, path, cfg)
        assert not cap.ok, f"pricing refused ({refused}) but llama-server loaded {model} under {config}"
        assert "does not divide" in str(refused) and "does not divide" in cap.text
        return
    assert not isinstance(compute, Unavailable), compute.reason
    cap = capture_load_log(engine_bin_dir, path, cfg, exact=True)
    assert cap.ok, f"{model} {config}: {cap.reason}\n" + "\n".join(cap.text.splitlines()[-15:])
    log = parse_exact_log(cap.text)
    assert log.precision_bytes == 0, log.notes  # every figure below is the allocator's, to the byte

    # resolved configuration and cell counts
    assert (log.n_ctx, log.n_ctx_seq, log.n_seq_max) == (p.n_ctx, p.n_ctx_seq, p.n_parallel)
    assert log.kv_unified == p.kv_unified
    kv = p.kv
    assert kv is not None
    if kv.layers_full:
        assert log.kv_cells == kv.cells
        assert log.kv_streams == (1 if p.kv_unified else p.n_parallel)
    if kv.layers_swa:
        assert log.kv_cells_swa == kv.cells_swa
    if kv.layers_recurrent:
        assert log.rs_cells == max(1, p.n_parallel)

    # model buffers, one by one, as llama.cpp names them, to the byte
    assert dict(log.model_buffers) == {b.name: b.bytes for b in p.buffers}

    # context: one KV buffer per cache (base, then SWA), one RS buffer, to the byte
    assert [n for _, n in log.kv_lines] == [kv.bytes_of(k) for k in ("full", "swa") if kv.bytes_of(k)]
    assert [n for _, n in log.rs_buffers] == ([kv.bytes_of("recurrent")] if kv.layers_recurrent else [])

    cpu = p.footprint.device("CPU")
    measured = log.to_footprint().device("CPU")
    assert cpu is not None and measured is not None
    assert measured.output.bytes == cpu.output.bytes == p.output_at_load
    assert cpu.compute.source == "dry-run"
    assert measured.compute.bytes is not None and cpu.compute.bytes is not None
    assert abs(cpu.compute.bytes - measured.compute.bytes) <= PRECISION_BYTES  # the dry run's 2-decimal print


def test_cli_uses_the_dry_run_when_the_engine_is_found(zoo: dict, llama_server: Path) -> None:
    r = CliRunner().invoke(__import__("fitevict.cli", fromlist=["app"]).app,
                           ["price", "--json", str(zoo["llama-q4_0"].path), "-c", "1000"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    (cpu,) = out["devices"]
    assert cpu["sources"]["compute"] == "dry-run" and cpu["compute_bytes"] > 0


@pytest.mark.parametrize("model", ["gemma3-swa", "deepseek2-mla", "qwen2moe-shexp", "jamba-hybrid", "lfm2-shortconv",
                                   "granitehybrid-moe", "qwen2-k256.Q4_K_M"])
def test_cli_json_matches_the_load_log(models: dict[str, Path], engine_bin_dir: Path, llama_server: Path,
                                       model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``fitevict price --json`` prints is what llama-server logs: buffers, KV lines and cells, compute."""
    monkeypatch.setenv("FITEVICT_CACHE_DIR", str(tmp_path))  # a fresh dry run, not a cached one
    monkeypatch.setenv("FITEVICT_LLAMA_SERVER", str(llama_server))  # the engine, now outside that cache dir
    path = models[model]
    r = CliRunner().invoke(__import__("fitevict.cli", fromlist=["app"]).app,
                           ["price", "--json", str(path), "-c", "2000", "-np", "3"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    log = parse_load_log(capture_load_log(engine_bin_dir, path, LoadConfig(n_ctx=2000, n_parallel=3)).text)
    assert (out["config"]["n_ctx"], out["config"]["n_ctx_seq"]) == (log.n_ctx, log.n_ctx_seq) == (2304, 768)
    assert {b["name"]: _mib2(b["bytes"]) for b in out["buffers"]} == {n: _mib2(b) for n, b in log.model_buffers}
    kv = out["kv"]
    assert [_mib2(kv[k]) for k in ("bytes_full", "bytes_swa") if kv[k]] == [_mib2(n) for _, n in log.kv_lines]
    if kv["layers_full"]:
        assert kv["cells"] == log.kv_cells
    if kv["layers_swa"]:
        assert kv["cells_swa"] == log.kv_cells_swa
    if kv["layers_recurrent"]:
        assert kv["cells_recurrent"] == log.rs_cells == 3
        assert [_mib2(n) for _, n in log.rs_buffers] == [_mib2(kv["bytes_recurrent"])]
    (cpu,) = out["devices"]
    measured = log.to_footprint().device("CPU")
    assert measured is not None and measured.compute.bytes is not None
    assert cpu["sources"]["compute"] == "dry-run"
    assert abs(cpu["compute_bytes"] - measured.compute.bytes) <= max(0.01 * measured.compute.bytes, MiB // 200)
    assert _mib2(cpu["output_bytes"]) == _mib2(measured.output.bytes)


def test_dry_run_is_cached_by_file_and_configuration(zoo: dict, engine_bin_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FITEVICT_CACHE_DIR", str(tmp_path))
    path = zoo["llama-gqa"].path
    first = dry_run_compute(engine_bin_dir, path, LoadConfig(n_ctx=1000))
    assert isinstance(first, dict) and first["CPU"] > 0
    cached = list((tmp_path / "dryrun").glob("*.json"))
    assert len(cached) == 1
    assert dry_run_compute(engine_bin_dir, path, LoadConfig(n_ctx=1000)) == first
    other = dry_run_compute(engine_bin_dir, path, LoadConfig(n_ctx=4096))
    assert isinstance(other, dict) and other != first
    assert len(list((tmp_path / "dryrun").glob("*.json"))) == 2


@pytest.mark.parametrize("model", [m for m in ZOO_NAMES if m != "llama-medium"])
def test_formula_fallback_envelope(zoo: dict, engine_bin_dir: Path, model: str) -> None:
    """Without a dry run the compute term is a labelled formula that over-states (by less than 2x here)."""
    path = zoo[model].path
    s = load_structure(path)
    for name in ("c1000-no-np", "np3", "ub128", "fa-off"):
        cfg = CONFIGS[name]
        dry = dry_run_compute(engine_bin_dir, path, cfg)
        assert isinstance(dry, dict)
        cpu = price(s, cfg, host=HERE).footprint.device("CPU")
        assert cpu is not None and cpu.compute.source == "formula" and cpu.compute.bytes is not None
        assert dry["CPU"] <= cpu.compute.bytes <= 2 * dry["CPU"], (name, cpu.compute.bytes, dry)


# --- embeddings seats: the output buffer also holds n_embd floats per output --------------------------------

EMBEDDINGS = LoadConfig(n_ctx=4096, n_parallel=16, embeddings=True)  # 16 slots: the output line tells them apart
POOLING = ("--pooling", "mean")


@pytest.mark.parametrize("model", ["qwen2-k256", "gemma3-swa", "jamba-hybrid"])
def test_embeddings_seat_matches_the_load_log(models: dict[str, Path], engine_bin_dir: Path, model: str) -> None:
    path = models[model]
    s = load_structure(path)
    dry = dry_run_compute(engine_bin_dir, path, EMBEDDINGS, use_cache=False, extra_args=POOLING)
    assert isinstance(dry, dict), dry
    p = price(s, EMBEDDINGS, compute=dry, host=HERE)
    cap = capture_load_log(engine_bin_dir, path, EMBEDDINGS, extra_args=POOLING)
    assert cap.ok, cap.reason
    log = parse_load_log(cap.text)
    # llama-server lowers -b 2048 to -ub 512 for embeddings
    assert log.n_batch == p.n_batch == 512
    # at load: f32 (n_vocab + n_embd) for one output per slot; plain seats hold n_vocab only
    assert p.output_at_load == 4 * (s.n_vocab + s.n_embd) * 16
    assert [_mib2(n) for _, n in log.output_buffers] == [_mib2(p.output_at_load)]
    assert _mib2(p.output_at_load) != _mib2(4 * s.n_vocab * 16)  # the check can tell the two apart
    # the footprint holds the peak: an embeddings batch outputs every token, up to n_batch = 512 of them
    cpu = p.footprint.device("CPU")
    assert cpu is not None and cpu.output.bytes == 4 * (s.n_vocab + s.n_embd) * 512
    assert {name: _mib2(n) for name, n in log.model_buffers} == {b.name: _mib2(b.bytes) for b in p.buffers}
    kv = p.kv
    assert kv is not None
    assert [_mib2(n) for _, n in log.kv_lines] == [_mib2(kv.bytes_of(k)) for k in ("full", "swa") if kv.bytes_of(k)]
    measured = log.to_footprint().device("CPU")
    assert measured is not None and measured.compute.bytes is not None and cpu.compute.bytes is not None
    assert abs(cpu.compute.bytes - measured.compute.bytes) <= max(0.01 * measured.compute.bytes, MiB // 200)


# --- tensor overrides on a CPU-only machine ------------------------------------------------------------------

@pytest.mark.parametrize("model, overrides", [
    ("llama-moe", (("_exps", "CPU"),)),
    ("llama-q4_0", ((r"blk\.[0-2]\.ffn", "CPU"), ("token_embd", "CPU"))),  # Q4_0: still repacked
    ("llama-tied", (("token_embd", "CPU"),)),
])
def test_overrides_to_cpu_match_the_load_log(models: dict[str, Path], engine_bin_dir: Path, model: str,
                                             overrides: tuple) -> None:
    """On -dev none every weight already comes from the CPU list: the engine's buffers are those of the plain
    load, and pricing (and the dry run, which gets the same -ot flags) says the same."""
    path = models[model]
    cfg = LoadConfig(n_ctx=1000, tensor_overrides=overrides)
    dry = dry_run_compute(engine_bin_dir, path, cfg, use_cache=False)
    assert isinstance(dry, dict), dry
    p = price(load_structure(path), cfg, compute=dry, host=HERE)
    cap = capture_load_log(engine_bin_dir, path, cfg)
    assert cap.ok, cap.reason
    log = parse_load_log(cap.text)
    plain = parse_load_log(capture_load_log(engine_bin_dir, path, cfg.with_(tensor_overrides=())).text)
    assert log.model_buffers == plain.model_buffers
    assert {name: _mib2(n) for name, n in log.model_buffers} == {b.name: _mib2(b.bytes) for b in p.buffers}
    measured = log.to_footprint().device("CPU")
    cpu = p.footprint.device("CPU")
    assert measured is not None and cpu is not None and measured.compute.bytes is not None
    assert abs(cpu.compute.value - measured.compute.bytes) <= max(0.01 * measured.compute.bytes, MiB // 200)


def test_override_to_a_missing_buffer_type_is_refused_by_both(zoo: dict, engine_bin_dir: Path) -> None:
    path = zoo["llama-moe"].path
    cfg = LoadConfig(n_ctx=1000, tensor_overrides=(("_exps", "NOSUCHDEV0"),))
    with pytest.raises(PricingError, match="unknown buffer type 'NOSUCHDEV0'; available buffer types: CPU"):
        price(load_structure(path), cfg, host=HERE)
    cap = capture_load_log(engine_bin_dir, path, cfg)
    assert not cap.ok and "unknown buffer type" in cap.text


# --- an architecture llama.cpp knows and fitevict does not: the dry run's caches price its context --------------

@pytest.fixture(scope="module")
def xverse(zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """llama-gqa as an xverse model: xverse is in llama.cpp (a llama-shaped attention model), not in fitevict."""
    return rewrite_arch(zoo["llama-gqa"].path, tmp_path_factory.mktemp("xverse") / "xverse.gguf", "xverse")


@pytest.mark.parametrize("config", ["c1000-no-np", "np3", "np3-uneven", "ub128"])
def test_unknown_arch_context_comes_from_the_dry_run(xverse: Path, zoo: dict, engine_bin_dir: Path,
                                                     config: str) -> None:
    cfg = CONFIGS[config]
    s = load_structure(xverse)
    assert s.unsupported  # fitevict has no KV rules for xverse
    assert not price(s, cfg, host=HERE).footprint.device("CPU").complete  # type: ignore[union-attr]
    dry = dry_run(engine_bin_dir, xverse, cfg, use_cache=False)
    assert isinstance(dry, DryRun) and dry.context is not None
    p = price(s, cfg, compute=dry.compute, context=dry.context, host=HERE)
    cpu = p.footprint.device("CPU")
    assert cpu is not None and cpu.complete and cpu.context.source == "dry-run" and p.context_source == "dry-run"
    log = parse_load_log(capture_load_log(engine_bin_dir, xverse, cfg).text)
    kv = p.kv
    assert kv is not None and (kv.cells, kv.layers_full) == (log.kv_cells, log.kv_layers)
    assert [_mib2(n) for _, n in log.kv_lines] == [_mib2(kv.bytes_of("full"))] == [_mib2(cpu.context.bytes)]
    assert {name: _mib2(n) for name, n in log.model_buffers} == {b.name: _mib2(b.bytes) for b in p.buffers}
    assert _mib2(cpu.output.bytes) == _mib2(log.to_footprint().device("CPU").output.bytes)  # type: ignore[union-attr]
    # the same geometry priced by the rules (llama-gqa) agrees to the log's printed precision
    rules = price(load_structure(zoo["llama-gqa"].path), cfg, host=HERE).footprint.device("CPU")
    assert rules is not None and _mib2(rules.context.bytes) == _mib2(cpu.context.bytes)


def test_cli_prices_an_unknown_arch_fully(xverse: Path, llama_server: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FITEVICT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FITEVICT_LLAMA_SERVER", str(llama_server))
    r = CliRunner().invoke(__import__("fitevict.cli", fromlist=["app"]).app,
                           ["price", "--json", str(xverse), "-c", "4096", "-np", "3"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    (cpu,) = out["devices"]
    assert cpu["sources"] == {"model": "formula", "context": "dry-run", "compute": "dry-run", "output": "formula"}
    assert "unavailable" not in cpu and out["kv"]["source"] == "dry-run" and out["kv"]["cells"] == 1536
