"""price(): terms, sources, host split, overrides and refusals."""

from __future__ import annotations

from fitevict.pricing.gguf import GgufStructure
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.price import price
from fitevict.pricing.hostbufs import rule_table

X86_AVX512 = rule_table({"avx2", "avx512f"})  # a fixed CPU (AVX-512, no AMX): these figures hold on any machine


def test_cpu_only_terms_and_sources(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-gqa"]
    p = price(s, LoadConfig(n_ctx=1000, n_parallel=1), host=X86_AVX512)
    assert [d.name for d in p.footprint.devices] == ["CPU"]
    cpu = p.footprint.devices[0]
    assert cpu.context.bytes == 3 * 2 * 64 * 1024  # 3 layers, K+V, 32 f16 per cell, 1024 cells
    assert cpu.output.bytes == 1003 * 4  # one slot
    assert (cpu.model.source, cpu.context.source, cpu.output.source, cpu.compute.source) == (
        "formula", "formula", "formula", "formula")
    assert (p.n_ctx, p.n_ctx_seq, p.n_parallel, p.kv_unified, p.flash_attn) == (1024, 1024, 1, False, True)
    fp = p.footprint
    assert fp.host_mapped_bytes == cpu.model.bytes
    assert fp.host_committed_bytes == cpu.total_bytes - cpu.model.bytes


def test_dry_run_compute_overrides_the_formula(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-gqa"]
    p = price(s, LoadConfig(), compute={"CPU": 3_386_900}, host=X86_AVX512)
    cpu = p.footprint.device("CPU")
    assert cpu is not None and cpu.compute.bytes == 3_386_900 and cpu.compute.source == "dry-run"


def test_without_mmap_the_weights_are_committed(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-gqa"]
    p = price(s, LoadConfig(mmap=False), host=X86_AVX512)
    cpu = p.footprint.device("CPU")
    assert cpu is not None
    assert p.footprint.host_mapped_bytes == 0
    # every tensor copied into one CPU buffer, each padded to 32 B (all these sizes already are)
    assert cpu.model.bytes == sum(t.nbytes for t in s.tensors)
    assert p.footprint.host_committed_bytes == cpu.total_bytes


def test_repack_is_committed_while_the_span_is_mapped(structures: dict[str, GgufStructure]) -> None:
    p = price(structures["llama-q4_0"], LoadConfig(), host=X86_AVX512)
    bufs = {b.name: b for b in p.buffers}
    assert bufs["CPU_Mapped"].mapped and not bufs["CPU_REPACK"].mapped
    assert p.footprint.host_mapped_bytes == bufs["CPU_Mapped"].bytes
    cpu = p.footprint.device("CPU")
    assert cpu is not None and cpu.model.bytes == bufs["CPU_Mapped"].bytes + bufs["CPU_REPACK"].bytes


def test_gpu_devices_get_their_own_rows(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-gqa"]
    p = price(s, LoadConfig(devices=("CUDA0",), n_gpu_layers=-1), compute={"CPU": 1000}, host=X86_AVX512)
    names = [d.name for d in p.footprint.devices]
    assert names == ["CPU", "CUDA0"]
    gpu = p.footprint.device("CUDA0")
    assert gpu is not None and gpu.compute.source == "formula" and gpu.compute.bytes and gpu.compute.bytes > 0
    assert p.footprint.bytes_on("CUDA0") == gpu.total_bytes


def test_n_cpu_moe_on_a_dense_model_is_noted(structures: dict[str, GgufStructure]) -> None:
    p = price(structures["llama-gqa"], LoadConfig(n_cpu_moe=2), host=X86_AVX512)
    assert any("--n-cpu-moe" in w for w in p.warnings)


def test_recurrent_model_context_is_independent_of_ctx(structures: dict[str, GgufStructure]) -> None:
    s = structures["mamba"]
    a = price(s, LoadConfig(n_ctx=512), host=X86_AVX512).footprint.device("CPU")
    b = price(s, LoadConfig(n_ctx=8192), host=X86_AVX512).footprint.device("CPU")
    assert a is not None and b is not None and a.context.bytes == b.context.bytes
