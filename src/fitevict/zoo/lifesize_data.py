"""The life-size zoo's tensors: which ones (the demo zoo's layouts, BERT's own list), their types, and their bytes.

A large weight is written from a pool of 4 MiB of valid blocks made once per model and type from the model's
seed, each tensor starting at its own block (by its name's crc32) and wrapping round the pool: random enough for a
model whose answers mean nothing, and written at the speed of the disk. Q4_0 and Q8_0 blocks carry random quants and
a random f16 scale in a small finite range, chosen so that a weight's spread is about 0.02; F16 is normal * 0.02.
Small tensors (norms, biases, the MoE router, BERT's token types) are the demo zoo's own data (``tensor_data``).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import replace

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from fitevict.zoo.gguf_stream import Planned
from fitevict.zoo.lifesize_recipes import LifeSize
from fitevict.zoo.recipes import Recipe
from fitevict.zoo.tensors import tensor_data, tensor_shapes

POOL_BYTES = 4 << 20
# per block type: the range of its f16 scale (Q4_0: w = d * (q - 8), q in 0..15; Q8_0: w = d * q, q in -128..127)
_SCALES: dict[QT, tuple[float, float]] = {QT.Q4_0: (0.003, 0.006), QT.Q8_0: (0.0002, 0.0004)}
_F32_ONLY = ("ffn_gate_inp.weight", "token_types.weight")  # kept f32, as llama.cpp's converter and quantizer do

_Spec = tuple[str, tuple[int, ...], str]


def bert_tensors(r: Recipe) -> list[_Spec]:
    """BERT's tensors (llama.cpp's ``bert``): embeddings of tokens, token types and positions with a LayerNorm,
    then post-norm blocks with biases everywhere; no output head."""
    e, ff = r.n_embd, r.n_ff
    assert isinstance(ff, int)
    out: list[_Spec] = [
        ("token_embd.weight", (r.n_vocab, e), "weight"),
        ("token_types.weight", (2, e), "weight"),
        ("position_embd.weight", (r.n_ctx_train, e), "weight"),
        ("token_embd_norm.weight", (e,), "norm"),
        ("token_embd_norm.bias", (e,), "zeros"),
    ]
    for i in range(r.n_layer):
        p = f"blk.{i}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            out += [(p + name + ".weight", (e, e), "weight"), (p + name + ".bias", (e,), "vec")]
        out += [(p + "attn_output_norm.weight", (e,), "norm"), (p + "attn_output_norm.bias", (e,), "zeros"),
                (p + "ffn_up.weight", (ff, e), "weight"), (p + "ffn_up.bias", (ff,), "vec"),
                (p + "ffn_down.weight", (e, ff), "weight"), (p + "ffn_down.bias", (e,), "vec"),
                (p + "layer_output_norm.weight", (e,), "norm"), (p + "layer_output_norm.bias", (e,), "zeros")]
    return out


def planned_tensors(m: LifeSize) -> list[tuple[Planned, str]]:
    """Every tensor of a life-size model, in file order, with its kind (``tensor_shapes``' kinds)."""
    r = m.recipe
    specs = bert_tensors(r) if r.arch == "bert" else tensor_shapes(r)
    if m.rope_freqs:  # llama 3.1+: per-dimension rope frequency factors (ones here: no scaling)
        specs = [("rope_freqs.weight", ((r.head_dim or r.n_embd // r.n_head) // 2,), "norm"), *specs]
    out = []
    for name, shape, kind in specs:
        big = kind == "weight" and not name.endswith(_F32_ONLY)
        qt = r.weight_type if big else QT.F32
        out.append((Planned(name, tuple(reversed(shape)), qt), kind))
    return out


def _pool(name: str, seed: int, qt: QT) -> bytes:
    """Twice the same POOL_BYTES of valid ``qt`` blocks (doubled, so any window of a pool's length is one slice)."""
    rng = np.random.default_rng(zlib.crc32(f"lifesize/{name}/{seed}/{qt.name}".encode()))
    _block, size = gguf.GGML_QUANT_SIZES[qt]
    n = POOL_BYTES // size
    if qt in _SCALES:
        blocks = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
        lo, hi = _SCALES[qt]
        blocks[:, :2] = rng.uniform(lo, hi, n).astype(np.float16).view(np.uint8).reshape(n, 2)
        data = blocks.tobytes()
    elif qt in (QT.F16, QT.F32):
        w = rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)
        data = w.astype(np.float16 if qt == QT.F16 else np.float32).tobytes()
    else:
        raise ValueError(f"no direct writer for {qt.name}: make it with llama-quantize")
    return data + data


def fill(r: Recipe, t: Planned, kind: str, pools: dict[QT, bytes]) -> Iterator[memoryview]:
    """The bytes of one tensor, in slices; ``pools`` keeps the model's pools (one per type) between its tensors."""
    if t.qtype == QT.F32:  # small: the demo zoo's data (weights among them, such as the router, normal * 0.02)
        shape = tuple(reversed(t.ne))
        data, qt = tensor_data(replace(r, weight_type=QT.F32), t.name, shape, kind)
        assert qt == QT.F32
        yield memoryview(np.ascontiguousarray(data, dtype=np.float32).tobytes())
        return
    if t.qtype not in pools:
        pools[t.qtype] = _pool(r.name, r.seed, t.qtype)
    pool = memoryview(pools[t.qtype])
    size = gguf.GGML_QUANT_SIZES[t.qtype][1]
    span = len(pool) // 2 // size * size
    at = zlib.crc32(t.name.encode()) % (span // size) * size
    left = t.nbytes
    while left:
        take = min(left, span)
        yield pool[at:at + take]
        left -= take
        at = (at + take) % span
