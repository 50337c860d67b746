"""PEFT adapters priced from their safetensors headers: LoRA weights in float32, saved module copies at the base's
dtype, each on the device of the module it adapts (the rules were measured against the seat's object walk: see
tests/engines/test_torch_seat.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from fitevict.pricing.footprint import HOST
from fitevict.pricing.gguf import PricingError
from fitevict.pricing.hf_price import HfLoadConfig, price_hf
from fitevict.pricing.peft import adapted_module, adapter_held_bytes, adapter_of, held_bytes, load_peft_adapter
from fitevict.pricing.safetensors import StTensor, load_hf_structure

from .test_safetensors import LLAMA, hf_folder, llama_tensors


def peft_folder(path: Path, dtype: type = np.float16, head: bool = False) -> Path:
    path.mkdir(parents=True)
    t = {}
    for i in range(2):
        p = f"base_model.model.model.layers.{i}.self_attn."
        t |= {p + "q_proj.lora_A.weight": np.zeros((4, 64), dtype), p + "q_proj.lora_B.weight": np.zeros((64, 4), dtype)}
    if head:
        t["base_model.model.lm_head.weight"] = np.zeros((300, 64), dtype)  # modules_to_save, as peft saves it
    save_file(t, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text("{}")
    return path


def test_names_say_which_module_and_which_adapter() -> None:
    assert adapted_module("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight") == \
        "model.layers.0.self_attn.q_proj"
    assert adapted_module("base_model.model.lm_head.weight") == "lm_head"
    assert adapter_of("base_model.model.model.layers.0.self_attn.q_proj.lora_B.sql.weight") == "sql"
    assert adapter_of("base_model.model.lm_head.modules_to_save.poem.weight") == "poem"
    assert adapter_of("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") is None
    assert adapter_of("model.layers.0.self_attn.q_proj.weight") is None


def test_lora_weights_are_held_in_float32_and_module_copies_at_the_base_dtype() -> None:
    a = StTensor("x.lora_A.weight", "BF16", (4, 64), 4 * 64 * 2)
    copy = StTensor("base_model.model.lm_head.weight", "F32", (300, 64), 300 * 64 * 4)
    assert held_bytes(a, "BF16") == held_bytes(a, None) == 4 * 64 * 4
    assert held_bytes(copy, "BF16") == 300 * 64 * 2 and held_bytes(copy, None) == copy.nbytes


def test_an_hf_price_carries_its_adapters_as_their_own_term(tmp_path: Path) -> None:
    s = load_hf_structure(hf_folder(tmp_path / "m", LLAMA, llama_tensors()))
    a, b = (load_peft_adapter(peft_folder(tmp_path / n)) for n in ("a", "b"))
    plain = price_hf(s, HfLoadConfig(n_ctx=512)).footprint.device(HOST)
    both = price_hf(s, HfLoadConfig(n_ctx=512, adapters=(a.path, b.path)), adapters=(a, b)).footprint
    cpu = both.device(HOST)
    lora = 2 * 2 * (4 * 64 + 64 * 4) * 4  # two adapters, two layers, A and B, f16 on disk, f32 held
    assert adapter_held_bytes(a, None) * 2 == lora
    assert (cpu.adapters.bytes, cpu.adapters.source) == (lora, "formula")
    assert cpu.model.bytes == plain.model.bytes and cpu.total_bytes == plain.total_bytes + lora
    assert both.host_committed_bytes - price_hf(s, HfLoadConfig(n_ctx=512)).footprint.host_committed_bytes == lora


def test_adapters_go_where_their_modules_were_placed(tmp_path: Path) -> None:
    s = load_hf_structure(hf_folder(tmp_path / "m", LLAMA, llama_tensors()))
    a = load_peft_adapter(peft_folder(tmp_path / "a", head=True))
    layer = 2 * (64 * 64 + 32 * 64 * 2 + 64 * 64 + 3 * 128 * 64 + 64) * 4
    embed = 300 * 64 * 4
    # the embeddings and layer 0 fit on the GPU; layer 1 and the head stay on the CPU
    cfg = HfLoadConfig(n_ctx=512, dtype="bfloat16", device_map="split", max_memory=(("CUDA0", embed // 2 + layer // 2),),
                       adapters=(a.path,))
    fp = price_hf(s, cfg, adapters=(a,)).footprint
    per_layer = (4 * 64 + 64 * 4) * 4
    assert fp.device("CUDA0").adapters.bytes == per_layer
    assert fp.device(HOST).adapters.bytes == per_layer + 300 * 64 * 2  # the head copy at the load dtype


def test_an_adapter_without_weights_is_a_pricing_error(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    with pytest.raises(PricingError, match="no adapter_model.safetensors"):
        load_peft_adapter(tmp_path / "x")
