"""The zoo's vocabulary and tensors: names, shapes and deterministic random data per recipe."""

from __future__ import annotations

import zlib

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants

from fitevict.zoo import hybrid as zoo_hybrid
from fitevict.zoo.recipes import ZooError, CONTROL_TOKENS, EXTRA_CHARS, LAYOUTS, LETTERS, Layout, Recipe, SPACE


# ---------------------------------------------------------------------------------------------- vocabulary


def spm_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of a small SPM vocabulary with exactly ``n_vocab`` entries."""
    tokens: list[str] = list(CONTROL_TOKENS)
    types: list[int] = [int(gguf.TokenType.UNKNOWN)] + [int(gguf.TokenType.CONTROL)] * (len(CONTROL_TOKENS) - 1)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [int(gguf.TokenType.BYTE)] * 256
    scores: list[float] = [0.0] * len(tokens)

    pieces: list[str] = [SPACE]
    pieces += list(LETTERS) + list(EXTRA_CHARS)
    pieces += [SPACE + c for c in LETTERS + EXTRA_CHARS]
    for a in LETTERS:
        for b in LETTERS:
            pieces += [a + b, SPACE + a + b]
    for a in LETTERS:
        for b in LETTERS:
            for c in LETTERS:
                pieces += [a + b + c, SPACE + a + b + c]
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


def _rng(recipe: Recipe, tensor: str) -> np.random.Generator:
    seed = zlib.crc32(f"{recipe.name}/{recipe.seed}/{tensor}".encode())
    return np.random.default_rng(seed)


def tensor_shapes(r: Recipe) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, kind) for every tensor; kind is "weight", "norm" (ones) or a special init.

    Numpy shapes are ggml's ``ne`` reversed: a ggml ``{n_embd, n_vocab}`` tensor is ``(n_vocab, n_embd)``.
    """
    if r.arch in LAYOUTS:
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


_Spec = tuple[str, tuple[int, ...], str]


def _block_tensors(r: Recipe) -> list[_Spec]:
    """Tensors of an architecture in ``LAYOUTS``, in llama.cpp's own names and ``ne`` (numpy order here)."""
    lo = LAYOUTS[r.arch]
    out = _layout_globals(r, lo)
    kv = _as_list(r.n_head_kv, r.n_layer)
    ff = _as_list(r.n_ff, r.n_layer)
    hd = r.head_dim or r.n_embd // r.n_head
    for i in range(r.n_layer):
        p = f"blk.{i}."
        out += _layout_norm(r, lo, p, "attn_norm")
        out += _layout_attention(r, lo, p, hd, kv[i])
        if lo.qk_norm:
            out += [(p + "attn_q_norm.weight", (hd,), "norm"), (p + "attn_k_norm.weight", (hd,), "norm")]
        if lo.post_norms:
            out.append((p + "post_attention_norm.weight", (r.n_embd,), "norm"))
        if lo.ffn_norm:
            out += _layout_norm(r, lo, p, "ffn_norm")
        out += _layout_ffn(r, lo, p, i, ff[i])
        if lo.post_norms:
            out.append((p + "post_ffw_norm.weight", (r.n_embd,), "norm"))
        if i >= r.n_layer - r.n_nextn:
            out += _nextn(r, p)
    return out


def _layout_globals(r: Recipe, lo: Layout) -> list[_Spec]:
    """The tensors outside the blocks: embeddings, their norm, the output norm and head."""
    e, v = r.n_embd, r.n_vocab
    out: list[_Spec] = [("token_embd.weight", (v, e), "weight")]
    if lo.pos_embd:
        out.append(("position_embd.weight", (r.n_ctx_train, e), "weight"))
    if lo.embd_norm:
        out += [("token_embd_norm.weight", (e,), "norm"), ("token_embd_norm.bias", (e,), "zeros")]
    out.append(("output_norm.weight", (e,), "norm"))
    if lo.layer_norm:
        out.append(("output_norm.bias", (e,), "zeros"))
    if not r.tied:
        out.append(("output.weight", (v, e), "weight"))
    return out


def _layout_norm(r: Recipe, lo: Layout, p: str, name: str) -> list[_Spec]:
    """A block's norm: its weight, and its bias under layer norm."""
    out: list[_Spec] = [(p + name + ".weight", (r.n_embd,), "norm")]
    if lo.layer_norm:
        out.append((p + name + ".bias", (r.n_embd,), "zeros"))
    return out


def _layout_attention(r: Recipe, lo: Layout, p: str, hd: int, n_head_kv: int) -> list[_Spec]:
    """A block's attention projections: MLA's latent ones, or Q/K/V (fused or apart) and the output."""
    e = r.n_embd
    if lo.mla:
        kv_lora, q_lora, rope, nope, v_head = r.mla
        return [
            (p + "attn_q_a_norm.weight", (q_lora,), "norm"),
            (p + "attn_kv_a_norm.weight", (kv_lora,), "norm"),
            (p + "attn_q_a.weight", (q_lora, e), "weight"),
            (p + "attn_q_b.weight", (r.n_head * (nope + rope), q_lora), "weight"),
            (p + "attn_kv_a_mqa.weight", (kv_lora + rope, e), "weight"),
            (p + "attn_k_b.weight", (r.n_head, kv_lora, nope), "weight"),
            (p + "attn_v_b.weight", (r.n_head, v_head, kv_lora), "weight"),
            (p + "attn_output.weight", (e, r.n_head * v_head), "weight"),
        ]
    q, k = hd * r.n_head, hd * n_head_kv
    out: list[_Spec] = []
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
    return out


def _layout_ffn(r: Recipe, lo: Layout, p: str, i: int, ff: int) -> list[_Spec]:
    """Block ``i``'s feed-forward: experts (with any shared expert) past the dense lead, else a dense FFN."""
    e = r.n_embd
    if r.n_expert and i >= r.n_dense_lead:
        n, fe = r.n_expert, r.n_ff_exp
        out: list[_Spec] = [
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
        return out
    if lo.ffn == "fused_up":
        return [(p + "ffn_down.weight", (e, ff), "weight"), (p + "ffn_up.weight", (2 * ff, e), "weight")]
    out = [(p + "ffn_gate.weight", (ff, e), "weight")] if lo.ffn == "gated" else []
    out += [(p + "ffn_down.weight", (e, ff), "weight"), (p + "ffn_up.weight", (ff, e), "weight")]
    if lo.ffn_bias:
        out += [(p + "ffn_down.bias", (e,), "zeros"), (p + "ffn_up.bias", (ff,), "zeros")]
    return out


def _nextn(r: Recipe, p: str) -> list[_Spec]:
    """A next-token-prediction block's extra tensors."""
    e = r.n_embd
    return [
        (p + "nextn.eh_proj.weight", (e, 2 * e), "weight"),
        (p + "nextn.enorm.weight", (e,), "norm"),
        (p + "nextn.hnorm.weight", (e,), "norm"),
        (p + "nextn.shared_head_norm.weight", (e,), "norm"),
    ]


def _attention(r: Recipe, p: str, n_head_kv: int) -> list[tuple[str, tuple[int, ...], str]]:
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


def tensor_data(r: Recipe, name: str, shape: tuple[int, ...], kind: str) -> tuple[np.ndarray, QT]:
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
