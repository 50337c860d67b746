"""Metadata at the speed of the disk: a 150k-entry vocabulary with its merges is read without building a Python
object per string (the engine's own vocabulary files; ``gguf.GGUFReader``, which builds them, took 20 s on such a
file). The speed itself is measured in docs/benchmarks.md (``bench/lifesize_metadata.py``), never asserted here: this
fails when reading builds an object per string, by the memory the read allocates (``tracemalloc``), which does not
depend on how busy the machine is."""

from __future__ import annotations

import sys
import tracemalloc
from pathlib import Path

import pytest

from fitevict.engines.llama_cpp.install import source_dir
from fitevict.pricing.gguf import parse_structure
from fitevict.pricing.gguf_header import read_header


@pytest.fixture(scope="module")
def qwen2_vocab(llama_server: Path) -> Path:
    p = source_dir() / "models" / "ggml-vocab-qwen2.gguf"
    if not p.is_file():
        pytest.skip(f"{p} is missing: the engine's source was not unpacked (fitevict engine install llama.cpp)")
    return p


def test_a_150k_vocabulary_with_its_merges_is_read_without_an_object_per_string(qwen2_vocab: Path) -> None:
    h = read_header(qwen2_vocab)
    assert h.array_len("tokenizer.ggml.tokens") == 151936 and h.array_len("tokenizer.ggml.merges") > 150_000
    assert h.fields["tokenizer.ggml.tokens"].value is None  # counted, never built
    entries = h.array_len("tokenizer.ggml.tokens") + h.array_len("tokenizer.ggml.merges")
    tracemalloc.start()
    try:
        s = parse_structure(qwen2_vocab)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert s.n_vocab == 151936 and s.n_merges == h.array_len("tokenizer.ggml.merges")
    # beyond the file's own bytes, less than one empty str per entry: a str per string would take at least that
    beyond = peak - qwen2_vocab.stat().st_size
    assert beyond < entries * sys.getsizeof(""), f"reading {qwen2_vocab.name} allocated {peak:,} B at its peak"
