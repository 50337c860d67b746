"""Life-size prices against the engine's own allocations, to the byte: a 151,936-entry vocabulary (qwen2), the
262,144-entry one with a sliding window (gemma-3-1b) and an encoder, which has no context memory at all (bge, BERT).
Each is started with the allocator traced and stopped once its compute buffer is reserved."""

from __future__ import annotations

from pathlib import Path

import pytest

from fitevict.engines.llama_cpp.dryrun import Unavailable, capture_load_log, dry_run_compute
from fitevict.engines.llama_cpp.install import source_dir
from fitevict.engines.llama_cpp.machine import host_buffers
from fitevict.pricing.buftrace import parse_exact_log
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.logparse import PRECISION_BYTES
from fitevict.pricing.price import price
from fitevict.zoo.lifesize import vocab_file, write_life_size

pytestmark = pytest.mark.e2e

CASES = {
    "qwen2.5-0.5b": LoadConfig(n_ctx=8192, n_parallel=1),
    "gemma-3-1b": LoadConfig(n_ctx=8192, n_parallel=2),
    "bge-small-en-v1.5": LoadConfig(n_ctx=512, n_parallel=1, embeddings=True),
}


@pytest.fixture(scope="module")
def life_size(llama_server: Path) -> dict[str, Path]:
    src = source_dir()
    if not vocab_file(src, "qwen2").is_file():
        pytest.fail(f"no engine source at {src}. Run: fitevict engine install llama.cpp")
    return {w.model.name: w.model.path for w in write_life_size(src, only=list(CASES))}


@pytest.mark.parametrize("name", list(CASES))
def test_life_size_price_is_the_engines_allocation(life_size: dict[str, Path], engine_bin_dir: Path,
                                                   name: str) -> None:
    path, cfg = life_size[name], CASES[name]
    compute = dry_run_compute(engine_bin_dir, path, cfg)
    assert not isinstance(compute, Unavailable), compute.reason
    p = price(load_structure(path), cfg, compute=compute, host=host_buffers())
    cap = capture_load_log(engine_bin_dir, path, cfg, exact=True)
    assert cap.ok, f"{name}: {cap.reason}\n" + "\n".join(cap.text.splitlines()[-15:])
    log = parse_exact_log(cap.text)
    assert log.precision_bytes == 0, log.notes
    assert dict(log.model_buffers) == {b.name: b.bytes for b in p.buffers}
    kv = p.kv
    assert kv is not None
    assert [n for _, n in log.kv_lines] == [kv.bytes_of(k) for k in ("full", "swa") if kv.bytes_of(k)]
    cpu, measured = p.footprint.device("CPU"), log.to_footprint().device("CPU")
    assert cpu is not None and measured is not None
    assert measured.context.bytes == cpu.context.bytes
    if name.startswith("bge"):  # an encoder: llama.cpp makes no memory for it and logs no cache line; the log's
        assert cpu.context.bytes == 0 and not log.kv_lines and log.arch == "bert"  # arch says none is due
    assert measured.output.bytes == p.output_at_load  # an embeddings seat's price holds what its first batch grows
    if not cfg.embeddings:
        assert cpu.output.bytes == p.output_at_load
    assert cpu.compute.bytes is not None and measured.compute.bytes is not None
    assert abs(cpu.compute.bytes - measured.compute.bytes) <= PRECISION_BYTES
