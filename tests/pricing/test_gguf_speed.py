"""Metadata at the speed of the disk: a 150k-entry vocabulary with its merges is read in well under a second
(the engine's own vocabulary files; ``gguf.GGUFReader`` took 20 s on such a file). The figures themselves are in
docs/benchmarks.md (``bench/lifesize_metadata.py``); this only fails when reading falls back to building a Python
object per string."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fitevict.engines.install import source_dir
from fitevict.pricing.gguf import parse_structure
from fitevict.pricing.gguf_header import read_header


@pytest.fixture(scope="module")
def qwen2_vocab(llama_server: Path) -> Path:
    p = source_dir() / "models" / "ggml-vocab-qwen2.gguf"
    if not p.is_file():
        pytest.skip(f"{p} is missing: the engine's source was not unpacked (fitevict engine install llama.cpp)")
    return p


def test_a_150k_vocabulary_with_its_merges_reads_in_under_a_second(qwen2_vocab: Path) -> None:
    h = read_header(qwen2_vocab)
    assert h.array_len("tokenizer.ggml.tokens") == 151936 and h.array_len("tokenizer.ggml.merges") > 150_000
    assert h.fields["tokenizer.ggml.tokens"].value is None  # counted, never built
    t = time.perf_counter()
    s = parse_structure(qwen2_vocab)
    took = time.perf_counter() - t
    assert s.n_vocab == 151936 and s.n_merges == h.array_len("tokenizer.ggml.merges")
    assert took < 1.0, f"reading {qwen2_vocab.name} took {took:.2f} s"
