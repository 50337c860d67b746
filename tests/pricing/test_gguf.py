"""GGUF structure reading: hyper-parameters, per-layer arrays, SWA pattern, experts, errors that name the file."""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from fitevict.pricing.ggml_types import nbytes, row_size
from fitevict.pricing.gguf import GgufStructure, PricingError, load_structure, parse_structure
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.price import price
from fitevict.pricing.hostbufs import rule_table

X86_AVX512 = rule_table({"avx2", "avx512f"})  # a fixed CPU (AVX-512, no AMX): these figures hold on any machine


def test_llama_gqa_hyperparameters(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-gqa"]
    assert (s.arch, s.n_layer, s.n_embd, s.n_vocab) == ("llama", 3, 96, 1003)
    assert s.n_head == (6, 6, 6) and s.n_head_kv == (2, 2, 2)
    assert s.key_length == 96 // 6  # no key_length key: n_embd / n_head
    assert not s.tied_output and s.n_swa == 0


def test_tensor_sizes_follow_the_type_table(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-q4_0"]
    q = s.tensor("blk.0.attn_q.weight")
    assert q is not None and q.ggml_type == gguf.GGMLQuantizationType.Q4_0
    # Q4_0: 18 bytes per 32 elements; 160 x 160 -> 160/32*18 per row * 160 rows
    assert q.nbytes == 160 // 32 * 18 * 160 == 14400
    assert all(t.nbytes == nbytes(t.ggml_type, t.shape) for t in s.tensors)
    # offsets are sorted, inside the file, and tensors do not overlap
    for a, b in zip(s.tensors, s.tensors[1:]):
        assert a.end <= b.offset
    assert s.tensors[-1].end <= s.file_bytes


def test_per_layer_head_count_kv_array(structures: dict[str, GgufStructure]) -> None:
    assert structures["deci-kvarray"].n_head_kv == (2, 1, 3, 2)


def test_gemma2_swa_pattern_every_other_layer(structures: dict[str, GgufStructure]) -> None:
    s = structures["gemma2-swa"]
    # llama.cpp gemma2: load_swa_pattern(2): layer il is SWA iff il % 2 < 1
    assert s.swa_layers == (True, False, True, False)
    assert s.n_swa == 64 and s.tied_output


def test_moe_experts_and_tied_and_recurrent(structures: dict[str, GgufStructure]) -> None:
    moe = structures["llama-moe"]
    assert moe.expert_count == 4 and moe.expert_used_count == 2
    experts = [t.name for t in moe.tensors if t.expert]
    assert sorted(experts) == sorted(f"blk.{i}.ffn_{k}_exps.weight" for i in range(2) for k in ("gate", "up", "down"))
    assert structures["llama-tied"].tied_output
    m = structures["mamba"]
    assert m.is_recurrent and (m.ssm_d_conv, m.ssm_d_inner, m.ssm_d_state) == (4, 192, 16)
    # mamba conv state: (d_conv - 1) * (d_inner + 2 * n_group * d_state), n_group 0 for mamba1
    assert m.n_embd_r == 3 * 192 and m.n_embd_s == 16 * 192


def test_not_a_gguf_names_the_file(tmp_path: Path) -> None:
    p = tmp_path / "notes.gguf"
    p.write_bytes(b"hello world, not a model")
    with pytest.raises(PricingError, match=r"notes\.gguf.*not a GGUF"):
        load_structure(p)


def test_truncated_file_names_the_file(small_zoo: dict[str, Path], tmp_path: Path) -> None:
    src = small_zoo["llama-gqa"]
    p = tmp_path / "cut.gguf"
    p.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    with pytest.raises(PricingError, match=r"cut\.gguf.*truncated"):
        load_structure(p)


def test_header_cut_short_is_an_error_not_a_traceback(small_zoo: dict[str, Path], tmp_path: Path) -> None:
    p = tmp_path / "head.gguf"
    p.write_bytes(small_zoo["llama-gqa"].read_bytes()[:200])
    with pytest.raises(PricingError, match=r"head\.gguf"):
        load_structure(p)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PricingError, match="nope.gguf"):
        load_structure(tmp_path / "nope.gguf")


def _write_unknown_arch(path: Path) -> None:
    w = gguf.GGUFWriter(path, "frobnicator")
    w.add_block_count(1)
    w.add_embedding_length(32)
    w.add_head_count(2)
    w.add_context_length(512)
    w.add_tensor("token_embd.weight", np.zeros((10, 32), dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((32, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_unknown_arch_prices_the_weights_and_marks_the_rest_unavailable(tmp_path: Path) -> None:
    p = tmp_path / "odd.gguf"
    _write_unknown_arch(p)
    s = load_structure(p)
    assert s.unsupported and "frobnicator" in s.unsupported
    pr = price(s, LoadConfig(n_ctx=512), host=X86_AVX512)
    cpu = pr.footprint.device("CPU")
    assert cpu is not None
    # weights: token_embd 10 x 32 f32 (1280 B, a multiple of the 32-byte file alignment, so no gap)
    # followed by q 32 x 32 f32 (4096 B): one contiguous mapped span
    assert cpu.model.bytes == row_size("f32", 32) * 10 + row_size("f32", 32) * 32 == 1280 + 4096
    assert cpu.context.source == "unavailable" and "frobnicator" in cpu.context.reason
    assert cpu.compute.source == "unavailable"


def test_cache_sees_a_changed_file(small_zoo: dict[str, Path], tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"
    shutil.copy(small_zoo["llama-gqa"], p)
    assert load_structure(p).n_layer == 3
    shutil.copy(small_zoo["llama-moe"], p)
    assert load_structure(p).n_layer == 2
    assert parse_structure(p).expert_count == 4
