"""A llama-server command line read into a LoadConfig, in the pinned build's spelling."""

from __future__ import annotations

import pytest

from fitevict.pricing.cmdline import parse_server_argv
from fitevict.pricing.gguf import PricingError
from fitevict.pricing.loadconfig import LoadConfig


def test_full_command_line() -> None:
    cmd = parse_server_argv([
        "/opt/bin/llama-server", "-m", "x.gguf", "-c", "4096", "-np", "3", "-ngl", "20", "--n-cpu-moe", "2",
        "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on", "-ub", "256", "-b", "1024", "-lm", "none", "-kvu",
        "--swa-full", "-dev", "CUDA0,CUDA1", "--port", "8080", "--jinja",
    ])
    assert cmd.model == "x.gguf"
    assert cmd.config == LoadConfig(
        n_ctx=4096, n_parallel=3, n_gpu_layers=20, n_cpu_moe=2, cache_type_k="q8_0", cache_type_v="q8_0",
        flash_attn="on", n_ubatch=256, n_batch=1024, mmap=False, kv_unified=True, swa_full=True,
        devices=("CUDA0", "CUDA1"),
    )
    assert cmd.warnings == ()


def test_defaults_long_spellings_and_unknown_flags() -> None:
    cmd = parse_server_argv(["--model=y.gguf", "--ctx-size", "0", "--load-mode", "mmap", "--frobnicate", "7"])
    assert cmd.config == LoadConfig(n_ctx=0)
    assert cmd.config.n_parallel is None  # no -np: the engine's 4 unified slots
    assert any("--frobnicate" in w for w in cmd.warnings)
    assert parse_server_argv(["-m", "z.gguf", "-dev", "none"]).config.devices == ()


@pytest.mark.parametrize("argv, match", [
    (["-c", "4096"], "no -m"),
    (["-m", "x.gguf", "-ctk", "q9_9"], "not a cache type"),
    (["-m", "x.gguf", "-c", "lots"], "not a whole number"),
    (["-m", "x.gguf", "-fa"], "needs a value"),
])
def test_bad_command_lines(argv: list[str], match: str) -> None:
    with pytest.raises(PricingError, match=match):
        parse_server_argv(argv)


# --- one rule both ways: a LoadConfig written as argv by the seat's builder reads back as the same LoadConfig --------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fitevict.engines.llama_cpp.server import load_args  # noqa: E402


@st.composite
def load_configs(draw) -> LoadConfig:
    devices, rpc = draw(st.sampled_from([((), ()), (("CUDA0",), ()), (("CUDA0", "CUDA1"), ()),
                                         (("Vulkan0",), ()), (("RPC0",), ("127.0.0.1:50052",)),
                                         (("RPC0", "RPC1"), ("127.0.0.1:50052", "10.0.0.2:50053"))]))
    n_parallel = draw(st.none() | st.integers(1, 8))
    overrides = tuple(draw(st.lists(st.tuples(st.sampled_from(["exps", r"blk\.1\.", "ffn_up"]),
                                              st.sampled_from(["CPU", *devices])), max_size=2)))
    return LoadConfig(
        n_ctx=draw(st.sampled_from([0, 512, 1000, 4096])), n_parallel=n_parallel,
        kv_unified=draw(st.none() | st.booleans()) if n_parallel is not None else None,
        n_gpu_layers=draw(st.integers(-1, 40)) if devices else 0, n_cpu_moe=draw(st.integers(0, 4)),
        cache_type_k=draw(st.sampled_from(["f16", "q8_0", "q4_0"])), cache_type_v=draw(st.sampled_from(["f16", "q8_0"])),
        flash_attn=draw(st.sampled_from(["auto", "on", "off"])), n_batch=draw(st.sampled_from([512, 2048])),
        n_ubatch=draw(st.sampled_from([128, 512])), mmap=draw(st.booleans()), swa_full=draw(st.booleans()),
        devices=devices, tensor_overrides=overrides, embeddings=draw(st.booleans()),
        loras=tuple(draw(st.lists(st.sampled_from(["/a/x.gguf", "/b/y.gguf"]), max_size=2, unique=True))),
        tensor_split=(tuple(float(x) for x in draw(st.lists(st.integers(1, 40), min_size=2, max_size=2)))
                      if len(devices) == 2 and draw(st.booleans()) else ()),
        repack=draw(st.booleans()), rpc=rpc, kv_offload=draw(st.booleans()) if devices else True,
    )


@settings(max_examples=300, deadline=None)
@given(load_configs())
def test_the_argv_builder_and_the_parser_are_one_rule(cfg: LoadConfig) -> None:
    argv = load_args("/models/x.gguf", cfg, ["--pooling", "mean"] if cfg.embeddings else [])
    back = parse_server_argv(argv)
    assert back.model == "/models/x.gguf"
    assert back.config == cfg, (argv, back.config)


def test_flash_attn_values_are_spelt_once() -> None:
    from typing import get_args

    from fitevict.config.records import FLASH_ATTN
    from fitevict.pricing.flags import FLASH_ATTN_VALUES
    from fitevict.pricing.loadconfig import FlashAttn

    assert get_args(FlashAttn) == FLASH_ATTN_VALUES == FLASH_ATTN


def test_rpc_endpoints_and_kv_offload_read_as_llama_server_reads_them() -> None:
    """--rpc (a comma list, before -dev so the engine has named RPC0, RPC1 when -dev reads them) and -nkvo."""
    cfg = LoadConfig(n_ctx=1024, devices=("RPC0", "RPC1"), rpc=("127.0.0.1:50052", "127.0.0.1:50053"),
                     n_gpu_layers=99, tensor_split=(1.0, 3.0), kv_offload=False)
    argv = load_args("/m.gguf", cfg)
    assert argv.index("--rpc") < argv.index("-dev") and "-nkvo" in argv
    assert parse_server_argv(argv).config == cfg
    back = parse_server_argv(["-m", "x.gguf", "--rpc", "127.0.0.1:1", "--rpc", "h:2", "-dev", "RPC0", "-ngl", "9",
                              "--no-kv-offload"]).config
    assert back.rpc == ("127.0.0.1:1", "h:2") and not back.kv_offload
    with pytest.raises(PricingError, match="HOST:PORT"):
        parse_server_argv(["-m", "x.gguf", "--rpc", "127.0.0.1"])
