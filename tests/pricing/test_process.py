"""The engine process's parts that scale with the model (pricing.process): each rule against the source it cites."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QT

from fitevict.pricing.gguf import load_structure
from fitevict.pricing.hostbufs import rule_table
from fitevict.pricing.kv import resolve_context
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.placement import place
from fitevict.pricing.process import CACHE_LINE, TILED_SLOT_BYTES, process_terms, row_size, vec_dot_type, work_buffer
from fitevict.zoo import write_zoo

NO_EXTRAS = rule_table([], "x86_64")  # no extra host buffer type: every weight in CPU_Mapped
CFG = LoadConfig(n_ctx=4096, n_parallel=1)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    names = ["llama-gqa", "llama-tied", "llama-q8_0", "qwen3moe", "llama-medium"]
    return {m.name: m.path for m in write_zoo(tmp_path_factory.mktemp("zoo"), only=names)}


def _work(s, cfg: LoadConfig = CFG, *, threads: int = 2, tiled: bool = False, host=NO_EXTRAS) -> int:
    rc = resolve_context(s, cfg)
    return work_buffer(s, rc, place(s, cfg, host), n_threads=threads, tiled=tiled, cells=rc.n_ctx_seq)


def test_vec_dot_types_and_row_sizes_are_ggml_cpus() -> None:
    assert [vec_dot_type(t) for t in (QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q8_0, QT.Q4_K, QT.IQ4_NL)] == [
        "F32", "F16", "BF16", "Q8_0", "Q8_1", "Q8_0", "Q8_K", "Q8_0"]
    assert (row_size("F16", 512), row_size("Q8_0", 512), row_size("Q8_1", 512), row_size("Q8_K", 512)) == (
        1024, 16 * 34, 16 * 36, 2 * 292)


def test_an_f16_model_converts_its_widest_input_for_a_whole_ubatch(zoo: dict[str, Path]) -> None:
    s = load_structure(zoo["llama-gqa"])  # n_embd 384, n_ff 256: the widest product input is n_embd
    assert _work(s) == 384 * 512 * 2 + CACHE_LINE * 2  # what the calibration seat's ggml allocates
    medium = load_structure(zoo["llama-medium"])  # ffn_down's input is n_ff 2624 wide
    assert _work(medium, threads=4) == 2624 * 512 * 2 + CACHE_LINE * 4
    short = LoadConfig(n_ctx=256, n_parallel=1)  # a context shorter than a ubatch runs one shorter ubatch
    assert _work(s, short) == 384 * 256 * 2 + CACHE_LINE * 2


def test_f32_weights_convert_nothing_and_leave_the_attention_scratch(zoo: dict[str, Path]) -> None:
    s = load_structure(zoo["llama-tied"])  # f32: the product reads the activations as they are
    dk = dv = s.key_length
    tile = 4 * (64 * dk + 2 * 64 * 64 + 2 * 64 * dv + 64 * dk)  # flash attention's prefill scratch per thread
    assert _work(s, threads=3) == tile * 3 + CACHE_LINE * 3
    no_fa = LoadConfig(n_ctx=4096, n_parallel=1, flash_attn="off")  # the f32 scores converted for the V product
    assert _work(s, no_fa, threads=3) == 2 * 4096 * 512 * max(s.n_head) + CACHE_LINE * 3


def test_quantized_weights_convert_to_their_vec_dot_type(zoo: dict[str, Path]) -> None:
    s = load_structure(zoo["llama-q8_0"])  # n_embd 320, n_ff 448: ffn_down's input is the widest
    assert _work(s) == row_size("Q8_0", 448 * 512) + CACHE_LINE * 2
    k = replace(s, tensors=tuple(replace(t, ggml_type=QT.Q4_K) if t.ggml_type == QT.Q8_0 else t for t in s.tensors))
    plain = row_size("Q8_K", 448 * 512)
    assert _work(k, tiled=False) == plain + CACHE_LINE * 2
    # the tiled K-quant path: 64 B of alignment and one 512 KiB slot per thread, beside the conversion
    assert _work(k, tiled=True, threads=4) == plain + 64 + 4 * TILED_SLOT_BYTES + CACHE_LINE * 4


def test_a_moe_product_converts_each_used_expert_and_keeps_its_row_map(zoo: dict[str, Path]) -> None:
    s = load_structure(zoo["qwen3moe"])
    down = next(t for t in s.tensors if t.name.endswith("ffn_down_exps.weight"))
    used, n_exp = s.expert_used_count, down.shape[2]
    conv = row_size(vec_dot_type(down.ggml_type), down.shape[0] * 512 * used)
    rows = 8 + n_exp * 8 + 8 + n_exp * used * 512 * 8 + 8 + 64 * n_exp + 64
    assert _work(s) >= -(-(conv + rows) // 64) * 64 + CACHE_LINE * 2


def test_layers_on_a_gpu_are_not_multiplied_on_the_cpu(zoo: dict[str, Path]) -> None:
    s = load_structure(zoo["llama-medium"])
    gpu = LoadConfig(n_ctx=4096, n_parallel=1, devices=("CUDA0",), n_gpu_layers=999)
    assert _work(s) > 0 and _work(s, gpu) == 0  # every layer and the output there: nothing multiplied here


def _terms(s, cfg: LoadConfig) -> dict:
    rc = resolve_context(s, cfg)
    return {t.name: t for t in process_terms(s, rc, place(s, cfg, NO_EXTRAS), n_threads=2, tiled=True,
                                             cells=rc.n_ctx_seq)}


def _rule_factors(rule: str) -> list[tuple[int, int]]:
    """The "<bytes> B x <count> <what>" products a term's rule names."""
    return [(int(b), int(n)) for b, n in re.findall(r"(\d+) B x (\d+) ", rule)]


