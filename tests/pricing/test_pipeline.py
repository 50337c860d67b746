"""The dry run's pinned-norm copies on a device that takes over from another (pricing/pipeline): priced off the
dry-run figure only where llama.cpp runs the pipeline (4 copies), said in a note where it does not, and never where
the previous layer is on the CPU."""

from __future__ import annotations

from fitevict.pricing.gguf import GgufStructure
from fitevict.pricing.hostbufs import rule_table
from fitevict.pricing.kv import resolve_context
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.pipeline import GGML_SCHED_MAX_COPIES, dry_run_excess, pipeline_copies
from fitevict.pricing.placement import place
from fitevict.pricing.price import price

HOST = rule_table(["avx2"])
EPS = ("127.0.0.1:50052", "127.0.0.1:50053")
TWO = LoadConfig(n_ctx=1024, n_parallel=1, devices=("RPC0", "RPC1"), rpc=EPS, n_gpu_layers=99,
                 tensor_split=(1.0, 3.0))


def _excess(s: GgufStructure, cfg: LoadConfig) -> tuple[dict[str, int], tuple[str, ...]]:
    pl = place(s, cfg, HOST)
    excess, notes = dry_run_excess(s, cfg, resolve_context(s, cfg), pl)
    return {e.device: e.bytes for e in excess}, notes


def test_the_second_device_of_a_pipeline_is_priced_without_the_norms_copies(
        structures: dict[str, GgufStructure]) -> None:
    """-ts 1,3 over two RPC devices, every layer offloaded: the pipeline runs with 4 copies, RPC1 takes over from
    RPC0 at one layer, and its dry-run compute holds 4 copies of that layer's norm (f32, n_embd x 512 tokens)."""
    s = structures["llama-gqa"]
    got, notes = _excess(s, TWO)
    norm = s.n_embd * 512 * 4
    assert got == {"RPC1": GGML_SCHED_MAX_COPIES * norm} and notes == ()
    dry = {"CPU": 8_000_000, "RPC0": 10_000_000, "RPC1": 13_000_000}
    p = price(s, TWO, compute=dry, host=HOST)
    compute = {d.name: d.compute for d in p.footprint.devices}
    assert compute["RPC1"].bytes == dry["RPC1"] - GGML_SCHED_MAX_COPIES * norm and compute["RPC1"].source == "dry-run"
    assert compute["RPC0"].bytes == dry["RPC0"] and compute["CPU"].bytes == dry["CPU"]
    assert any("pipeline copies" in w for w in p.warnings)


def test_without_the_pipeline_the_difference_is_noted_not_priced(structures: dict[str, GgufStructure]) -> None:
    """-nkvo, a tensor override or --n-cpu-moe turn the pipeline off (one copy): the norm is still moved in the dry
    run, but the allocator reuses its room; a note gives the bound."""
    s = structures["llama-moe"]
    for cfg in (TWO.with_(kv_offload=False), TWO.with_(tensor_overrides=(("output", "CPU"),)),
                TWO.with_(n_cpu_moe=1)):
        assert pipeline_copies(s, cfg, place(s, cfg, HOST)) == 1
        got, notes = _excess(s, cfg)
        assert got == {} and len(notes) == 1 and "RPC1" in notes[0]


def test_no_excess_after_the_cpu_or_where_the_norm_is_not_pinned(structures: dict[str, GgufStructure]) -> None:
    """One device after the CPU layers: the scheduler never expands from the CPU, so the norm lands on the device in
    both. Two devices, some layers on the CPU, a 512-token ubatch: graph_get_cb pins nothing. The same placement
    with a 16-token ubatch pins the norms again (the pipeline stays off: not every layer is offloaded)."""
    s = structures["llama-gqa"]
    one = LoadConfig(n_ctx=1024, n_parallel=1, devices=("RPC0",), rpc=EPS[:1], n_gpu_layers=2)
    assert _excess(s, one) == ({}, ())
    partial = TWO.with_(n_gpu_layers=3, tensor_split=(1.0, 2.0))
    assert place(s, partial, HOST).layer_device == ("CPU", "RPC0", "RPC1")  # RPC1 takes over at layer 2
    assert _excess(s, partial) == ({}, ())
    got, notes = _excess(s, partial.with_(n_ubatch=16))
    assert got == {} and len(notes) == 1 and "layer 2" in notes[0]


def test_every_device_that_takes_over_sheds_its_own_copies(structures: dict[str, GgufStructure]) -> None:
    """Three devices, -ts 1,1,2 over gemma2's 4 layers and output: RPC1 and RPC2 each take over once (seen on three real
    rpc-servers: each then priced within 1 % of its load), RPC0 follows the CPU."""
    s = structures["gemma2-swa"]
    cfg = TWO.with_(devices=("RPC0", "RPC1", "RPC2"), rpc=(*EPS, "127.0.0.1:50054"), tensor_split=(1.0, 1.0, 2.0))
    assert place(s, cfg, HOST).layer_device == ("RPC0", "RPC0", "RPC1", "RPC2")
    norm = s.n_embd * 512 * 4
    assert _excess(s, cfg) == ({"RPC1": GGML_SCHED_MAX_COPIES * norm, "RPC2": GGML_SCHED_MAX_COPIES * norm}, ())
