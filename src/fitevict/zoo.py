"""The demo model zoo: small, valid, deterministic GGUF files for tests and demos.

Every model has random weights (fixed seeds, ``normal * 0.02`` so inference stays numerically sane), a tiny
SentencePiece-style ("llama") vocabulary with byte tokens, and a ChatML chat template, so llama-server loads it
and answers ``/v1/chat/completions``. Dimensions are deliberately uneven (n_embd 96, n_ff 250, n_vocab 1003) so
that pricing code cannot lean on round numbers.

Same code, same bytes: a file depends only on its recipe, ``GENERATOR_VERSION`` and the ``gguf`` package
version. ``write_zoo`` records each file's sha256 in a manifest next to the files and skips a model whose file
on disk still matches it. Files are written to a temporary name and renamed, so a crash never leaves half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from importlib.metadata import version as _dist_version
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants

from fitevict import zoo_hybrid

GENERATOR_VERSION = 1
MANIFEST_NAME = "zoo-manifest.json"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Control tokens first (their ids are the ones llama.cpp's SPM defaults expect: unk 0, bos 1, eos 2).
_CONTROL = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
UNK_ID, BOS_ID, EOS_ID, IM_START_ID, IM_END_ID = range(len(_CONTROL))
_SPACE = "\u2581"  # SentencePiece's word-boundary marker
_LETTERS = "etaoinshrdlcumwfgypbvkjxqz"
_EXTRA_CHARS = "ETAOINSHRDLCUMWFGYPBVKJXQZ0123456789.,!?'\"-:;()"

_FILE_TYPE: dict[QT, int] = {
    QT.F32: int(gguf.LlamaFileType.ALL_F32),
    QT.F16: int(gguf.LlamaFileType.MOSTLY_F16),
    QT.Q8_0: int(gguf.LlamaFileType.MOSTLY_Q8_0),
    QT.Q4_0: int(gguf.LlamaFileType.MOSTLY_Q4_0),
}


@dataclass(frozen=True, slots=True)
class ZooModel:
    """One written zoo file. ``file_bytes`` is the size on disk (a file-size figure, not a memory price)."""

    name: str
    path: Path
    arch: str
    quant: str
    description: str
    file_bytes: int


@dataclass(frozen=True, slots=True)
class _Recipe:
    """Everything that determines a zoo file's bytes."""

    name: str
    arch: str
    description: str
    weight_type: QT
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int = 0
    n_head_kv: int | tuple[int, ...] = 0
    n_ff: int | tuple[int, ...] = 0
    n_ctx_train: int = 4096
    tied: bool = False
    n_expert: int = 0
    n_expert_used: int = 0
    sliding_window: int = 0
    ssm: tuple[int, ...] = ()  # (d_conv, d_inner, d_state, dt_rank[, n_group])
    seed: int = 0
    extra: tuple[tuple[str, float], ...] = ()  # further GGUFWriter.add_<key>(value) calls
    head_dim: int = 0  # explicit key_length = value_length; 0: n_embd / n_head, no key written
    n_ff_exp: int = 0  # expert FFN length (expert_feed_forward_length); 0: not written
    n_ff_shexp: int = 0  # shared-expert FFN length; 0: not written
    n_expert_shared: int = 0  # deepseek2: shared experts of n_ff_exp each
    n_dense_lead: int = 0  # deepseek2: leading layers with a dense FFN
    mla: tuple[int, ...] = ()  # deepseek2 MLA: (kv_lora_rank, q_lora_rank, qk_rope, qk_nope, v_head_dim)
    n_nextn: int = 0  # trailing MTP (next-token prediction) blocks counted in block_count
    shortconv: int = 0  # lfm2: shortconv.l_cache


# Fields added after the first zoo: left out of a recipe's fingerprint while at their default, so the
# manifests written before them stay current.
_LATER_FIELDS: dict[str, object] = {
    "head_dim": 0, "n_ff_exp": 0, "n_ff_shexp": 0, "n_expert_shared": 0, "n_dense_lead": 0, "mla": (),
    "n_nextn": 0, "shortconv": 0,
}


