"""``fitevict price``: table, --json contract, command-line form, errors with exit code 2 (no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from fitevict.pricing.process import SLOT_BYTES
from fitevict.cli import app

runner = CliRunner()


def _json(args: list[str]) -> dict:
    r = runner.invoke(app, ["price", "--no-dry-run", "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_json_contract(small_zoo: dict[str, Path]) -> None:
    out = _json([str(small_zoo["gemma2-swa"]), "-c", "1000", "-np", "2", "-ub", "128", "-b", "512"])
    assert out["arch"] == "gemma2" and out["n_layer"] == 4 and out["file_bytes"] == small_zoo["gemma2-swa"].stat().st_size
    assert set(out["config"]) >= {"n_ctx", "n_ctx_seq", "parallel", "kv_unified", "n_gpu_layers", "n_cpu_moe",
                                  "cache_type_k", "cache_type_v", "flash_attn", "ubatch", "mmap"}
    assert (out["config"]["n_ctx"], out["config"]["n_ctx_seq"], out["config"]["parallel"]) == (1024, 512, 2)
    # gemma2-swa: 2 kv heads of 24, f16: K + V = 2 * 24 * 2 * 2 B = 192 B per cell and layer, 2 streams (-np 2);
    # base 512 cells, SWA PAD256(min(512, 64 + 128)) = 256 cells, 2 layers each
    assert out["kv"] == {"cells": 512, "cells_swa": 256, "layers_full": 2, "layers_swa": 2, "layers_recurrent": 0,
                         "cells_recurrent": 0, "bytes_full": 2 * 192 * 512 * 2, "bytes_swa": 2 * 192 * 256 * 2,
                         "bytes_recurrent": 0, "source": "formula"}
    (dev,) = out["devices"]
    assert dev["name"] == "CPU"
    assert dev["total_bytes"] == dev["model_bytes"] + dev["context_bytes"] + dev["compute_bytes"] + dev["output_bytes"]
    assert set(dev["sources"]) == {"model", "context", "compute", "output"}
    assert out["host"]["mapped_bytes"] + out["host"]["committed_bytes"] == dev["total_bytes"]
    # the engine process beyond the buffers, apart: its calibrated part (if this build was calibrated) and the rules
    proc = out["process"]
    assert [t["name"] for t in proc["terms"]] == ["tokenizer", "work buffer", "context", "slots",
                                                     "checkpoints"]
    assert proc["terms"][3]["bytes"] == SLOT_BYTES  # -np 2: one slot beyond the calibration's
    # the engine binary's own file pages: not in the price, named apart (the first seat of the binary carries them)
    assert proc["shared_pages"] is None or proc["shared_pages"]["bytes"] > 0
    assert all(t["rule"].startswith("rule: ") for t in proc["terms"])
    assert proc["bytes"] == (proc["calibrated_bytes"] or 0) + sum(t["bytes"] for t in proc["terms"])
    assert proc["calibrated_source"].startswith("measured" if proc["calibrated_bytes"] is not None else "unavailable")
    assert out["host_planned_bytes"] == dev["total_bytes"] + proc["bytes"]


def test_command_line_form_matches_flags(small_zoo: dict[str, Path]) -> None:
    m = str(small_zoo["llama-moe"])
    a = _json([m, "-c", "4096", "-np", "3", "-dev", "CUDA0", "-ngl", "-1", "--n-cpu-moe", "1"])
    b = _json(["--", "llama-server", "-m", m, "-c", "4096", "-np", "3", "-dev", "CUDA0", "-ngl", "-1",
               "--n-cpu-moe", "1", "--port", "8080"])
    assert a["devices"] == b["devices"] and a["config"] == b["config"]
    assert [d["name"] for d in a["devices"]] == ["CPU", "CUDA0"]


def test_human_table_names_sources(small_zoo: dict[str, Path]) -> None:
    r = runner.invoke(app, ["price", str(small_zoo["llama-q4_0"]), "-c", "1000", "--no-dry-run"])
    assert r.exit_code == 0, r.output
    assert "CPU_REPACK" in r.stdout and "(formula)" in r.stdout and "dry run disabled" in r.stdout


def test_ngl_clamp_is_a_note_not_an_error(small_zoo: dict[str, Path]) -> None:
    out = _json([str(small_zoo["llama-gqa"]), "-dev", "CUDA0", "-ngl", "50"])
    assert out["config"]["n_gpu_layers"] == 4
    assert any("clamped" in w for w in out["warnings"])


def test_errors_exit_2_and_name_the_file(small_zoo: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_text("not a model")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(small_zoo["llama-gqa"].read_bytes()[:300_000])
    cases = [
        ([str(bad)], "bad.gguf"),
        ([str(cut)], "truncated"),
        ([str(small_zoo["llama-q8_0"]), "-ctv", "q8_0", "-fa", "off"], "flash attention"),
        ([str(tmp_path / "missing.gguf")], "missing.gguf"),
    ]
    for args, needle in cases:
        r = runner.invoke(app, ["price", *args, "--no-dry-run"])
        assert r.exit_code == 2, (args, r.output)
        assert needle in r.output.replace("\n", " ")
        assert "Traceback" not in r.output


def test_overrides_and_embeddings_flags_match_the_command_line_form(small_zoo: dict[str, Path]) -> None:
    m = str(small_zoo["llama-moe"])
    a = _json([m, "-c", "1000", "-dev", "CUDA0", "-ngl", "-1", "-ot", r"blk\.0\.=CPU", "-ot", "exps=CPU",
               "--embeddings", "--pooling", "mean"])
    b = _json(["--", "llama-server", "-m", m, "-c", "1000", "-dev", "CUDA0", "-ngl", "-1",
               "--override-tensor", r"blk\.0\.=CPU,exps=CPU", "--embeddings", "--pooling", "mean"])
    assert a["devices"] == b["devices"] and a["config"] == b["config"] and a["buffers"] == b["buffers"]
    assert a["config"]["tensor_overrides"] == [r"blk\.0\.=CPU", "exps=CPU"] and a["config"]["embeddings"] is True
    # llama-moe: (n_vocab 1003 + n_embd 96) f32 per output; 4 slots at load, n_batch min(1000, 512) = 512 at peak
    assert a["output_at_load_bytes"] == 4 * 1099 * 4
    (cpu, _gpu) = a["devices"]
    assert cpu["output_bytes"] == 4 * 1099 * 512


def test_unknown_buffer_type_exits_2(small_zoo: dict[str, Path]) -> None:
    r = runner.invoke(app, ["price", "--no-dry-run", str(small_zoo["llama-moe"]), "-ot", "exps=CUDA0"])
    assert r.exit_code == 2
    assert "unknown buffer type 'CUDA0'; available buffer types: CPU" in r.output
