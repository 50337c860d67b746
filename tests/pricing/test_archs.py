"""Per-architecture rules: SWA patterns, explicit head sizes, MLA caches, MTP blocks, layer-placed input tensors.

Known answers carry their arithmetic; the e2e proof (tests/e2e/test_pricing_vs_log.py) checks the same models
against llama-server's own log.
"""

from __future__ import annotations

import pytest

from fitevict.pricing.ggml_types import row_size
from fitevict.pricing.gguf import SWA_RULES, GgufStructure, load_structure, swa_layout
from fitevict.pricing.kv import kv_layers, resolve_context
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.hostbufs import rule_table
from fitevict.pricing.placement import place
from fitevict.pricing.price import price

X86_AVX512 = rule_table({"avx2", "avx512f"})  # the rules of an x86 CPU with AVX-512 and no AMX

ARCHS = ("qwen3-headdim", "gemma3-swa", "deepseek2-mla", "bloom-alibi", "qwen2moe-shexp", "phi-fusedqkv")


@pytest.fixture(scope="module")
def arch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, GgufStructure]:
    from fitevict.zoo import write_zoo

    dest = tmp_path_factory.mktemp("arch-zoo")
    return {m.name: load_structure(m.path) for m in write_zoo(dest, only=ARCHS, version=1)}  # figures from v1


# ---------------------------------------------------------------------------------------------- SWA rules


def test_gemma3_swa_is_five_of_every_six_layers_and_needs_a_positive_window() -> None:
    # load_swa_pattern(ml, 6): il % 6 < 5 -> layers 0-4 and 6 slide, layer 5 is global
    assert swa_layout("gemma3", 7, 48, None) == (48, (True, True, True, True, True, False, True))
    assert swa_layout("gemma3", 7, None, None) == (0, (False,) * 7)  # no key: swa_type NONE
    assert swa_layout("gemma3", 7, 0, None) == (0, (False,) * 7)


def test_gemma2_defaults_its_window_and_alternates() -> None:
    assert swa_layout("gemma2", 4, None, None) == (4096, (True, False, True, False))


def test_llama4_is_chunked_8192_unless_the_key_says_zero() -> None:
    # llama4.cpp: found_swa && n_swa == 0 -> NONE, else n_swa = 8192 whatever the key says, pattern 4
    assert swa_layout("llama4", 4, None, None) == (8192, (True, True, True, False))
    assert swa_layout("llama4", 4, 1024, None) == (8192, (True, True, True, False))
    assert swa_layout("llama4", 4, 0, None) == (0, (False,) * 4)


def test_dense_first_forced_window_and_depth_conditions() -> None:
    # smallthinker: load_swa_pattern(ml, 4, true) -> il % 4 != 0 slides; n_swa forced to 4096
    assert swa_layout("smallthinker", 5, 100, None) == (4096, (False, True, True, True, False))
    # exaone4 turns SWA on only for its 64-layer model
    assert swa_layout("exaone4", 30, 4096, None)[0] == 0
    n_swa, layers = swa_layout("exaone4", 64, None, None)
    assert n_swa == 4096 and layers[:4] == (True, True, True, False)


def test_an_explicit_pattern_key_wins() -> None:
    assert swa_layout("gemma3", 4, 32, 2) == (32, (True, False, True, False))
    assert swa_layout("gemma3", 4, 32, [0, 1, 1, 0]) == (32, (False, True, True, False))


def test_phi3_swa_is_disabled_and_unknown_archs_have_none() -> None:
    assert "phi3" not in SWA_RULES
    assert swa_layout("phi3", 3, 2047, None) == (0, (False,) * 3)
    assert swa_layout("frobnicator", 3, 64, None) == (0, (False,) * 3)


def test_gemma3_swa_cells(arch: dict[str, GgufStructure]) -> None:
    s = arch["gemma3-swa"]
    cfg = LoadConfig(n_ctx=1000)  # no -np: 4 unified slots
    kv = kv_layers(s, resolve_context(s, cfg), cfg)
    # base cache: PAD256(1000) = 1024 cells; SWA: PAD256(min(1024, 48 * 4 slots + 512 ubatch)) = PAD256(704) = 768
    assert (kv.cells, kv.cells_swa, kv.layers_full, kv.layers_swa) == (1024, 768, 1, 6)
    # head_dim 32 (key_length), 2 kv heads, f16: K row 32 * 2 * 2 B = 128 B, V the same
    assert kv.bytes_of("full") == 2 * 128 * 1024
    assert kv.bytes_of("swa") == 6 * 2 * 128 * 768


