"""Placement per device backend, from the rules a probe stores (pricing/backends): buffer names, host buffers,
alignment, and weights a device turns away. The rules here are records as the probe writes them; whether they are
the engine's own answers is checked against real rpc-servers and lavapipe in tests/engines/test_device_price.py."""

from __future__ import annotations


from dataclasses import replace

from fitevict.pricing.backends import BackendRules, op_context, weight_kind
from fitevict.pricing.footprint import HOST
from fitevict.pricing.gguf import GgufStructure
from fitevict.pricing.hostbufs import rule_table
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.logparse import device_aliases, device_of
from fitevict.pricing.placement import place
from fitevict.pricing.price import price

REPACK = rule_table(["avx2"])  # CPU_REPACK for Q4_0 (x86 with AVX2)
EPS = ("127.0.0.1:50052", "127.0.0.1:50053")


def test_two_rpc_servers_name_their_buffers_by_endpoint(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-gqa"]
    cfg = LoadConfig(n_ctx=1024, devices=("RPC0", "RPC1"), rpc=EPS, n_gpu_layers=99, tensor_split=(1.0, 1.0))
    pl = place(s, cfg, REPACK)
    names = {b.name: b.device for b in pl.buffers}
    assert names[f"RPC0[{EPS[0]}]"] == "RPC0" and names[f"RPC0[{EPS[1]}]"] == "RPC1"
    p = price(s, cfg, host=REPACK)
    assert {d.name for d in p.footprint.devices} == {HOST, "RPC0", "RPC1"}


def test_without_a_device_host_buffer_host_weights_take_the_cpus_extra_buffers(
        structures: dict[str, GgufStructure]) -> None:
    """RPC has no host buffer type: a Q4_0 weight kept on the host is repacked as on a CPU-only load; a CUDA device's
    host buffer (CUDA_Host) comes first in its list and takes it instead."""
    s = structures["llama-q4_0"]
    ot = ((r"blk\.0\.ffn_up", "CPU"),)
    rpc = place(s, LoadConfig(devices=("RPC0",), rpc=EPS[:1], n_gpu_layers=99, mmap=False, tensor_overrides=ot),
                REPACK)
    cuda = place(s, LoadConfig(devices=("CUDA0",), n_gpu_layers=99, mmap=False, tensor_overrides=ot), REPACK)
    assert dict(rpc.tensor_buffer)["blk.0.ffn_up.weight"] == "CPU_REPACK"
    assert dict(cuda.tensor_buffer)["blk.0.ffn_up.weight"] == "CUDA_Host"


def test_a_weight_the_device_cannot_run_stays_on_the_host(structures: dict[str, GgufStructure]) -> None:
    s = structures["mamba"]
    conv = next(t for t in s.tensors if t.name.endswith("ssm_conv1d.weight"))
    kind = weight_kind(conv.name, conv.ggml_type.name, conv.shape, op_context(s))
    learned = BackendRules("Vulkan", 64, 0, "Vulkan_Host", 64, 32, rejects=(kind,), source="probe")
    cfg = LoadConfig(devices=("Vulkan0",), n_gpu_layers=99)
    pl = place(s, cfg, REPACK, {"Vulkan0": learned})
    where = dict(pl.tensor_buffer)
    assert all(where[t.name] == "CPU_Mapped" for t in s.tensors if t.name.endswith("ssm_conv1d.weight"))
    assert pl.host_moved and any("cannot run" in w for w in pl.warnings)
    ungated = place(s, cfg, REPACK)
    assert sum(b.bytes for b in ungated.buffers if b.device == "Vulkan0") > \
        sum(b.bytes for b in pl.buffers if b.device == "Vulkan0")


def test_a_rejected_kind_is_kept_to_the_model_dimensions_its_op_was_tested_with(
        structures: dict[str, GgufStructure]) -> None:
    """The loader tests a mamba2 ``ssm_a`` ({1, n_head}) in an SSM_SCAN of the model's own state size: an answer
    learned on one model does not decide for a model whose SSM dimensions differ, even where the weight's type and
    shape agree."""
    s = structures["granitehybrid-moe"]
    a = next(t for t in s.tensors if t.name.endswith("ssm_a"))
    learned = {"Vulkan0": BackendRules("Vulkan", 64, 0, "Vulkan_Host", 64, 32, source="probe",
                                       rejects=(weight_kind(a.name, a.ggml_type.name, a.shape, op_context(s)),))}
    cfg = LoadConfig(devices=("Vulkan0",), n_gpu_layers=99, mmap=False)
    here = dict(place(s, cfg, REPACK, learned).tensor_buffer)
    assert here[a.name] == "CPU"  # Vulkan_Host is asked with the device's ops too: the CPU's own buffer takes it
    wider = replace(s, ssm_d_state=128)  # same tensors, another state size: another SSM_SCAN
    there = dict(place(wider, cfg, REPACK, learned).tensor_buffer)
    assert there[a.name] == "Vulkan0"


def test_vulkan_host_adds_its_bytes_and_nkvo_keeps_the_caches_home(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-gqa"]
    learned = {"Vulkan0": BackendRules("Vulkan", 64, 0, "Vulkan_Host", 64, 32, source="probe")}
    on = price(s, LoadConfig(n_ctx=1024, n_parallel=1, devices=("Vulkan0",), n_gpu_layers=99), host=REPACK,
               backends=learned)
    off = price(s, LoadConfig(n_ctx=1024, n_parallel=1, devices=("Vulkan0",), n_gpu_layers=99, kv_offload=False),
                host=REPACK, backends=learned)
    cpu = price(s, LoadConfig(n_ctx=1024, n_parallel=1), host=REPACK)
    assert on.footprint.device(HOST).output.bytes == cpu.footprint.device(HOST).output.bytes + 32  # type: ignore[union-attr]
    assert off.footprint.device("Vulkan0").context.bytes == 0  # type: ignore[union-attr]
    assert off.footprint.device(HOST).context.bytes == on.footprint.device("Vulkan0").context.bytes  # type: ignore[union-attr]


def test_the_log_names_which_rpc_device_a_buffer_is() -> None:
    log = "\n".join(f"llama_model_load_from_file_impl: using device RPC{i} ({ep}) (unknown id) - 24105 MiB free"
                    for i, ep in enumerate(EPS))
    aliases = device_aliases(log)
    assert device_of(f"RPC0[{EPS[1]}]", aliases) == "RPC1" and device_of(f"RPC0[{EPS[0]}]", aliases) == "RPC0"
    assert device_of("Vulkan_Host") == HOST and device_of(f"RPC0[{EPS[0]}]") != HOST
