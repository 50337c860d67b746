"""Several GPUs split the offloaded layers as llama.cpp does: by free memory by default, or by -ts."""

from __future__ import annotations

from fitevict.engines.llama_cpp.dryrun import server_args
from fitevict.pricing.footprint import HOST, Term
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.hostbufs import rule_table
from fitevict.pricing.placement import default_split, layer_devices, split_points
from fitevict.pricing.price import price
from fitevict.units import GiB


X86_AVX512 = rule_table({"avx2", "avx512f"})  # a fixed CPU (AVX-512, no AMX): these figures hold on any machine

TWO = ("CUDA0", "CUDA1")


def test_even_weights_split_evenly_and_the_output_goes_last() -> None:
    layers, out = layer_devices(7, 99, TWO)  # 8 offloaded (7 blocks + output): 4 and 4
    assert layers == ("CUDA0",) * 4 + ("CUDA1",) * 3 and out == "CUDA1"


def test_free_memory_weights_the_split() -> None:
    # 60 GiB free on CUDA0, 20 GiB on CUDA1: split point 0.75 -> layers at fractions < 0.75 go to CUDA0
    layers, out = layer_devices(7, 99, TWO, default_split(TWO, {"CUDA0": 60 * GiB, "CUDA1": 20 * GiB}))
    assert layers == ("CUDA0",) * 6 + ("CUDA1",) and out == "CUDA1"
    # a partial offload: -ngl 4 puts blocks 4..6 and the output on the GPUs, 3 of the 4 on CUDA0
    layers, out = layer_devices(7, 4, TWO, (3.0, 1.0))
    assert layers == (HOST,) * 4 + ("CUDA0",) * 3 and out == "CUDA1"


def test_split_points_are_float32_like_llama_cpp() -> None:
    # sizes near 2**35 are not exact in float32; the split points are computed after the same rounding
    pts = split_points((float(34359738367), float(34359738369)))
    assert pts[-1] == 1.0 and pts[0] == 0.5
    assert default_split(TWO, {"CUDA0": 1}) == ()  # a device whose free memory is unknown: no split to give


def test_priced_buffers_follow_the_split_and_the_argv_carries_it(zoo: dict) -> None:
    path = zoo["llama-medium"].path  # 8 blocks
    s = load_structure(path)
    even = price(s, LoadConfig(n_ctx=512, n_gpu_layers=-1, devices=TWO), host=X86_AVX512)
    skew = price(s, LoadConfig(n_ctx=512, n_gpu_layers=-1, devices=TWO, tensor_split=(3.0, 1.0)), host=X86_AVX512)
    e0, e1 = (even.footprint.device(d).model.bytes for d in TWO)  # type: ignore[union-attr]
    k0, k1 = (skew.footprint.device(d).model.bytes for d in TWO)  # type: ignore[union-attr]
    assert k0 > e0 and k1 < e1 and k0 + k1 == e0 + e1  # same weights, moved toward CUDA0
    args = server_args(path, LoadConfig(devices=TWO, tensor_split=(float(60 * GiB), float(20 * GiB))))
    assert args[args.index("-ts") + 1] == f"{60 * GiB},{20 * GiB}"
    assert "-ts" not in server_args(path, LoadConfig(devices=("CUDA0",), tensor_split=(1.0,)))


def test_lfm2_final_norm_goes_with_the_output_layer(zoo: dict) -> None:
    """lfm2 names its output norm token_embd_norm (LLM_TENSOR_OUTPUT_NORM_LFM2, an output-layer tensor): with only the
    output offloaded (-ngl 1) it sits on the GPU with the output, not with layer 0 on the CPU."""
    from fitevict.pricing.placement import place

    s = load_structure(zoo["lfm2-shortconv"].path)
    pl = place(s, LoadConfig(n_ctx=512, n_gpu_layers=1, devices=("CUDA0",)), rule_table({"avx2", "avx512f"}))
    assert dict(pl.tensor_buffer)["token_embd_norm.weight"] == "CUDA0"
    bloom = load_structure(zoo["bloom-alibi"].path)  # bloom's token_embd_norm is a first-layer tensor
    assert dict(place(bloom, LoadConfig(n_ctx=512, n_gpu_layers=1, devices=("CUDA0",)), rule_table(())).tensor_buffer)[
        "token_embd_norm.weight"] != "CUDA0"


def test_a_cpu_dry_runs_caches_price_any_placement(zoo: dict, tmp_path) -> None:
    """An architecture without KV rules: the caches one dry run sized (per layer) follow this placement's layers,
    so a GPU placement is priced from a CPU dry run of the same configuration."""
    from fitevict.pricing.logparse import DryCache, DryContext
    from fitevict.zoo import rewrite_arch

    path = rewrite_arch(zoo["llama-gqa"].path, tmp_path / "xverse.gguf", "xverse")
    s = load_structure(path)
    assert s.unsupported
    cpu_cfg = LoadConfig(n_ctx=1024, n_parallel=1)
    per_layer = 2 * 1024 * 32 * 2  # K + V of 2 heads x 16, f16, 1024 cells
    dry = DryContext((DryCache("full", 3 * per_layer, 3 * per_layer // 2, 1024, 1,
                               tuple((il, "CPU") for il in range(3))),))
    gpu_cfg = cpu_cfg.with_(devices=("CUDA0",), n_gpu_layers=2)  # output + block 2 on the GPU
    assert gpu_cfg.without_placement() == cpu_cfg
    fp = price(s, gpu_cfg, context=dry, host=X86_AVX512).footprint
    assert fp.device("CUDA0").context == Term(per_layer, "dry-run")  # type: ignore[union-attr]
    assert fp.device(HOST).context.bytes == 2 * per_layer  # type: ignore[union-attr]
