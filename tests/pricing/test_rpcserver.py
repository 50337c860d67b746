"""An RPC device's rpc-server parts beyond the engine's buffers (pricing/rpcserver): its CPU backend's work buffer and
the largest input a ubatch sends it, joined to the device's figure. Against a real rpc-server through a filled
context: tests/e2e/test_rpc_filled.py."""

from __future__ import annotations

from fitevict.pricing.footprint import HOST
from fitevict.pricing.gguf import GgufStructure
from fitevict.pricing.hostbufs import NO_EXTRAS
from fitevict.pricing.kv import resolve_context
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.placement import place
from fitevict.pricing.price import price
from fitevict.pricing.process import work_buffer
from fitevict.pricing.rpcserver import input_message, rpc_server_parts, server_terms, with_rpc_servers
from fitevict.prices.overhead import with_engine_overhead

EP = ("127.0.0.1:50052",)


def _rpc(**kw: object) -> LoadConfig:
    return LoadConfig(**{"n_ctx": 2048, "n_parallel": 1, "devices": ("RPC0",), "rpc": EP, "n_gpu_layers": 99,
                         **kw})  # type: ignore[arg-type]


def test_the_server_runs_the_devices_layers_on_the_cpu_backends_work_buffer(
        structures: dict[str, GgufStructure]) -> None:
    """Every layer on RPC0: the rpc-server's CPU backend converts the same activations a CPU-only seat would (one
    thread, weights in its plain buffers): the same work buffer."""
    s = structures["llama-q4_0"]  # quantized: the activations are converted to Q8_0
    cpu = LoadConfig(n_ctx=2048, n_parallel=1, repack=False)
    rc = resolve_context(s, cpu)
    alone = work_buffer(s, rc, place(s, cpu, NO_EXTRAS), n_threads=1, tiled=True, cells=rc.n_ctx_seq)
    work = next(t for t in server_terms(s, _rpc(), place(s, _rpc(), NO_EXTRAS), "RPC0") if t.name == "work buffer")
    assert work.bytes == alone > 0


def test_the_largest_input_is_the_mask_or_the_activations(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-gqa"]
    tokens = 512  # n_ubatch
    on = input_message(s, _rpc(flash_attn="on"), place(s, _rpc(flash_attn="on"), NO_EXTRAS), "RPC0")
    off = input_message(s, _rpc(flash_attn="off"), place(s, _rpc(flash_attn="off"), NO_EXTRAS), "RPC0")
    assert on == max(2048 * tokens * 2, s.n_embd * tokens * 4)  # the f16 mask under flash attention
    assert off == 2048 * tokens * 4  # else an f32 mask
    none = _rpc(n_gpu_layers=0)
    assert input_message(s, none, place(s, none, NO_EXTRAS), "RPC0") == 0  # no layer there: nothing sent


def test_the_server_parts_join_the_devices_figure_and_stay_beside_the_engines_overhead(
        structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-gqa"]
    cfg = _rpc()
    fp = price(s, cfg, host=NO_EXTRAS).footprint
    parts = rpc_server_parts(s, cfg, place(s, cfg, NO_EXTRAS))
    n = sum(t.bytes for t in parts["RPC0"])
    with_server = with_rpc_servers(fp, parts)
    assert with_server.bytes_on("RPC0") == fp.bytes_on("RPC0") + n and n > 0
    assert with_server.bytes_on(HOST) == fp.bytes_on(HOST)
    both = with_engine_overhead(with_server, {HOST: 1 << 20})
    assert both.bytes_on("RPC0") == with_server.bytes_on("RPC0")
    assert both.bytes_on(HOST) == fp.bytes_on(HOST) + (1 << 20)
