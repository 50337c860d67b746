"""A tiny reranker for the zoo: a BERT-style cross-encoder (``bert``, not causal) with a classifier head and
``pooling_type`` rank, on the real BERT vocabulary the engine's source ships (``models/ggml-vocab-bert-bge.gguf``,
every ``tokenizer.*`` key copied verbatim), so llama-server serves it on ``/v1/rerank`` when started with
``--embeddings --pooling rank``. Random weights (fixed seeds), f32 throughout; the scores mean nothing, their shape
and their order per document are the engine's.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import gguf
import numpy as np

NAME = "bert-rerank"
N_EMBD, N_FF, N_HEAD, N_LAYER, N_CTX = 64, 128, 4, 2, 512
POOLING_RANK = 4  # llama_pooling_type: LLAMA_POOLING_TYPE_RANK
VOCAB = Path("models") / "ggml-vocab-bert-bge.gguf"  # in the engine's llama.cpp source


class RerankZooError(RuntimeError):
    """The engine's source, with its BERT vocabulary, is not there to copy from."""


Spec = tuple[str, tuple[int, ...], str]  # (name, numpy shape: ggml's ne reversed, kind)


def _linear(name: str, n_out: int, n_in: int) -> list[Spec]:
    return [(f"{name}.weight", (n_out, n_in), "weight"), (f"{name}.bias", (n_out,), "zeros")]


def _norm(name: str) -> list[Spec]:
    return [(f"{name}.weight", (N_EMBD,), "ones"), (f"{name}.bias", (N_EMBD,), "zeros")]


def _tensors(n_vocab: int) -> list[Spec]:
    """BERT's tensors as llama.cpp's ``bert`` loader names them, with the classifier head a reranker has."""
    e = N_EMBD
    out: list[Spec] = [("token_embd.weight", (n_vocab, e), "weight"), ("token_types.weight", (2, e), "weight"),
                       ("position_embd.weight", (N_CTX, e), "weight"), *_norm("token_embd_norm")]
    for il in range(N_LAYER):
        p = f"blk.{il}."
        out += [*_linear(p + "attn_q", e, e), *_linear(p + "attn_k", e, e), *_linear(p + "attn_v", e, e),
                *_linear(p + "attn_output", e, e), *_norm(p + "attn_output_norm"),
                *_linear(p + "ffn_up", N_FF, e), *_linear(p + "ffn_down", e, N_FF), *_norm(p + "layer_output_norm")]
    return out + [*_linear("cls", e, e), *_linear("cls.output", 1, e)]


def _data(name: str, shape: tuple[int, ...], kind: str) -> np.ndarray:
    if kind == "ones":
        return np.ones(shape, np.float32)
    if kind == "zeros":
        return np.zeros(shape, np.float32)
    rng = np.random.default_rng(zlib.crc32(f"{NAME}/{name}".encode()))
    return (rng.standard_normal(shape) * 0.02).astype(np.float32)


def _copy_tokenizer(w: gguf.GGUFWriter, vocab: Path) -> int:
    """Every ``tokenizer.*`` key of the engine's vocabulary file, verbatim; returns the vocabulary's size."""
    reader = gguf.GGUFReader(vocab)
    n_vocab = 0
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        value = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(field.name, value)
            if field.name == "tokenizer.ggml.tokens":
                n_vocab = len(value)
        else:
            w.add_key_value(field.name, value, vtype)
    return n_vocab


def write_reranker(dest: Path, source: Path) -> Path:
    """Write ``<dest>/bert-rerank.gguf`` (atomically) and return its path; an existing file is kept. ``source``:
    the engine's llama.cpp source (``vendor/llama.cpp`` of its sdist), whose BERT vocabulary it copies."""
    vocab = Path(source) / VOCAB
    if not vocab.is_file():
        raise RerankZooError(f"the BERT vocabulary {vocab} is missing: the reranker copies it from the engine's "
                             "source; run `fitevict engine install llama.cpp`")
    path = Path(dest) / f"{NAME}.gguf"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    w = gguf.GGUFWriter(tmp, "bert")
    try:
        _model(w, vocab)
        for write in (w.write_header_to_file, w.write_kv_data_to_file, w.write_tensors_to_file):
            write()
    finally:
        w.close()
    os.replace(tmp, path)
    return path


def _model(w: gguf.GGUFWriter, vocab: Path) -> None:
    """The reranker's keys (BERT's, not causal, rank pooling), the vocabulary's, and its tensors."""
    w.add_name("fitevict zoo reranker")
    w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    for key, value in (("context_length", N_CTX), ("embedding_length", N_EMBD), ("feed_forward_length", N_FF),
                       ("block_count", N_LAYER), ("attention.head_count", N_HEAD), ("pooling_type", POOLING_RANK)):
        w.add_uint32(f"bert.{key}", value)
    w.add_float32("bert.attention.layer_norm_epsilon", 1e-12)
    w.add_bool("bert.attention.causal", False)
    n_vocab = _copy_tokenizer(w, vocab)
    for name, shape, kind in _tensors(n_vocab):
        w.add_tensor(name, _data(name, shape, kind))
