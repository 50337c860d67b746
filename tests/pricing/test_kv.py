"""Context resolution and KV sizing, rule by rule (llama.cpp 0c1e570); arithmetic in the comments."""

from __future__ import annotations

import pytest

from fitevict.pricing.gguf import GgufStructure, PricingError
from fitevict.pricing.kv import kv_layers, output_bytes, resolve_context
from fitevict.pricing.loadconfig import LoadConfig


def test_no_np_means_four_slots_sharing_one_unified_cache(structures: dict[str, GgufStructure]) -> None:
    rc = resolve_context(structures["llama-gqa"], LoadConfig(n_ctx=4096))
    assert (rc.n_parallel, rc.kv_unified, rc.n_stream, rc.n_ctx, rc.n_ctx_seq) == (4, True, 1, 4096, 4096)


def test_np3_pads_each_slot_to_256(structures: dict[str, GgufStructure]) -> None:
    rc = resolve_context(structures["llama-gqa"], LoadConfig(n_ctx=4096, n_parallel=3))
    # 4096 / 3 = 1365 -> PAD256 -> 1536 per slot; n_ctx becomes 3 * 1536 = 4608
    assert (rc.n_ctx_seq, rc.n_ctx, rc.n_stream, rc.kv_unified) == (1536, 4608, 3, False)
    assert any("4608" in w for w in rc.warnings)


def test_ctx_not_a_multiple_of_256_is_padded(structures: dict[str, GgufStructure]) -> None:
    rc = resolve_context(structures["llama-gqa"], LoadConfig(n_ctx=1000, n_parallel=1))
    assert (rc.n_ctx, rc.n_ctx_seq) == (1024, 1024)
    # n_batch = min(-c before padding, -b) = min(1000, 2048); n_ubatch = min(n_batch, 512)
    assert (rc.n_batch, rc.n_ubatch) == (1000, 512)


def test_ctx_zero_is_the_training_context_per_stream(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-gqa"]
    assert resolve_context(s, LoadConfig(n_ctx=0)).n_ctx == s.n_ctx_train == 4096
    rc = resolve_context(s, LoadConfig(n_ctx=0, n_parallel=2))
    assert (rc.n_ctx, rc.n_ctx_seq) == (2 * 4096, 4096)


def test_kv_bytes_known_answer(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-gqa"]
    rc = resolve_context(s, LoadConfig(n_ctx=1000, n_parallel=1))
    kv = kv_layers(s, rc, LoadConfig(n_ctx=1000, n_parallel=1))
    # per layer: K and V rows of key_length 16 * 2 kv heads = 32 f16 = 64 B, 1024 cells, 1 stream
    assert kv.bytes == 3 * 2 * 64 * 1024 == 393216
    assert (kv.cells, kv.layers_full, kv.layers_swa) == (1024, 3, 0)


def test_q8_0_cache_is_34_bytes_per_32(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-q8_0"]  # key_length 32, 1 kv head
    cfg = LoadConfig(n_ctx=2048, n_parallel=1, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="on")
    kv = kv_layers(s, resolve_context(s, cfg), cfg)
    # 3 layers * (K + V) * 2048 cells * one q8_0 block of 32 = 34 B
    assert kv.bytes == 3 * 2 * 2048 * 34


def test_per_layer_kv_heads(structures: dict[str, GgufStructure]) -> None:
    s = structures["deci-kvarray"]
    cfg = LoadConfig(n_ctx=1024, n_parallel=1)
    kv = kv_layers(s, resolve_context(s, cfg), cfg)
    # key_length 16; heads_kv (2, 1, 3, 2) -> K row f16 = 16*h*2 B; K + V = 64*h B per cell
    assert [l.bytes for l in kv.layers] == [64 * h * 1024 for h in (2, 1, 3, 2)]


def test_v_without_flash_attention_pads_to_the_widest_layer(structures: dict[str, GgufStructure]) -> None:
    s = structures["deci-kvarray"]
    cfg = LoadConfig(n_ctx=1024, n_parallel=1, flash_attn="off")
    kv = kv_layers(s, resolve_context(s, cfg), cfg)
    # V transposed: every layer's V row is the widest, 16 * 3 heads; K keeps its own width
    assert [l.v_bytes for l in kv.layers] == [16 * 3 * 2 * 1024] * 4
    assert [l.k_bytes for l in kv.layers] == [16 * h * 2 * 1024 for h in (2, 1, 3, 2)]


def test_swa_cells(structures: dict[str, GgufStructure]) -> None:
    s = structures["gemma2-swa"]  # n_swa 64, layers 0 and 2 SWA
    cfg = LoadConfig(n_ctx=1000)  # 4 slots, unified
    kv = kv_layers(s, resolve_context(s, cfg), cfg)
    # PAD256(min(1024, 64 * 4 slots + 512 ubatch)) = PAD256(768) = 768
    assert (kv.cells, kv.cells_swa, kv.layers_full, kv.layers_swa) == (1024, 768, 2, 2)
    cfg = LoadConfig(n_ctx=1000, n_parallel=2, n_ubatch=128, n_batch=512)
    kv = kv_layers(s, resolve_context(s, cfg), cfg)
    # not unified: PAD256(min(512, 64 * 1 + 128)) = 256
    assert kv.cells_swa == 256
    cfg = LoadConfig(n_ctx=1000, swa_full=True)
    assert kv_layers(s, resolve_context(s, cfg), cfg).cells_swa == 1024


def test_recurrent_state_one_cell_per_slot(structures: dict[str, GgufStructure]) -> None:
    s = structures["mamba"]
    for cfg, slots in ((LoadConfig(n_ctx=1000), 4), (LoadConfig(n_ctx=8192, n_parallel=3), 3)):
        kv = kv_layers(s, resolve_context(s, cfg), cfg)
        # f32 (n_embd_r + n_embd_s) = (3 * 192 + 16 * 192) * 4 B per slot per layer, independent of ctx
        assert kv.bytes == 2 * (3 * 192 + 16 * 192) * 4 * slots
        assert kv.layers_recurrent == 2


def test_output_buffer_is_vocab_floats_per_slot(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-gqa"]
    assert output_bytes(s, resolve_context(s, LoadConfig())) == 1003 * 4 * 4
    assert output_bytes(s, resolve_context(s, LoadConfig(n_parallel=3))) == 1003 * 4 * 3


def test_quantized_v_needs_flash_attention(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-q8_0"]
    with pytest.raises(PricingError, match=r"llama-q8_0\.gguf.*quantized V.*-fa on"):
        resolve_context(s, LoadConfig(cache_type_v="q8_0", flash_attn="off"))


def test_quantized_k_block_must_divide_head_size(structures: dict[str, GgufStructure]) -> None:
    # llama-gqa heads are 16 wide; a q8_0 block is 32 -> llama.cpp refuses the context
    with pytest.raises(PricingError, match=r"block size 32.*n_embd_head_k=16"):
        resolve_context(structures["llama-gqa"], LoadConfig(cache_type_k="q8_0", cache_type_v="q8_0"))