def test_the_terms_carry_their_rules(zoo: dict[str, Path]) -> None:
    s = load_structure(zoo["llama-gqa"])
    terms = _terms(s, LoadConfig(n_ctx=4096, n_parallel=2))
    assert all(t.rule.startswith("rule: ") for t in terms.values())
    # each term's bytes are what its rule says they are, on this model's own counts
    tok, ctx = _rule_factors(terms["tokenizer"].rule), _rule_factors(terms["context"].rule)
    assert [n for _, n in tok] == [s.n_vocab] and sum(b * n for b, n in tok) == terms["tokenizer"].bytes > 0
    assert [n for _, n in ctx] == [4096] and sum(b * n for b, n in ctx) == terms["context"].bytes > 0
    assert terms["work buffer"].bytes == _work(s, LoadConfig(n_ctx=4096, n_parallel=2))
    # the tokenizer grows with the vocabulary alone: twice the entries hold twice the bytes, the rest is unmoved
    twice = _terms(replace(s, n_vocab=2 * s.n_vocab), LoadConfig(n_ctx=4096, n_parallel=2))
    assert twice["tokenizer"].bytes == 2 * terms["tokenizer"].bytes and twice["context"] == terms["context"]
    # the context's heap counts every slot's tokens: two full slots of 2,048 hold what one of 4,096 does, twice one
    # of 2,048
    one = _terms(s, LoadConfig(n_ctx=2048, n_parallel=1))["context"].bytes
    assert _terms(s, LoadConfig(n_ctx=4096, n_parallel=1))["context"].bytes == terms["context"].bytes == 2 * one
    # a BPE vocabulary's merges add to the tokenizer, named in its rule beside the entries
    bpe = _terms(replace(s, n_merges=1000), LoadConfig(n_ctx=4096, n_parallel=2))["tokenizer"]
    merges = _rule_factors(bpe.rule)
    assert [n for _, n in merges] == [s.n_vocab, 1000] and sum(b * n for b, n in merges) == bpe.bytes
    assert bpe.bytes > terms["tokenizer"].bytes