@dataclass(frozen=True, slots=True)
class _Layout:
    """How one architecture spells a transformer block in GGUF (the tensors llama.cpp's loader requires)."""

    layer_norm: bool = False  # LayerNorm with bias (attn_norm / ffn_norm / output_norm .bias)
    fused_qkv: bool = False  # one attn_qkv matrix instead of attn_q / attn_k / attn_v
    qkv_bias: bool = False
    out_bias: bool = False
    qk_norm: bool = False  # attn_q_norm / attn_k_norm over one head
    post_norms: bool = False  # gemma: post_attention_norm and post_ffw_norm
    ffn: str = "gated"  # "gated" (gate/up/down), "plain" (up/down), "fused_up" (up is 2*n_ff, no gate)
    ffn_bias: bool = False
    pos_embd: bool = False  # learned absolute positions (position_embd, n_ctx_train rows)
    shared_expert: str = ""  # "qwen2moe" (gated shared expert) | "deepseek2" (n_expert_shared * n_ff_exp)
    mla: bool = False
    ffn_norm: bool = True  # falcon: one attn_norm feeds attention and FFN in parallel
    embd_norm: bool = False  # bloom: token_embd_norm (+ bias) right after the embedding


# Architectures written by ``_block_tensors`` (the first zoo's archs keep their original writer).
_LAYOUTS: dict[str, _Layout] = {
    "qwen2": _Layout(qkv_bias=True),
    "qwen3": _Layout(qk_norm=True),
    "gemma3": _Layout(qk_norm=True, post_norms=True),
    "qwen2moe": _Layout(qkv_bias=True, shared_expert="qwen2moe"),
    "phi3": _Layout(fused_qkv=True, ffn="fused_up"),
    "deepseek2": _Layout(mla=True, shared_expert="deepseek2"),
    "gpt2": _Layout(layer_norm=True, fused_qkv=True, qkv_bias=True, out_bias=True, ffn="plain", ffn_bias=True,
                    pos_embd=True),
    "starcoder2": _Layout(layer_norm=True, qkv_bias=True, out_bias=True, ffn="plain", ffn_bias=True),
    "qwen3moe": _Layout(qk_norm=True),
    "falcon": _Layout(layer_norm=True, fused_qkv=True, ffn="plain", ffn_norm=False),
    "bloom": _Layout(layer_norm=True, fused_qkv=True, qkv_bias=True, out_bias=True, ffn="plain", ffn_bias=True,
                     embd_norm=True),
    "granite": _Layout(),
    "cohere2": _Layout(ffn_norm=False),  # LayerNorm without bias, parallel attention / FFN
}


