"""Zoo tensor layouts for hybrid architectures: short-convolution + attention (lfm2) and mamba2 + attention + MoE
(granitehybrid), and a pure mamba2, in llama.cpp's own tensor names and ``ne`` (numpy order here: ``ne`` reversed).

``tensors(r)`` lists (name, numpy shape, kind) for a recipe whose ``arch`` is in ``ARCHS``; ``metadata(w, r)`` adds
the keys the architecture's ``load_arch_hparams`` reads beyond the common ones. The recipe is the zoo's own
record (``fitevict.zoo.recipes.Recipe``): ``ssm`` is ``(d_conv, d_inner, d_state, n_ssm_head, n_group)`` for
granitehybrid and mamba2, ``shortconv`` lfm2's ``l_cache``.
"""

from __future__ import annotations

from typing import Any

import gguf

Tensor = tuple[str, tuple[int, ...], str]


def _kv_list(r: Any) -> list[int]:
    return list(r.n_head_kv) if isinstance(r.n_head_kv, tuple) else [r.n_head_kv] * r.n_layer


def _attention(r: Any, p: str, n_head_kv: int) -> list[Tensor]:
    e = r.n_embd
    hd = e // r.n_head
    return [
        (p + "attn_q.weight", (hd * r.n_head, e), "weight"),
        (p + "attn_k.weight", (hd * n_head_kv, e), "weight"),
        (p + "attn_v.weight", (hd * n_head_kv, e), "weight"),
        (p + "attn_output.weight", (e, hd * r.n_head), "weight"),
    ]


def _lfm2(r: Any) -> list[Tensor]:
    """models/lfm2.cpp: dense gated FFN on every block; an attention block has q/k norms, a short-conv block
    ``shortconv.conv`` ``{l_cache, n_embd}``, ``in_proj`` ``{n_embd, 3 n_embd}`` and ``out_proj``. The final norm
    is spelled ``token_embd_norm``."""
    e, v = r.n_embd, r.n_vocab
    out: list[Tensor] = [("token_embd.weight", (v, e), "weight"), ("token_embd_norm.weight", (e,), "norm")]
    if not r.tied:
        out.append(("output.weight", (v, e), "weight"))
    hd = e // r.n_head
    for i, kv in enumerate(_kv_list(r)):
        p = f"blk.{i}."
        out += [(p + "ffn_norm.weight", (e,), "norm"), (p + "ffn_gate.weight", (r.n_ff, e), "weight"),
                (p + "ffn_down.weight", (e, r.n_ff), "weight"), (p + "ffn_up.weight", (r.n_ff, e), "weight"),
                (p + "attn_norm.weight", (e,), "norm")]
        if kv:
            out += [(p + "attn_q_norm.weight", (hd,), "norm"), (p + "attn_k_norm.weight", (hd,), "norm")]
            out += _attention(r, p, kv)
        else:
            out += [(p + "shortconv.conv.weight", (e, r.shortconv), "conv"),
                    (p + "shortconv.in_proj.weight", (3 * e, e), "weight"),
                    (p + "shortconv.out_proj.weight", (e, e), "weight")]
    return out


def _mamba2_mixer(r: Any, p: str) -> list[Tensor]:
    """One mamba2 mixer block's tensors (models/mamba2.cpp, models/granite-hybrid.cpp)."""
    e = r.n_embd
    d_conv, d_inner, d_state, n_head_ssm, n_group = r.ssm
    conv_w = d_inner + 2 * n_group * d_state
    return [
        (p + "ssm_in.weight", (2 * d_inner + 2 * n_group * d_state + n_head_ssm, e), "weight"),
        (p + "ssm_conv1d.weight", (conv_w, d_conv), "conv"),
        (p + "ssm_conv1d.bias", (conv_w,), "zeros"),
        (p + "ssm_dt.bias", (n_head_ssm,), "zeros"),
        (p + "ssm_a", (n_head_ssm, 1), "ssm_a"),
        (p + "ssm_d", (n_head_ssm, 1), "norm"),
        (p + "ssm_norm.weight", (n_group, d_inner // n_group), "norm"),
        (p + "ssm_out.weight", (e, d_inner), "weight"),
    ]


def _mamba2(r: Any) -> list[Tensor]:
    """models/mamba2.cpp: every block a norm and a mamba2 mixer, no attention and no FFN."""
    out: list[Tensor] = [("token_embd.weight", (r.n_vocab, r.n_embd), "weight"),
                         ("output_norm.weight", (r.n_embd,), "norm")]
    if not r.tied:
        out.append(("output.weight", (r.n_vocab, r.n_embd), "weight"))
    for i in range(r.n_layer):
        out += [(f"blk.{i}.attn_norm.weight", (r.n_embd,), "norm"), *_mamba2_mixer(r, f"blk.{i}.")]
    return out


def _granitehybrid(r: Any) -> list[Tensor]:
    """models/granite-hybrid.cpp: mamba2 mixer blocks (head_count_kv 0) and attention blocks, each followed by an
    MoE FFN (experts of ``feed_forward_length``) with a shared expert."""
    e, v = r.n_embd, r.n_vocab
    out: list[Tensor] = [("token_embd.weight", (v, e), "weight"), ("output_norm.weight", (e,), "norm")]
    if not r.tied:
        out.append(("output.weight", (v, e), "weight"))
    for i, kv in enumerate(_kv_list(r)):
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", (e,), "norm"))
        out += _attention(r, p, kv) if kv else _mamba2_mixer(r, p)
        n, ff, sh = r.n_expert, r.n_ff, r.n_ff_shexp
        out += [
            (p + "ffn_norm.weight", (e,), "norm"),
            (p + "ffn_gate_inp.weight", (n, e), "weight"),
            (p + "ffn_gate_exps.weight", (n, ff, e), "weight"),
            (p + "ffn_down_exps.weight", (n, e, ff), "weight"),
            (p + "ffn_up_exps.weight", (n, ff, e), "weight"),
            (p + "ffn_gate_shexp.weight", (sh, e), "weight"),
            (p + "ffn_up_shexp.weight", (sh, e), "weight"),
            (p + "ffn_down_shexp.weight", (e, sh), "weight"),
        ]
    return out


def metadata(w: gguf.GGUFWriter, r: Any) -> None:
    """Keys beyond the zoo's common ones."""
    if r.arch == "lfm2":
        w.add_shortconv_l_cache(r.shortconv)
    elif r.arch in ("granitehybrid", "mamba2"):
        w.add_ssm_group_count(r.ssm[4])


TENSORS = {"lfm2": _lfm2, "granitehybrid": _granitehybrid, "mamba2": _mamba2}
ARCHS: frozenset[str] = frozenset(TENSORS)


def tensors(r: Any) -> list[Tensor]:
    return TENSORS[r.arch](r)