# ---------------------------------------------------------------------------------------------- head sizes


def test_explicit_key_length_sizes_the_cache(arch: dict[str, GgufStructure]) -> None:
    s = arch["qwen3-headdim"]
    assert (s.n_embd // s.n_head[0], s.key_length, s.value_length) == (16, 32, 32)
    cfg = LoadConfig(n_ctx=2048, n_parallel=1)
    kv = kv_layers(s, resolve_context(s, cfg), cfg)
    # 3 layers x (K + V) x 2048 cells x row f16 of 32 * 1 kv head = 64 B
    assert kv.bytes == 3 * 2 * 2048 * row_size("f16", 32)


def test_q8_0_cache_needs_every_head_size_to_be_whole_blocks(arch: dict[str, GgufStructure]) -> None:
    cfg = LoadConfig(n_ctx=2048, n_parallel=1, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="on")
    s = arch["qwen3-headdim"]  # 32 % 32 == 0: allowed
    kv = kv_layers(s, resolve_context(s, cfg), cfg)
    assert kv.bytes == 3 * 2 * 2048 * (32 // 32 * 34)


# ---------------------------------------------------------------------------------------------- MLA and MTP


def test_mla_caches_one_latent_row_and_no_v(arch: dict[str, GgufStructure]) -> None:
    s = arch["deepseek2-mla"]
    assert s.mla and s.n_head_kv[0] == 1
    assert (s.key_length, s.value_length) == (64 + 32, 64)  # kv_lora_rank + rope, kv_lora_rank
    assert (s.n_layer, s.n_layer_nextn, s.n_layer_trunk) == (4, 1, 3)
    for fa in ("on", "off"):  # no V tensor either way, so no transposed-V padding
        cfg = LoadConfig(n_ctx=1000, flash_attn=fa)
        kv = kv_layers(s, resolve_context(s, cfg), cfg)
        # 3 trunk layers (the MTP block has no cache) x 1024 cells x f16 row of 96 = 192 B; V 0
        assert [layer.il for layer in kv.layers] == [0, 1, 2]
        assert all(layer.v_bytes == 0 for layer in kv.layers)
        assert kv.bytes == 3 * 1024 * row_size("f16", 96)


def test_mtp_block_weights_are_not_loaded(arch: dict[str, GgufStructure]) -> None:
    s = arch["deepseek2-mla"]
    pl = place(s, LoadConfig(n_ctx=1000), X86_AVX512)
    placed = {name for name, _ in pl.tensor_buffer}
    assert not any(n.startswith("blk.3.") for n in placed)
    trunk = [t for t in s.tensors if t.layer is None or t.layer < 3]
    mapped = pl.buffer("CPU_Mapped")
    assert mapped is not None
    assert mapped.bytes == max(t.end for t in trunk) - min(t.offset for t in trunk) < s.file_bytes - s.data_offset


# ---------------------------------------------------------------------------------------------- placement


def test_token_embd_norm_goes_with_layer_zero(arch: dict[str, GgufStructure]) -> None:
    s = arch["bloom-alibi"]
    pl = place(s, LoadConfig(n_ctx=1000, devices=("CUDA0",), n_gpu_layers=-1), X86_AVX512)
    where = dict(pl.tensor_buffer)
    assert where["token_embd.weight"] == "CPU_Mapped"  # the input layer stays on the CPU
    assert where["token_embd_norm.weight"] == where["blk.0.attn_norm.weight"] == "CUDA0"


def test_fused_and_shared_expert_tensors_are_priced_by_their_own_shapes(arch: dict[str, GgufStructure]) -> None:
    phi = arch["phi-fusedqkv"]
    qkv = phi.tensor("blk.0.attn_qkv.weight")
    assert qkv is not None and qkv.shape == (96, 16 * (6 + 2 * 3))  # head 16: 6 q heads + 3 k + 3 v
    moe = arch["qwen2moe-shexp"]
    shexp = moe.tensor("blk.0.ffn_up_shexp.weight")
    exps = moe.tensor("blk.0.ffn_up_exps.weight")
    assert shexp is not None and exps is not None and not shexp.expert and exps.expert
    assert shexp.shape == (96, 136) and exps.shape == (96, 72, 6)


def test_every_new_architecture_prices_its_context(arch: dict[str, GgufStructure]) -> None:
    for name, s in arch.items():
        cpu = price(s, LoadConfig(n_ctx=1000), host=X86_AVX512).footprint.device("CPU")
        assert cpu is not None and cpu.context.source == "formula" and cpu.context.bytes, name

