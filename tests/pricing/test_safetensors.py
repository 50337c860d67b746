"""HF pricing from safetensors headers: stored bytes, casts, packed GPTQ tensors, bnb plans, KV from config.json.

The bnb figures asserted here were measured on a real bitsandbytes CPU load of the same shapes (Llama, hidden 64,
2 layers, 4 heads / 2 KV heads, FFN 128, vocab 300): parameters 191,744 B; quant_state 5,504 B in 28 tensors (nf4),
16,496 B in 70 tensors with double quantization; 8-bit: parameters 228,608 B and SCB 4,096 B.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from fitevict.pricing.gguf import PricingError
from fitevict.pricing.hf_kv import hf_kv, sliding_layers
from fitevict.pricing.hf_price import HfLoadConfig, bnb4_state_bytes, price_hf
from fitevict.pricing.safetensors import load_hf_structure

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
         "max_position_embeddings": 2048, "rope_theta": 10000.0, "dtype": "float32", "tie_word_embeddings": False}


def llama_tensors(dtype: type = np.float32) -> dict[str, np.ndarray]:
    t = {"model.embed_tokens.weight": (300, 64), "model.norm.weight": (64,), "lm_head.weight": (300, 64)}
    for i in range(2):
        p = f"model.layers.{i}."
        t |= {p + "self_attn.q_proj.weight": (64, 64), p + "self_attn.k_proj.weight": (32, 64),
              p + "self_attn.v_proj.weight": (32, 64), p + "self_attn.o_proj.weight": (64, 64),
              p + "mlp.gate_proj.weight": (128, 64), p + "mlp.up_proj.weight": (128, 64),
              p + "mlp.down_proj.weight": (64, 128), p + "input_layernorm.weight": (64,),
              p + "post_attention_layernorm.weight": (64,)}
    return {k: np.zeros(v, dtype=dtype) for k, v in t.items()}


def hf_folder(path: Path, config: dict, tensors: dict[str, np.ndarray]) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"))
    return path


def test_weights_are_the_headers_stored_bytes_with_mixed_dtypes(tmp_path: Path) -> None:
    t = llama_tensors()
    t["model.norm.weight"] = np.zeros(64, dtype=np.float16)
    s = load_hf_structure(hf_folder(tmp_path / "m", LLAMA, t))
    p = price_hf(s, HfLoadConfig(n_ctx=512))
    assert s.stored_bytes == 449_792 - 128  # fp32 everywhere (measured walk: 449,792 B), one norm stored f16
    # --dtype auto loads in config.json's dtype (f32): the f16 norm is cast up; the rotary tables
    # (inv_freq + original_inv_freq, f32, head_dim 16 / 2 each) are held beside the weights
    assert p.model_bytes == 449_792 + 2 * 8 * 4
    assert p.footprint.host_mapped_bytes == 449_792 - 256  # as stored on the CPU: mapped; the cast norm is not


def test_dtype_cast_converts_float_tensors_only(tmp_path: Path) -> None:
    t = llama_tensors()
    t["model.layers.0.extra_index"] = np.zeros(10, dtype=np.int64)
    s = load_hf_structure(hf_folder(tmp_path / "m", LLAMA, t))
    p = price_hf(s, HfLoadConfig(dtype="bfloat16"))
    assert p.weight_bytes == 449_792 // 2 + 80
    assert p.footprint.host_mapped_bytes == 80  # cast copies are anonymous memory; the int tensor stays mapped


def test_gptq_packed_tensors_count_as_stored(tmp_path: Path) -> None:
    cfg = {**LLAMA, "dtype": "float16", "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32}}
    t = {"model.embed_tokens.weight": np.zeros((300, 64), np.float16), "lm_head.weight": np.zeros((300, 64), np.float16)}
    for i in range(2):
        p = f"model.layers.{i}.self_attn.q_proj."
        t |= {p + "qweight": np.zeros((8, 64), np.int32), p + "qzeros": np.zeros((2, 8), np.int32),
              p + "scales": np.zeros((2, 64), np.float16), p + "g_idx": np.zeros(64, np.int32)}
    s = load_hf_structure(hf_folder(tmp_path / "g", cfg, t))
    stored = sum(a.nbytes for a in t.values())
    for dtype in ("auto", "float32"):
        p = price_hf(s, HfLoadConfig(dtype=dtype))
        assert p.weight_bytes == stored
        assert any("gptq" in w for w in p.warnings)
    with pytest.raises(PricingError, match="already quantized"):
        price_hf(s, HfLoadConfig(quant="bnb4"))


@pytest.mark.parametrize(("quant", "dq", "weights", "state"), [
    ("bnb4", False, 191_744, 5_504), ("bnb4", True, 191_744, 16_496), ("bnb8", False, 228_608, 4_096)])
def test_bnb_plan_matches_a_measured_cpu_load(tmp_path: Path, quant: str, dq: bool, weights: int, state: int) -> None:
    s = load_hf_structure(hf_folder(tmp_path / "m", LLAMA, llama_tensors()))
    p = price_hf(s, HfLoadConfig(quant=quant, bnb4_double_quant=dq))  # type: ignore[arg-type]
    assert sum(w.bytes for w in p.weights) == weights
    assert sum(w.quant_state_bytes for w in p.weights) == state
    kinds = {w.name: w.kind for w in p.weights}
    # bnb leaves the embeddings, the output head and the norms unquantized
    assert kinds["lm_head.weight"] == kinds["model.embed_tokens.weight"] == kinds["model.norm.weight"] == "stored"
    assert kinds["model.layers.1.mlp.down_proj.weight"] == quant
    # measured: transformers keeps the checkpoint mapped after a bnb load, read whole (page cache)
    assert p.footprint.host_mapped_bytes == p.checkpoint_mapped_bytes == s.stored_bytes
    assert p.host_model_bytes == weights + state + 64 + s.stored_bytes


def test_bnb4_state_grows_with_blocks_and_nested_state() -> None:
    assert bnb4_state_bytes(64, False) == 4 + 64
    assert bnb4_state_bytes(64 * 257, True) == 257 + 4 + 4 * 2 + 1024 + 64  # two nested blocks past 256


def test_kv_counts_key_value_heads_not_attention_heads() -> None:
    kv = hf_kv(LLAMA, 1000, 2)
    assert kv.bytes_per_token_layer == 2 * 2 * 16 * 2  # K+V x 2 KV heads x head_dim 16 x f16
    assert kv.total_bytes == 2 * 1000 * kv.bytes_per_token_layer


@pytest.mark.parametrize(("extra", "expected"), [
    ({"sliding_window": 64}, (True, True, True, True)),  # mistral: every layer
    ({"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 2}, (False, False, True, True)),
    ({"use_sliding_window": False, "sliding_window": 64, "max_window_layers": 2}, (False,) * 4),
    ({"sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"] * 2}, (True, False, True, False)),
    ({}, (False,) * 4),
])
def test_sliding_layers_in_every_spelling(extra: dict, expected: tuple[bool, ...]) -> None:
    cfg = {**LLAMA, "num_hidden_layers": 4, **extra}
    assert sliding_layers(cfg) == expected
    kv = hf_kv(cfg, 1000, 4)
    n_swa = sum(expected)
    assert kv.total_bytes == kv.bytes_per_token_layer * ((4 - n_swa) * 1000 + n_swa * 64)


def test_split_places_whole_layers_until_max_memory(tmp_path: Path) -> None:
    s = load_hf_structure(hf_folder(tmp_path / "m", LLAMA, llama_tensors()))
    layer = 4 * (64 * 64 * 2 + 32 * 64 * 2 + 128 * 64 * 3 + 128)
    p = price_hf(s, HfLoadConfig(device_map="split", max_memory=(("CUDA0", 76_800 + layer),)))
    assert dict(p.placement) == {"model.embed_tokens": "CUDA0", "model.layers.0": "CUDA0", "model.layers.1": "CPU",
                                 "model.norm": "CPU", "lm_head": "CPU"}
    gpu = p.footprint.device("CUDA0")
    assert gpu is not None and gpu.model.bytes == 76_800 + layer + 64  # the rotary tables go with the first group
    assert gpu.context.bytes == p.kv.total_bytes // 2  # type: ignore[union-attr]


def test_cli_price_hf_json_has_the_gguf_shape(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from fitevict.cli import app

    folder = hf_folder(tmp_path / "m", LLAMA, llama_tensors())
    r = CliRunner().invoke(app, ["price", str(folder), "--json", "-c", "512", "--quant", "bnb4"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert {"model", "file_bytes", "arch", "n_layer", "config", "devices", "buffers", "kv", "host", "total_bytes",
            "warnings"} <= set(doc)
    assert doc["devices"][0]["name"] == "CPU" and doc["devices"][0]["sources"]["model"] == "formula"
    assert doc["weights"]["held_bytes"] == 191_744 + 5_504
    bad = CliRunner().invoke(app, ["price", str(folder), "--dtype", "float8"])
    assert bad.exit_code == 2 and "--dtype" in bad.output


def test_a_folder_without_safetensors_is_refused_with_the_remedy(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(LLAMA))
    with pytest.raises(PricingError, match="save_pretrained"):
        load_hf_structure(tmp_path / "m")