_RECIPES: tuple[_Recipe, ...] = (
    _Recipe(
        name="llama-gqa",
        arch="llama",
        description="dense llama, GQA 6 heads / 2 kv heads, untied output, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=3, n_head=6, n_head_kv=2, n_ff=250,
    ),
    _Recipe(
        name="llama-tied",
        arch="llama",
        description="dense llama, GQA 6/2, tied embeddings (no output.weight), f32",
        weight_type=QT.F32,
        n_vocab=1003, n_embd=96, n_layer=3, n_head=6, n_head_kv=2, n_ff=250, tied=True,
    ),
    _Recipe(
        name="llama-moe",
        arch="llama",
        description="Mixtral-style llama MoE, 4 experts / 2 used, GQA 6/2, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=2, n_head=6, n_head_kv=2, n_ff=136, n_expert=4, n_expert_used=2,
    ),
    _Recipe(
        name="gemma2-swa",
        arch="gemma2",
        description="gemma2, sliding window 64 on every other layer, GQA 4/2, tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=4, n_head=4, n_head_kv=2, n_ff=200, tied=True, sliding_window=64,
        extra=(("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0)),
    ),
    _Recipe(
        name="llama-q8_0",
        arch="llama",
        description="dense llama, GQA 5/1, Q8_0 weights (f32 norms)",
        weight_type=QT.Q8_0,
        n_vocab=1003, n_embd=160, n_layer=3, n_head=5, n_head_kv=1, n_ff=416,
    ),
    _Recipe(
        name="llama-q4_0",
        arch="llama",
        description="dense llama, GQA 5/1, Q4_0 weights (f32 norms)",
        weight_type=QT.Q4_0,
        n_vocab=1003, n_embd=160, n_layer=3, n_head=5, n_head_kv=1, n_ff=416,
    ),
    _Recipe(
        name="llama-medium",
        arch="llama",
        description="dense llama, 8 layers, GQA 15/5, untied, f16, about 200 MB",
        weight_type=QT.F16,
        n_vocab=12007, n_embd=960, n_layer=8, n_head=15, n_head_kv=5, n_ff=2600, n_ctx_train=8192,
    ),
    _Recipe(
        name="deci-kvarray",
        arch="deci",
        description="deci (llama-like) with per-layer head_count_kv [2, 1, 3, 2] and feed_forward_length arrays, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=4, n_head=6, n_head_kv=(2, 1, 3, 2), n_ff=(200, 136, 200, 264),
    ),
    _Recipe(
        name="jamba-hybrid",
        arch="jamba",
        description="jamba hybrid: mamba layers 0 and 2 (head_count_kv 0), attention layers 1 and 3 (GQA 6/2), f32",
        weight_type=QT.F32,
        n_vocab=1003, n_embd=96, n_layer=4, n_head=6, n_head_kv=(0, 2, 0, 2), n_ff=200, tied=True,
        ssm=(4, 192, 16, 6),
    ),
    _Recipe(
        name="mamba",
        arch="mamba",
        description="mamba (recurrent, no KV cache), d_inner 192, d_state 16, tied, f32",
        weight_type=QT.F32,
        n_vocab=1003, n_embd=96, n_layer=2, tied=True, ssm=(4, 192, 16, 6),
    ),
    _Recipe(
        name="qwen2-bias",
        arch="qwen2",
        description="qwen2: q/k/v biases, GQA 6/2, untied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=3, n_head=6, n_head_kv=2, n_ff=250, seed=1,
    ),
    _Recipe(
        name="qwen3-headdim",
        arch="qwen3",
        description="qwen3: q/k norms, head_dim 32 != n_embd/n_head 16 (explicit key/value_length), GQA 5/1, tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=80, n_layer=3, n_head=5, n_head_kv=1, n_ff=232, tied=True, head_dim=32, seed=1,
    ),
    _Recipe(
        name="gemma3-swa",
        arch="gemma3",
        description="gemma3: 5 of every 6 layers sliding window 48 (7 layers), head_dim 32, q/k norms, tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=7, n_head=4, n_head_kv=2, n_ff=200, tied=True, sliding_window=48,
        head_dim=32, seed=1,
    ),
    _Recipe(
        name="gemma3-q4_0",
        arch="gemma3",
        description="gemma3, Q4_0 weights, n_vocab 1008 so the tied output is repacked (its own CPU_REPACK copy), "
                    "head_dim 64, window 100, MQA 5/1",
        weight_type=QT.Q4_0,
        n_vocab=1008, n_embd=160, n_layer=7, n_head=5, n_head_kv=1, n_ff=416, tied=True, sliding_window=100,
        head_dim=64, seed=1,
    ),
    _Recipe(
        name="cohere2-swa",
        arch="cohere2",
        description="cohere2: 3 of every 4 layers sliding window 40 (5 layers), parallel attention/FFN with one "
                    "bias-free LayerNorm, logit scale, GQA 6/2, tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=5, n_head=6, n_head_kv=2, n_ff=250, tied=True, sliding_window=40, seed=1,
        extra=(("logit_scale", 0.125), ("layer_norm_eps", 1e-5)),
    ),
    _Recipe(
        name="qwen2moe-shexp",
        arch="qwen2moe",
        description="qwen2moe: 6 experts / 2 used (expert FFN 72) plus a gated shared expert (FFN 136), GQA 6/2, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=2, n_head=6, n_head_kv=2, n_ff=250, n_expert=6, n_expert_used=2,
        n_ff_exp=72, n_ff_shexp=136, seed=1,
    ),
    _Recipe(
        name="phi-fusedqkv",  # a general.name containing "phi3" makes llama.cpp require <|endoftext|>
        arch="phi3",
        description="phi3: fused attn_qkv and fused gate/up FFN, GQA 6/3, untied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=3, n_head=6, n_head_kv=3, n_ff=250, seed=1,
    ),
    _Recipe(
        name="deepseek2-mla",
        arch="deepseek2",
        description="deepseek2 MLA (kv_lora_rank 64, rope 32, q_lora_rank 48), 1 dense + 2 MoE layers "
                    "(4 experts / 2 used, 1 shared, expert FFN 64) + 1 MTP block, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=4, n_head=4, n_head_kv=1, n_ff=200, n_expert=4, n_expert_used=2,
        n_ff_exp=64, n_expert_shared=1, n_dense_lead=1, mla=(64, 48, 32, 24, 40), n_nextn=1, seed=1,
        extra=(("expert_weights_scale", 1.0),),
    ),
    _Recipe(
        name="gpt2-ln",
        arch="gpt2",
        description="gpt2: LayerNorm with bias, learned absolute positions, fused qkv with bias, no GQA (4 heads), "
                    "tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=3, n_head=4, n_head_kv=4, n_ff=260, tied=True, seed=1,
    ),
    _Recipe(
        name="qwen3moe",
        arch="qwen3moe",
        description="qwen3moe: 8 experts / 2 used with expert FFN 56 (no shared expert), q/k norms, GQA 6/2, tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=2, n_head=6, n_head_kv=2, n_ff=250, n_expert=8, n_expert_used=2,
        n_ff_exp=56, tied=True, seed=1,
    ),
    _Recipe(
        name="falcon-mqa",
        arch="falcon",
        description="falcon: multi-query attention (1 kv head of 6), fused qkv, parallel attention/FFN with one "
                    "LayerNorm, untied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=3, n_head=6, n_head_kv=1, n_ff=384, seed=1,
    ),
    _Recipe(
        name="bloom-alibi",
        arch="bloom",
        description="bloom: ALiBi (no rope), token_embd_norm, LayerNorm with bias, fused qkv with bias, 4 heads, "
                    "tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=3, n_head=4, n_head_kv=4, n_ff=384, tied=True, seed=1,
    ),
    _Recipe(
        name="granite-scaled",
        arch="granite",
        description="granite: llama blocks with logit / residual / embedding / attention scales, GQA 6/2, tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=3, n_head=6, n_head_kv=2, n_ff=250, tied=True, seed=1,
        extra=(("logit_scale", 6.0), ("residual_scale", 0.22), ("embedding_scale", 12.0),
               ("attention_scale", 0.0625)),
    ),
    _Recipe(
        name="qwen2-k256",
        arch="qwen2",
        description="qwen2 with k-quant-friendly rows (n_embd 256, head_dim 64), FFN 320, GQA 4/1, untied, f16; "
                    "the source for a llama-quantize Q4_K_M copy",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=256, n_layer=2, n_head=4, n_head_kv=1, n_ff=320, seed=1,
    ),
    _Recipe(
        name="starcoder2-gqa",
        arch="starcoder2",
        description="starcoder2: LayerNorm with bias, q/k/v/out and FFN biases, plain GELU FFN, GQA 6/2, untied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=3, n_head=6, n_head_kv=2, n_ff=250, seed=1,
    ),
    _Recipe(
        name="lfm2-shortconv",
        arch="lfm2",
        description="lfm2 hybrid: short-convolution layers 0, 1, 3 (l_cache 3, head_count_kv 0) and attention "
                    "layers 2, 4 (GQA 6/2, q/k norms), tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=5, n_head=6, n_head_kv=(0, 0, 2, 0, 2), n_ff=200, tied=True,
        shortconv=3, seed=1,
    ),
    _Recipe(
        name="granitehybrid-moe",
        arch="granitehybrid",
        description="granitehybrid: mamba2 layers 0, 1, 3 (d_inner 192, d_state 16, 6 heads, 2 groups) and "
                    "attention layer 2 (GQA 6/2), every layer an MoE FFN (4 experts / 2 used, FFN 64) with a "
                    "shared expert (FFN 96), tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=4, n_head=6, n_head_kv=(0, 0, 2, 0), n_ff=64, tied=True,
        n_expert=4, n_expert_used=2, n_ff_shexp=96, ssm=(4, 192, 16, 6, 2), seed=1,
    ),
)

ZOO_NAMES: tuple[str, ...] = tuple(r.name for r in _RECIPES)
_BY_NAME: dict[str, _Recipe] = {r.name: r for r in _RECIPES}


class ZooError(ValueError):
    """A zoo request that cannot be carried out (unknown name, unwritable directory)."""


# ---------------------------------------------------------------------------------------------- vocabulary


def _vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of a small SPM vocabulary with exactly ``n_vocab`` entries."""
    tokens: list[str] = list(_CONTROL)
    types: list[int] = [int(gguf.TokenType.UNKNOWN)] + [int(gguf.TokenType.CONTROL)] * (len(_CONTROL) - 1)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [int(gguf.TokenType.BYTE)] * 256
    scores: list[float] = [0.0] * len(tokens)

    pieces: list[str] = [_SPACE]
    pieces += list(_LETTERS) + list(_EXTRA_CHARS)
    pieces += [_SPACE + c for c in _LETTERS + _EXTRA_CHARS]
    for a in _LETTERS:
        for b in _LETTERS:
            pieces += [a + b, _SPACE + a + b]
    for a in _LETTERS:
        for b in _LETTERS:
            for c in _LETTERS:
                pieces += [a + b + c, _SPACE + a + b + c]
    need = n_vocab - len(tokens)
    if need < 0 or need > len(pieces):
        raise ZooError(f"n_vocab {n_vocab} is outside {len(tokens)}..{len(tokens) + len(pieces)}")
    for rank, piece in enumerate(pieces[:need]):
        tokens.append(piece)
        scores.append(-float(rank))
        types.append(int(gguf.TokenType.NORMAL))
    return tokens, scores, types


# ---------------------------------------------------------------------------------------------- tensors


def _as_list(v: int | tuple[int, ...], n: int) -> list[int]:
    return list(v) if isinstance(v, tuple) else [v] * n


def _rng(recipe: _Recipe, tensor: str) -> np.random.Generator:
    seed = zlib.crc32(f"{recipe.name}/{recipe.seed}/{tensor}".encode())
    return np.random.default_rng(seed)


def _tensor_shapes(r: _Recipe) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, kind) for every tensor; kind is "weight", "norm" (ones) or a special init.

    Numpy shapes are ggml's ``ne`` reversed: a ggml ``{n_embd, n_vocab}`` tensor is ``(n_vocab, n_embd)``.
    """
    if r.arch in _LAYOUTS:
        return _block_tensors(r)
    if r.arch in zoo_hybrid.ARCHS:
        return zoo_hybrid.tensors(r)
    e, v = r.n_embd, r.n_vocab
    out: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (v, e), "weight")]
    out.append(("output_norm.weight", (e,), "norm"))
    if not r.tied:
        out.append(("output.weight", (v, e), "weight"))
    kv = _as_list(r.n_head_kv, r.n_layer)
    ff = _as_list(r.n_ff, r.n_layer)
    for i in range(r.n_layer):
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", (e,), "norm"))
        if r.arch == "mamba" or (r.arch == "jamba" and kv[i] == 0):
            d_conv, d_inner, d_state, dt_rank = r.ssm
            out += [
                (p + "ssm_in.weight", (2 * d_inner, e), "weight"),
                (p + "ssm_conv1d.weight", (d_inner, d_conv), "weight"),
                (p + "ssm_conv1d.bias", (d_inner,), "zeros"),
                (p + "ssm_x.weight", (dt_rank + 2 * d_state, d_inner), "weight"),
                (p + "ssm_dt.weight", (d_inner, dt_rank), "weight"),
                (p + "ssm_dt.bias", (d_inner,), "zeros"),
                (p + "ssm_a", (d_inner, d_state), "ssm_a"),
                (p + "ssm_d", (d_inner,), "norm"),
                (p + "ssm_out.weight", (e, d_inner), "weight"),
            ]
            if r.arch == "jamba":
                out += [
                    (p + "ssm_dt_norm.weight", (dt_rank,), "norm"),
                    (p + "ssm_b_norm.weight", (d_state,), "norm"),
                    (p + "ssm_c_norm.weight", (d_state,), "norm"),
                ]
            if r.arch == "mamba":
                continue
        else:
            out += _attention(r, p, kv[i])
        out.append((p + "ffn_norm.weight", (e,), "norm"))
        if r.n_expert:
            n = r.n_expert
            out += [
                (p + "ffn_gate_inp.weight", (n, e), "weight"),
                (p + "ffn_gate_exps.weight", (n, ff[i], e), "weight"),
                (p + "ffn_down_exps.weight", (n, e, ff[i]), "weight"),
                (p + "ffn_up_exps.weight", (n, ff[i], e), "weight"),
            ]
        else:
            out += [
                (p + "ffn_gate.weight", (ff[i], e), "weight"),
                (p + "ffn_down.weight", (e, ff[i]), "weight"),
                (p + "ffn_up.weight", (ff[i], e), "weight"),
            ]
        if r.arch == "gemma2":
            out.append((p + "post_ffw_norm.weight", (e,), "norm"))
    return out


