"""Parsing llama-server's load log (-lv 4). The excerpts are real lines from the pinned build."""

from __future__ import annotations

from fitevict.pricing.logparse import parse_load_log
from fitevict.units import MiB

SWA_LOG = """\
0.00.009.508 I common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
0.00.009.535 I common_memory_breakdown_print: |   - Host               |                    2 =     0 +       0 +       0                |
0.00.011.417 I load_tensors: loading model tensors, this can take a while... (load_mode = mmap)
0.00.011.955 I load_tensors:   CPU_Mapped model buffer size =     0.84 MiB
0.00.012.270 I llama_context: n_seq_max             = 2
0.00.012.270 I llama_context: n_ctx                 = 1024
0.00.012.271 I llama_context: n_ctx_seq             = 512
0.00.012.272 I llama_context: n_batch               = 512
0.00.012.272 I llama_context: n_ubatch              = 128
0.00.012.274 I llama_context: flash_attn            = auto
0.00.012.274 I llama_context: kv_unified            = false
0.00.012.286 I llama_context:        CPU  output buffer size =     0.01 MiB
0.00.012.288 I llama_kv_cache_iswa: creating non-SWA KV cache, size = 512 cells
0.00.012.333 I llama_kv_cache:        CPU KV buffer size =     0.38 MiB
0.00.012.702 I llama_kv_cache: size =    0.38 MiB (   512 cells,   2 layers,  2/2 seqs), K (f16):    0.19 MiB, V (f16):    0.19 MiB
0.00.012.705 I llama_kv_cache_iswa: creating     SWA KV cache, size = 256 cells
0.00.012.739 I llama_kv_cache:        CPU KV buffer size =     0.19 MiB
0.00.012.898 I llama_kv_cache: size =    0.19 MiB (   256 cells,   2 layers,  2/2 seqs), K (f16):    0.09 MiB, V (f16):    0.09 MiB
0.00.014.060 I resolve_fused_ops: Flash Attention enabled
0.00.015.026 I sched_reserve:        CPU compute buffer size =     0.67 MiB
"""

RS_LOG = """\
0.00.008.512 I load_tensors: loading model tensors, this can take a while... (load_mode = mmap)
0.00.009.268 I load_tensors:   CPU_Mapped model buffer size =     0.89 MiB
0.00.009.528 I llama_context: n_seq_max             = 4
0.00.009.542 I llama_context:        CPU  output buffer size =     0.02 MiB
0.00.009.558 I llama_memory_recurrent:        CPU RS buffer size =     0.11 MiB
0.00.009.563 I llama_memory_recurrent: size =    0.11 MiB (     4 cells,   2 layers,  4 seqs  0 rs_seq), R (f32):    0.02 MiB, S (f32):    0.09 MiB, P (f32):    0.00 MiB
0.00.011.093 I sched_reserve:        CPU compute buffer size =     2.50 MiB
"""

REPACK_LOG = """\
0.00.011.902 I load_tensors: loading model tensors, this can take a while... (load_mode = mmap)
0.00.013.652 I load_tensors:   CPU_Mapped model buffer size =     0.49 MiB
0.00.013.730 I load_tensors:   CPU_REPACK model buffer size =     0.42 MiB
0.00.014.335 I llama_context:        CPU  output buffer size =     0.02 MiB
0.00.014.368 I llama_kv_cache:        CPU KV buffer size =     0.38 MiB
0.00.016.147 I sched_reserve:        CPU compute buffer size =     4.70 MiB
0.00.206.952 I common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
0.00.206.994 I common_memory_breakdown_print: |   - Host               |                    5 =     0 +       0 +       4                |
0.00.207.010 I common_memory_breakdown_print: |   - CPU_REPACK         |                    0 =     0 +       0 +       0                |
"""


def _mib(x: float) -> int:
    return round(x * MiB)


