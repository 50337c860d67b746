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