def _block_tensors(r: _Recipe) -> list[tuple[str, tuple[int, ...], str]]:
    """Tensors of an architecture in ``_LAYOUTS``, in llama.cpp's own names and ``ne`` (numpy order here)."""
    lo = _LAYOUTS[r.arch]
    e, v = r.n_embd, r.n_vocab
    out: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (v, e), "weight")]
    if lo.pos_embd:
        out.append(("position_embd.weight", (r.n_ctx_train, e), "weight"))
    if lo.embd_norm:
        out += [("token_embd_norm.weight", (e,), "norm"), ("token_embd_norm.bias", (e,), "zeros")]
    out.append(("output_norm.weight", (e,), "norm"))
    if lo.layer_norm:
        out.append(("output_norm.bias", (e,), "zeros"))
    if not r.tied:
        out.append(("output.weight", (v, e), "weight"))
    kv = _as_list(r.n_head_kv, r.n_layer)
    ff = _as_list(r.n_ff, r.n_layer)
    hd = r.head_dim or e // r.n_head
    for i in range(r.n_layer):
        p = f"blk.{i}."

        def norm(name: str) -> None:
            out.append((p + name + ".weight", (e,), "norm"))
            if lo.layer_norm:
                out.append((p + name + ".bias", (e,), "zeros"))

        norm("attn_norm")
        q, k = hd * r.n_head, hd * kv[i]
        if lo.mla:
            kv_lora, q_lora, rope, nope, v_head = r.mla
            out += [
                (p + "attn_q_a_norm.weight", (q_lora,), "norm"),
                (p + "attn_kv_a_norm.weight", (kv_lora,), "norm"),
                (p + "attn_q_a.weight", (q_lora, e), "weight"),
                (p + "attn_q_b.weight", (r.n_head * (nope + rope), q_lora), "weight"),
                (p + "attn_kv_a_mqa.weight", (kv_lora + rope, e), "weight"),
                (p + "attn_k_b.weight", (r.n_head, kv_lora, nope), "weight"),
                (p + "attn_v_b.weight", (r.n_head, v_head, kv_lora), "weight"),
                (p + "attn_output.weight", (e, r.n_head * v_head), "weight"),
            ]
        else:
            if lo.fused_qkv:
                out.append((p + "attn_qkv.weight", (q + 2 * k, e), "weight"))
                if lo.qkv_bias:
                    out.append((p + "attn_qkv.bias", (q + 2 * k,), "zeros"))
            else:
                for name, n in (("attn_q", q), ("attn_k", k), ("attn_v", k)):
                    out.append((p + name + ".weight", (n, e), "weight"))
                    if lo.qkv_bias:
                        out.append((p + name + ".bias", (n,), "vec"))
            out.append((p + "attn_output.weight", (e, q), "weight"))
            if lo.out_bias:
                out.append((p + "attn_output.bias", (e,), "zeros"))
        if lo.qk_norm:
            out += [(p + "attn_q_norm.weight", (hd,), "norm"), (p + "attn_k_norm.weight", (hd,), "norm")]
        if lo.post_norms:
            out.append((p + "post_attention_norm.weight", (e,), "norm"))
        if lo.ffn_norm:
            norm("ffn_norm")
        if r.n_expert and i >= r.n_dense_lead:
            n, fe = r.n_expert, r.n_ff_exp
            out += [
                (p + "ffn_gate_inp.weight", (n, e), "weight"),
                (p + "ffn_gate_exps.weight", (n, fe, e), "weight"),
                (p + "ffn_down_exps.weight", (n, e, fe), "weight"),
                (p + "ffn_up_exps.weight", (n, fe, e), "weight"),
            ]
            if lo.shared_expert:
                sh = r.n_ff_shexp if lo.shared_expert == "qwen2moe" else r.n_ff_exp * r.n_expert_shared
                if lo.shared_expert == "qwen2moe":
                    out.append((p + "ffn_gate_inp_shexp.weight", (e,), "vec"))
                out += [
                    (p + "ffn_gate_shexp.weight", (sh, e), "weight"),
                    (p + "ffn_down_shexp.weight", (e, sh), "weight"),
                    (p + "ffn_up_shexp.weight", (sh, e), "weight"),
                ]
        elif lo.ffn == "fused_up":
            out += [(p + "ffn_down.weight", (e, ff[i]), "weight"), (p + "ffn_up.weight", (2 * ff[i], e), "weight")]
        else:
            if lo.ffn == "gated":
                out.append((p + "ffn_gate.weight", (ff[i], e), "weight"))
            out += [(p + "ffn_down.weight", (e, ff[i]), "weight"), (p + "ffn_up.weight", (ff[i], e), "weight")]
            if lo.ffn_bias:
                out += [(p + "ffn_down.bias", (e,), "zeros"), (p + "ffn_up.bias", (ff[i],), "zeros")]
        if lo.post_norms:
            out.append((p + "post_ffw_norm.weight", (e,), "norm"))
        if i >= r.n_layer - r.n_nextn:
            out += [
                (p + "nextn.eh_proj.weight", (e, 2 * e), "weight"),
                (p + "nextn.enorm.weight", (e,), "norm"),
                (p + "nextn.hnorm.weight", (e,), "norm"),
                (p + "nextn.shared_head_norm.weight", (e,), "norm"),
            ]
    return out


