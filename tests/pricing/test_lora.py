"""Pricing LoRA adapters: the buffers the pinned llama.cpp allocates for them, per device, from real files."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from fitevict.pricing.footprint import HOST
from fitevict.pricing.ggml_types import pad
from fitevict.pricing.gguf import PricingError, load_structure
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.logparse import parse_load_log
from fitevict.pricing.lora import load_adapter
from fitevict.pricing.price import price
from fitevict.zoo import write_zoo
from fitevict.pricing.hostbufs import rule_table
from fitevict.zoo.gguf_adapters import write_adapters

X86_AVX512 = rule_table({"avx2", "avx512f"})  # a fixed CPU (AVX-512, no AMX): these figures hold on any machine


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("zoo")
    write_zoo(dest, only=["llama-gqa", "llama-q4_0", "llama-tied", "gemma2-swa"])
    write_adapters(dest, names=("sql", "poem"))
    return dest


def adapters(zoo_dir: Path) -> tuple[str, ...]:
    return tuple(str(zoo_dir / "llama-gqa.adapters" / f"{n}.gguf") for n in ("poem", "sql"))


def test_the_demo_adapter_has_the_loader_s_layout(zoo_dir: Path) -> None:
    a = load_adapter(zoo_dir / "llama-gqa.adapters" / "sql.gguf")
    s = load_structure(zoo_dir / "llama-gqa.gguf")
    assert a.arch == "llama" and a.rank == 8 and a.alpha == 8.0
    for t in a.tensors:
        w = s.tensor(t.base_name)
        assert w is not None
        n_in, n_out = w.shape[0], w.shape[1]
        assert t.shape == ((n_in, 8) if t.name.endswith(".lora_a") else (8, n_out))  # ne, as llama.cpp checks


def test_adapters_are_priced_per_device_apart_from_the_model(zoo_dir: Path) -> None:
    s = load_structure(zoo_dir / "llama-gqa.gguf")
    plain = price(s, LoadConfig(n_ctx=512, n_parallel=1), host=X86_AVX512).footprint
    two = price(s, LoadConfig(n_ctx=512, n_parallel=1, loras=adapters(zoo_dir)), host=X86_AVX512).footprint
    want = sum(pad(t.nbytes, 32) for p in adapters(zoo_dir) for t in load_adapter(p).tensors)
    cpu = two.device(HOST)
    assert cpu.adapters.bytes == want and cpu.adapters.source == "formula"
    assert two.total_bytes == plain.total_bytes + want and two.host_committed_bytes == plain.host_committed_bytes + want
    assert cpu.model == plain.device(HOST).model
    gpu = price(s, LoadConfig(n_ctx=512, n_parallel=1, devices=("CUDA0",), n_gpu_layers=-1,
                              loras=adapters(zoo_dir)), host=X86_AVX512).footprint
    assert gpu.device("CUDA0").adapters.bytes == sum(pad(t.nbytes, 128) for p in adapters(zoo_dir)
                                                    for t in load_adapter(p).tensors)
    assert gpu.device(HOST).adapters.bytes == 0


def test_the_log_s_lora_buffers_are_the_measured_adapter_term() -> None:
    log = ("0.00.029 I load_tensors:   CPU_Mapped model buffer size =     0.92 MiB\n"
           "0.00.031 I llama_adapter_lora_init_impl: CPU_Mapped LoRA buffer size =     0.08 MiB\n"
           "0.00.032 I llama_adapter_lora_init_impl: CPU_Mapped LoRA buffer size =     0.08 MiB\n")
    fp = parse_load_log(log).to_footprint()
    assert fp.device(HOST).adapters.bytes == round(0.16 * 1024 * 1024) and fp.host_mapped_bytes == round(0.92 * 2**20)
    assert fp.host_committed_bytes == fp.device(HOST).total_bytes - fp.host_mapped_bytes


def test_an_adapter_the_engine_refuses_is_refused_with_its_reason(zoo_dir: Path) -> None:
    gemma = load_structure(zoo_dir / "gemma2-swa.gguf")
    with pytest.raises(PricingError, match="arch mismatch"):
        price(gemma, LoadConfig(n_ctx=512, loras=adapters(zoo_dir)[:1]), host=X86_AVX512)
    # a tied output is token_embd itself: llama.cpp has no "output.weight" for an adapter to name
    path = zoo_dir / "tied-output.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_tensor("output.weight.lora_a", np.zeros((8, 96), dtype=np.float32))
    w.add_tensor("output.weight.lora_b", np.zeros((1003, 8), dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(PricingError, match="'output.weight' does not exist in the base"):
        price(load_structure(zoo_dir / "llama-tied.gguf"), LoadConfig(n_ctx=512, loras=(str(path),)), host=X86_AVX512)


def test_a_stored_measurement_keeps_its_adapter_term(zoo_dir: Path) -> None:
    from fitevict.pricing.footprint import footprint_from_json

    fp = price(load_structure(zoo_dir / "llama-gqa.gguf"), LoadConfig(n_ctx=512, loras=adapters(zoo_dir)), host=X86_AVX512).footprint
    back = footprint_from_json(fp.to_json())
    assert back.device(HOST).adapters == fp.device(HOST).adapters and back.total_bytes == fp.total_bytes
    plain = price(load_structure(zoo_dir / "llama-gqa.gguf"), LoadConfig(n_ctx=512), host=X86_AVX512).footprint
    assert "adapter_bytes" not in plain.to_json()["devices"][0]  # a seat without adapters keeps its old record


def test_the_seat_argv_reads_back_into_the_same_config(zoo_dir: Path) -> None:
    from fitevict.engines.llama_cpp.server import load_args
    from fitevict.pricing.cmdline import parse_server_argv

    cfg = LoadConfig(n_ctx=512, n_parallel=1, loras=adapters(zoo_dir))
    argv = load_args(zoo_dir / "llama-gqa.gguf", cfg)
    assert argv.count("--lora") == 1  # one comma list: the pinned build warns on a repeated --lora
    back = parse_server_argv(argv)
    assert back.config == cfg and back.warnings == ()
    assert parse_server_argv(["-m", "x.gguf", "--lora-scaled", "a.gguf:0.5,b.gguf:1", "--lora", "c.gguf"]
                             ).config.loras == ("a.gguf", "b.gguf", "c.gguf")
    with pytest.raises(ValueError, match="contains a comma"):
        load_args("x.gguf", LoadConfig(loras=("/a,b/x.gguf",)))
