"""GPU placement without a GPU: known answers for -ngl, the output-layer rule, tied embeddings, --n-cpu-moe,
the mmap span and CPU_REPACK. Devices are named in LoadConfig.devices; arithmetic is in the comments.

llama-gqa (f16): token_embd / output 96 x 1003 f16 = 192576 B each (CUDA pads to 128 -> 192640),
output_norm 96 f32 = 384 B; one layer = 2 norms 384 + q, o 18432 + k, v 6144 + gate, up, down 48000 = 193920 B
(every one a multiple of 128, so CUDA adds nothing).
"""

from __future__ import annotations

from fitevict.pricing.gguf import GgufStructure
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.hostbufs import rule_table
from fitevict.pricing.placement import place
from fitevict.pricing.price import price

X86_AVX2 = rule_table({"avx2"})
X86_AVX512 = rule_table({"avx2", "avx512f"})  # an AMD EPYC with AVX-512: no AMX

LAYER = 2 * 384 + 2 * 18432 + 2 * 6144 + 3 * 48000  # 193920
OUTPUT_GPU = 192640 + 384  # output.weight padded to 128 + output_norm


def _gpu(s: GgufStructure, **kw: object) -> dict[str, int]:
    p = place(s, LoadConfig(devices=("CUDA0",), **kw), X86_AVX512)  # type: ignore[arg-type]
    return {b.name: b.bytes for b in p.buffers}