def _attention(r: _Recipe, p: str, n_head_kv: int) -> list[tuple[str, tuple[int, ...], str]]:
    e = r.n_embd
    head_dim = e // r.n_head
    out = [
        (p + "attn_q.weight", (head_dim * r.n_head, e), "weight"),
        (p + "attn_k.weight", (head_dim * n_head_kv, e), "weight"),
        (p + "attn_v.weight", (head_dim * n_head_kv, e), "weight"),
        (p + "attn_output.weight", (e, head_dim * r.n_head), "weight"),
    ]
    if r.arch == "gemma2":
        out.append((p + "post_attention_norm.weight", (e,), "norm"))
    return out


def _tensor_data(r: _Recipe, name: str, shape: tuple[int, ...], kind: str) -> tuple[np.ndarray, QT]:
    """The tensor's bytes as written (a float array, or quantized uint8 blocks) and its ggml type."""
    if kind == "norm":
        return np.ones(shape, dtype=np.float32), QT.F32
    if kind == "zeros":
        return np.zeros(shape, dtype=np.float32), QT.F32
    if kind in ("vec", "conv"):  # small random f32: biases that should not vanish, a shared-expert gate, and
        # convolution kernels (ggml's ssm_conv takes them in f32 only)
        return _rng(r, name).standard_normal(shape, dtype=np.float32) * np.float32(0.02), QT.F32
    if kind == "ssm_a":
        # A = -exp(A_log) with A_log = log(1..d_state), as the mamba converter stores it
        a = -np.broadcast_to(np.arange(1, shape[1] + 1, dtype=np.float32), shape)
        return np.ascontiguousarray(a), QT.F32
    w = _rng(r, name).standard_normal(shape, dtype=np.float32)
    w *= np.float32(0.02)
    qt = r.weight_type
    if qt == QT.F32:
        return w, QT.F32
    if qt == QT.F16:
        return w.astype(np.float16), QT.F16
    return quants.quantize(w, qt), qt