def test_swa_log_cells_and_buffers() -> None:
    log = parse_load_log(SWA_LOG)
    assert (log.kv_cells, log.kv_cells_swa, log.kv_streams, log.kv_seqs) == (512, 256, 2, 2)
    assert log.kv_layers == 4  # 2 base + 2 SWA
    assert log.kv_lines == (("CPU", _mib(0.38)), ("CPU", _mib(0.19)))
    assert (log.n_ctx, log.n_ctx_seq, log.n_seq_max, log.n_batch, log.n_ubatch) == (1024, 512, 2, 512, 128)
    assert log.kv_unified is False and log.flash_attn == "auto" and log.flash_attn_resolved is True
    fp = log.to_footprint()
    cpu = fp.device("CPU")
    assert cpu is not None
    assert (cpu.model.bytes, cpu.context.bytes, cpu.compute.bytes, cpu.output.bytes) == (
        _mib(0.84), _mib(0.38) + _mib(0.19), _mib(0.67), _mib(0.01))
    assert {cpu.model.source, cpu.context.source, cpu.compute.source, cpu.output.source} == {"engine-reported"}
    assert fp.host_source == "engine-reported"  # the engine's own account, not a reading of the process
    assert fp.host_mapped_bytes == _mib(0.84)
    assert fp.host_committed_bytes == cpu.total_bytes - _mib(0.84)


def test_recurrent_state_is_context() -> None:
    log = parse_load_log(RS_LOG)
    assert log.rs_cells == 4 and log.kv_cells is None
    cpu = log.to_footprint().device("CPU")
    assert cpu is not None and cpu.context.bytes == _mib(0.11)


def test_repack_is_host_model_memory_and_committed() -> None:
    log = parse_load_log(REPACK_LOG)
    assert dict(log.model_buffers) == {"CPU_Mapped": _mib(0.49), "CPU_REPACK": _mib(0.42)}
    fp = log.to_footprint()
    assert fp.host_mapped_bytes == _mib(0.49)
    cpu = fp.device("CPU")
    assert cpu is not None and cpu.model.bytes == _mib(0.49) + _mib(0.42)
    assert dict(log.breakdown)["Host"] == (5, 0, 0, 4)


def test_missing_lines_are_unavailable_with_a_reason() -> None:
    cut = "\n".join(REPACK_LOG.splitlines()[:3])  # the load stopped after the weights
    cpu = parse_load_log(cut).to_footprint().device("CPU")
    assert cpu is not None and cpu.model.source == "engine-reported"
    for t in (cpu.context, cpu.compute, cpu.output):
        assert t.source == "unavailable" and t.bytes is None and t.reason
    empty = parse_load_log("srv  llama_server: model loaded\n")
    assert not empty.loaded
    fp = empty.to_footprint()
    assert fp.host_source == "unavailable" and fp.devices[0].model.source == "unavailable"


def test_gpu_buffers_count_on_their_device_and_pinned_host_on_the_cpu() -> None:
    text = """\
0.00.001 I load_tensors: loading model tensors, this can take a while... (load_mode = none)
0.00.002 I load_tensors:        CUDA0 model buffer size =   100.00 MiB
0.00.003 I load_tensors:    CUDA_Host model buffer size =    20.00 MiB
0.00.004 I llama_context:  CUDA_Host  output buffer size =     0.50 MiB
0.00.005 I llama_kv_cache:      CUDA0 KV buffer size =    64.00 MiB
0.00.006 I sched_reserve:      CUDA0 compute buffer size =   300.00 MiB
0.00.007 I sched_reserve:  CUDA_Host compute buffer size =    12.00 MiB
"""
    fp = parse_load_log(text).to_footprint()
    gpu, cpu = fp.device("CUDA0"), fp.device("CPU")
    assert gpu is not None and cpu is not None
    assert (gpu.model.bytes, gpu.context.bytes, gpu.compute.bytes, gpu.output.bytes) == (
        100 * MiB, 64 * MiB, 300 * MiB, 0)
    assert (cpu.model.bytes, cpu.compute.bytes, cpu.output.bytes) == (20 * MiB, 12 * MiB, MiB // 2)
    assert fp.host_mapped_bytes == 0


def test_dry_run_debug_lines_are_not_the_load() -> None:
    text = "0.00.001 D load_tensors:          CPU model buffer size =     0.00 MiB\n" + REPACK_LOG
    assert dict(parse_load_log(text).model_buffers) == {"CPU_Mapped": _mib(0.49), "CPU_REPACK": _mib(0.42)}