def test_ngl_1_offloads_only_the_output_layer(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-gqa"]
    p = place(s, LoadConfig(devices=("CUDA0",), n_gpu_layers=1), X86_AVX512)
    assert p.output_device == "CUDA0" and p.layer_device == ("CPU", "CPU", "CPU")
    assert _gpu(s, n_gpu_layers=1)["CUDA0"] == OUTPUT_GPU == 193024


def test_ngl_counts_layers_from_the_end(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-gqa"]
    # layers il >= n_layer + 1 - ngl go to the GPU: -ngl 2 -> output + layer 2
    assert place(s, LoadConfig(devices=("CUDA0",), n_gpu_layers=2), X86_AVX512).layer_device == ("CPU", "CPU", "CUDA0")
    assert _gpu(s, n_gpu_layers=2)["CUDA0"] == OUTPUT_GPU + LAYER == 386944
    assert _gpu(s, n_gpu_layers=4)["CUDA0"] == OUTPUT_GPU + 3 * LAYER == 774784
    assert _gpu(s, n_gpu_layers=-1) == _gpu(s, n_gpu_layers=4)


def test_ngl_above_the_layer_count_is_clamped_with_a_note(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-gqa"]
    p = price(s, LoadConfig(devices=("CUDA0",), n_gpu_layers=99), host=X86_AVX512)
    assert p.n_gpu_layers == 4
    assert any("-ngl 99" in w and "clamped to 4" in w for w in p.warnings)


def test_token_embd_stays_on_the_cpu_and_the_span_keeps_offloaded_holes(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-gqa"]
    te = s.tensor("token_embd.weight")
    out = s.tensor("output.weight")
    assert te is not None and out is not None and te.offset < out.offset
    full = _gpu(s, n_gpu_layers=4)
    assert full["CPU_Mapped"] == te.nbytes == 192576
    # -ngl 1 moves output.weight to the GPU, but it sits between token_embd and blk.0 in the file:
    # the mapped span (first to last CPU tensor) is unchanged
    assert _gpu(s, n_gpu_layers=1)["CPU_Mapped"] == _gpu(s, n_gpu_layers=0)["CPU_Mapped"]
    last = s.tensors[-1]
    assert _gpu(s, n_gpu_layers=0)["CPU_Mapped"] == last.end - te.offset


def test_tied_embedding_is_duplicated_when_the_output_is_offloaded(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-tied"]  # f32: token_embd 96 x 1003 x 4 = 385152 B (a multiple of 128)
    assert "CUDA0" not in _gpu(s, n_gpu_layers=0)
    assert _gpu(s, n_gpu_layers=1)["CUDA0"] == 385152 + 384  # duplicate + output_norm
    # on the CPU the loader reuses token_embd itself: no second copy without mmap either
    cpu = {b.name: b.bytes for b in place(s, LoadConfig(mmap=False), X86_AVX512).buffers}
    assert cpu == {"CPU": sum(t.nbytes for t in s.tensors)}


def test_n_cpu_moe_keeps_the_first_layers_experts_on_the_cpu(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-moe"]  # experts per layer: gate/up 96 x 136 x 4, down 136 x 96 x 4 f16 = 104448 B each
    expert = 96 * 136 * 4 * 2
    all_gpu = _gpu(s, n_gpu_layers=-1)["CUDA0"]
    assert _gpu(s, n_gpu_layers=-1, n_cpu_moe=1)["CUDA0"] == all_gpu - 3 * expert
    assert _gpu(s, n_gpu_layers=-1, n_cpu_moe=2)["CUDA0"] == all_gpu - 6 * expert
    # without mmap the CPU weights go to the GPU's pinned host buffer: token_embd + 3 experts
    no_mmap = _gpu(s, n_gpu_layers=-1, n_cpu_moe=1, mmap=False)
    assert no_mmap["CUDA_Host"] == 192576 + 3 * expert == 505920


def test_cuda_pads_quantized_rows_to_512(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-q4_0"]
    # output.weight Q4_0 160 x 1003 = 90270 B, plus one row of 512 - 160 = 352 elements (11 blocks * 18 B = 198)
    # -> 90468, padded to 128 -> 90496; plus output_norm 160 f32 = 640
    assert _gpu(s, n_gpu_layers=1)["CUDA0"] == 90496 + 640


def test_repack_copies_q4_0_matrices_on_avx2_cpus(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-q4_0"]
    bufs = {b.name: b.bytes for b in place(s, LoadConfig(), X86_AVX2).buffers}
    # per layer q, o 14400 + k, v 2880 + gate, up, down 37440 (all ne[1] % 8 == 0); output.weight has
    # ne[1] = 1003 (not a multiple of 8) and token_embd is a GET_ROWS weight: neither is repacked
    assert bufs["CPU_REPACK"] == 3 * (2 * 14400 + 2 * 2880 + 3 * 37440) == 440640
    # mapped span: token_embd .. the last norm of blk.2 (the repacked matrices inside it stay mapped too)
    norm = s.tensor("blk.2.ffn_norm.weight")
    te = s.tensor("token_embd.weight")
    assert norm is not None and te is not None
    assert bufs["CPU_Mapped"] == norm.end - te.offset
    assert "CPU_REPACK" not in {b.name for b in place(s, LoadConfig(), rule_table(())).buffers}
    # with a GPU in the list, CPU weights take its host buffer type first (then plain CPU under mmap)
    assert "CPU_REPACK" not in _gpu(s, n_gpu_layers=0)


def test_kv_follows_the_layer_device(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-gqa"]
    p = price(s, LoadConfig(n_ctx=1024, n_parallel=1, devices=("CUDA0",), n_gpu_layers=2), host=X86_AVX512)
    per_layer = 2 * 64 * 1024  # K + V, 32 f16 per cell
    cpu, gpu = p.footprint.device("CPU"), p.footprint.device("CUDA0")
    assert cpu is not None and gpu is not None
    assert (cpu.context.bytes, gpu.context.bytes) == (2 * per_layer, per_layer)
    assert gpu.output.bytes == 0 and cpu.output.bytes == 1003 * 4


def test_two_gpus_split_layers_evenly(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-gqa"]
    p = place(s, LoadConfig(devices=("CUDA0", "CUDA1"), n_gpu_layers=-1), X86_AVX512)
    # 4 offloaded layers over split points [0.5, 1.0]: il/4 = 0, .25 -> CUDA0; .5, .75 (output) -> CUDA1
    assert p.layer_device == ("CUDA0", "CUDA0", "CUDA1") and p.output_device == "CUDA1"