# ---------------------------------------------------------------------------------------------- writing


def _add_metadata(w: gguf.GGUFWriter, r: _Recipe) -> None:
    w.add_name(f"fitevict zoo {r.name}")
    w.add_file_type(_FILE_TYPE[r.weight_type])
    w.add_context_length(r.n_ctx_train)
    w.add_embedding_length(r.n_embd)
    w.add_block_count(r.n_layer)
    w.add_layer_norm_rms_eps(1e-6)
    if r.ssm:
        d_conv, d_inner, d_state, dt_rank = r.ssm[:4]
        w.add_ssm_conv_kernel(d_conv)
        w.add_ssm_inner_size(d_inner)
        w.add_ssm_state_size(d_state)
        w.add_ssm_time_step_rank(dt_rank)
    if r.arch == "mamba":
        w.add_head_count(0)
        w.add_head_count_kv(0)
        w.add_feed_forward_length(0)
    else:
        w.add_feed_forward_length(list(r.n_ff) if isinstance(r.n_ff, tuple) else r.n_ff)
        w.add_head_count(r.n_head)
        w.add_head_count_kv(list(r.n_head_kv) if isinstance(r.n_head_kv, tuple) else r.n_head_kv)
        w.add_rope_dimension_count(r.mla[2] if r.mla else (r.head_dim or r.n_embd // r.n_head))
        w.add_rope_freq_base(10000.0)
    if r.head_dim:
        w.add_key_length(r.head_dim)
        w.add_value_length(r.head_dim)
    if r.mla:  # the cache holds the compressed latent plus the rope part, one "head"
        kv_lora, q_lora, rope, nope, v_head = r.mla
        w.add_key_length(kv_lora + rope)
        w.add_value_length(kv_lora)
        w.add_key_length_mla(nope + rope)
        w.add_value_length_mla(v_head)
        w.add_kv_lora_rank(kv_lora)
        w.add_q_lora_rank(q_lora)
    if r.arch in _LAYOUTS and _LAYOUTS[r.arch].layer_norm:
        w.add_layer_norm_eps(1e-5)
    if r.n_expert:
        w.add_expert_count(r.n_expert)
        w.add_expert_used_count(r.n_expert_used)
    if r.n_ff_exp:
        w.add_expert_feed_forward_length(r.n_ff_exp)
    if r.n_ff_shexp:
        w.add_expert_shared_feed_forward_length(r.n_ff_shexp)
    if r.n_expert_shared:
        w.add_expert_shared_count(r.n_expert_shared)
    if r.n_dense_lead:
        w.add_leading_dense_block_count(r.n_dense_lead)
    if r.n_nextn:
        w.add_nextn_predict_layers(r.n_nextn)
    if r.sliding_window:
        w.add_sliding_window(r.sliding_window)
    for key, value in r.extra:
        getattr(w, f"add_{key}")(value)
    zoo_hybrid.metadata(w, r)

    tokens, scores, types = _vocab(r.n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(UNK_ID)
    w.add_eot_token_id(IM_END_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def _write_gguf(r: _Recipe, path: Path) -> None:
    """Write one recipe to ``path`` (the caller renames it into place)."""
    w = gguf.GGUFWriter(path, r.arch)
    try:
        _add_metadata(w, r)
        for name, shape, kind in _tensor_shapes(r):
            data, qt = _tensor_data(r, name, shape, kind)
            w.add_tensor(name, data, raw_dtype=qt if qt not in (QT.F32, QT.F16) else None)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()


def _fingerprint(r: _Recipe) -> str:
    """Identity of a recipe's output: recipe fields, generator version, gguf and numpy versions."""
    fields = {k: (v.name if isinstance(v, QT) else v) for k, v in asdict(r).items()
              if k not in _LATER_FIELDS or v != _LATER_FIELDS[k]}
    blob = json.dumps(
        {"recipe": fields, "generator": GENERATOR_VERSION, "gguf": _dist_version("gguf"), "numpy": np.__version__},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _read_manifest(dest: Path) -> dict[str, dict[str, object]]:
    p = dest / MANIFEST_NAME
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}  # no manifest, or an unreadable one: every model is checked by rewriting it
    return data if isinstance(data, dict) else {}


def _write_manifest(dest: Path, manifest: dict[str, dict[str, object]]) -> None:
    tmp = dest / f".{MANIFEST_NAME}.tmp-{os.getpid()}"
    try:
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, dest / MANIFEST_NAME)
    finally:
        tmp.unlink(missing_ok=True)


def _is_current(path: Path, entry: dict[str, object] | None, fingerprint: str) -> bool:
    if entry is None or entry.get("fingerprint") != fingerprint:
        return False
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    return size == entry.get("bytes") and _sha256(path) == entry.get("sha256")


def _quant_label(r: _Recipe) -> str:
    return r.weight_type.name


def _check_dest(dest: Path) -> None:
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ZooError(f"cannot create the zoo directory {dest}: {err.strerror}; pick a writable DIR") from err
    if not dest.is_dir():
        raise ZooError(f"{dest} exists and is not a directory; pick another DIR")
    if not os.access(dest, os.W_OK | os.X_OK):
        raise ZooError(
            f"the zoo directory {dest} is not writable by this user; pick a writable DIR or fix its permissions"
        )


def resolve_names(only: Iterable[str] | None) -> list[str]:
    """The zoo names to write, in zoo order; an unknown name raises ZooError listing the allowed ones."""
    if only is None:
        return list(ZOO_NAMES)
    wanted = list(dict.fromkeys(only))
    unknown = [n for n in wanted if n not in _BY_NAME]
    if unknown:
        raise ZooError(f"unknown zoo model {', '.join(unknown)}; allowed: {', '.join(ZOO_NAMES)}")
    return [n for n in ZOO_NAMES if n in wanted]


def write_zoo(
    dest: Path,
    *,
    only: Iterable[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[ZooModel]:
    """Write the zoo's models (all, or those in ``only``) as ``<name>.gguf`` under ``dest``.

    A model whose file already matches the manifest (same recipe fingerprint, size and sha256) is not rewritten.
    ``progress`` receives one line per model ("writing NAME" / "up to date NAME").
    """
    dest = Path(dest)
    names = resolve_names(only)
    _check_dest(dest)
    manifest = _read_manifest(dest)
    written: list[ZooModel] = []
    for name in names:
        r = _BY_NAME[name]
        path = dest / f"{name}.gguf"
        fp = _fingerprint(r)
        entry = manifest.get(name)
        if _is_current(path, entry if isinstance(entry, dict) else None, fp):
            if progress:
                progress(f"up to date {name}")
        else:
            if progress:
                progress(f"writing {name}")
            tmp = dest / f".{name}.gguf.tmp-{os.getpid()}"
            try:
                _write_gguf(r, tmp)
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
            manifest[name] = {
                "fingerprint": fp,
                "generator": GENERATOR_VERSION,
                "sha256": _sha256(path),
                "bytes": path.stat().st_size,
            }
            _write_manifest(dest, manifest)
        written.append(
            ZooModel(
                name=name,
                path=path,
                arch=r.arch,
                quant=_quant_label(r),
                description=r.description,
                file_bytes=path.stat().st_size,
            )
        )
    return written


def rewrite_arch(src: Path, dst: Path, arch: str) -> Path:
    """A copy of ``src`` whose architecture (and key prefix) is ``arch``: same tensors, same bytes.

    Useful to check how fitevict prices an architecture it has no rules for but the engine has.
    """
    r = gguf.GGUFReader(src)
    old = str(r.fields["general.architecture"].contents())
    w = gguf.GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        key = arch + name[len(old):] if name.startswith(old + ".") else name
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(key, f.contents(), f.types[0])
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=[int(x) for x in reversed(t.shape.tolist())], raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
