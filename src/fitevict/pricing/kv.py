"""Context memory as the pinned llama.cpp build sizes it: n_ctx resolution, KV / SWA cells, recurrent state.

Rules (llama.cpp 0c1e570: src/llama-context.cpp, src/llama-kv-cache*.cpp, tools/server/server.cpp):

- llama-server without ``-np``: 4 slots sharing one unified KV cache. ``-np N``: N slots, one stream each,
  unless ``-kvu``.
- ``-c 0`` means the model's training context per stream (``--fit``, on by default, resolves it to
  ``n_ctx_train * np`` without a unified cache; it may also lower it when memory is short). ``n_ctx`` is padded up to 256; without a unified cache
  ``n_ctx_seq = PAD(n_ctx / np, 256)`` and ``n_ctx = n_ctx_seq * np``; with one, ``n_ctx_seq = n_ctx``.
- ``n_batch = min(n_ctx as requested (before padding), -b)``; ``n_ubatch = min(n_batch, -ub)``.
- Each KV layer holds K ``[n_embd_head_k(il) * head_count_kv[il], cells, streams]`` of ``-ctk`` and V likewise
  of ``-ctv`` (SWA layers use ``key_length_swa`` / ``value_length_swa`` when the file has them); without flash
  attention V is stored transposed and every layer is padded to the widest V row. An MLA model
  (``key_length_mla`` and ``value_length_mla`` set) caches K only: one latent row of ``key_length``
  (kv_lora_rank + rope dims) per token; V is a view of it.
- Flash attention ``auto`` counts as enabled when the cache is created (V not transposed); a quantized V
  cache with ``-fa off`` is refused by llama.cpp.
- SWA layers hold ``PAD256(min(n_ctx_seq, n_swa * (unified ? np : 1) + n_ubatch))`` cells (``--swa-full``:
  ``n_ctx_seq``).
- Which layers hold a KV cache and which a recurrent state is decided per architecture (layers.py): all trunk
  layers of mamba / rwkv; the head_count_kv 0 layers of jamba, granitehybrid, lfm2; nemotron_h's, falcon-h1's and
  the qwen3next family's own rules. A recurrent layer holds f32 r ``[n_embd_r, max(1, np)]`` and s
  ``[n_embd_s, max(1, np)]``, each padded to 32 bytes, independent of ctx.
- The output buffer (``llama_context::output_reserve``) holds f32 logits (``n_vocab``) and, with ``--embeddings``,
  embeddings (``n_embd_out``) for ``max(n_outputs, np)`` outputs. At load it is reserved for ``np`` outputs (one
  token per slot). An embeddings context outputs every token of a batch, so the first full batch grows it to
  ``n_batch`` outputs, where llama-server has set ``n_batch = n_ubatch`` for embeddings (``-b`` above ``-ub``
  is lowered) and llama_context has clamped it to the requested context.

Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitevict.pricing.ggml_types import (
    CPU_TENSOR_ALIGNMENT,
    GgmlTypeError,
    block_size,
    is_quantized,
    pad,
    row_size,
    type_by_name,
)
from fitevict.pricing.gguf import GgufStructure, PricingError
from fitevict.pricing.loadconfig import CACHE_TYPES, LoadConfig

CTX_PAD = 256
DEFAULT_SLOTS = 4  # llama-server with no -np: n_parallel = 4, kv_unified = true


@dataclass(frozen=True, slots=True)
class ResolvedContext:
    """The context parameters llama.cpp ends up with for one configuration."""

    n_ctx: int
    n_ctx_seq: int
    n_parallel: int
    kv_unified: bool
    n_stream: int
    n_batch: int
    n_ubatch: int
    flash_attn: bool  # as the KV cache layout sees it (auto -> True)
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class KvLayer:
    """One layer's context memory in bytes (K + V, or R + S for a recurrent layer)."""

    il: int
    kind: str  # "full" | "swa" | "recurrent"
    cells: int
    k_bytes: int
    v_bytes: int

    @property
    def bytes(self) -> int:
        return self.k_bytes + self.v_bytes


@dataclass(frozen=True, slots=True)
class KvInfo:
    cells: int
    cells_swa: int
    layers_full: int
    layers_swa: int
    layers_recurrent: int
    layers: tuple[KvLayer, ...]

    @property
    def bytes(self) -> int:
        return sum(layer.bytes for layer in self.layers)

    def bytes_of(self, kind: str) -> int:
        """Bytes of the "full", "swa" or "recurrent" layers (llama.cpp logs one buffer per cache)."""
        return sum(layer.bytes for layer in self.layers if layer.kind == kind)

    def to_json(self) -> dict:
        return {
            "cells": self.cells, "cells_swa": self.cells_swa, "layers_full": self.layers_full,
            "layers_swa": self.layers_swa, "layers_recurrent": self.layers_recurrent,
            "cells_recurrent": next((layer.cells for layer in self.layers if layer.kind == "recurrent"), 0),
            "bytes_full": self.bytes_of("full"), "bytes_swa": self.bytes_of("swa"),
            "bytes_recurrent": self.bytes_of("recurrent"),
        }


def resolve_context(s: GgufStructure, cfg: LoadConfig) -> ResolvedContext:
    """Resolve -c / -np / -kvu / -b / -ub / -fa exactly as llama-server + llama_context do."""
    warnings: list[str] = []
    if cfg.n_parallel is None:
        n_par, unified = DEFAULT_SLOTS, True if cfg.kv_unified is None else cfg.kv_unified
    else:
        if cfg.n_parallel < 1:
            raise PricingError(f"{s.path}: -np {cfg.n_parallel} is not a slot count; use 1 or more (or omit -np)")
        n_par, unified = cfg.n_parallel, bool(cfg.kv_unified)
    if cfg.n_ctx < 0:
        raise PricingError(f"{s.path}: -c {cfg.n_ctx} is negative; use 0 (training context) or a token count")
    n_ctx = cfg.n_ctx or s.n_ctx_train
    if cfg.n_ctx == 0 and not unified:
        n_ctx = s.n_ctx_train * n_par  # --fit resolves an unset context to n_ctx_train per stream
    if n_ctx == 0:
        raise PricingError(f"{s.path}: -c 0 asks for the training context but the file has no context_length; pass -c")
    n_ctx_raw = n_ctx
    n_ctx = pad(n_ctx, CTX_PAD)
    if unified:
        n_ctx_seq = n_ctx
    else:
        n_ctx_seq = pad(n_ctx // n_par, CTX_PAD)
        if n_ctx_seq == 0:
            raise PricingError(f"{s.path}: -c {cfg.n_ctx} split over -np {n_par} gives 0 tokens per slot; raise -c")
        if n_ctx != n_ctx_seq * n_par:
            warnings.append(f"n_ctx {n_ctx} is not divisible by {n_par} slots; llama.cpp uses {n_ctx_seq * n_par}")
            n_ctx = n_ctx_seq * n_par
    if s.n_ctx_train and n_ctx_seq > s.n_ctx_train:
        warnings.append(f"n_ctx_seq {n_ctx_seq} > n_ctx_train {s.n_ctx_train}: possible training context overflow")
    b = min(cfg.n_batch, cfg.n_ubatch) if cfg.embeddings and cfg.n_ubatch else cfg.n_batch  # server.cpp
    n_batch = min(n_ctx_raw, b)  # llama_context clamps -b before padding n_ctx
    n_ubatch = min(n_batch, cfg.n_ubatch or cfg.n_batch)
    for flag, t in (("-ctk", cfg.cache_type_k), ("-ctv", cfg.cache_type_v)):
        if t.lower() not in CACHE_TYPES:
            raise PricingError(f"{s.path}: {flag} {t!r} is not a cache type; allowed: {', '.join(CACHE_TYPES)}")
    fa = cfg.flash_attn != "off"
    if not fa and is_quantized(cfg.cache_type_v):
        raise PricingError(
            f"{s.path}: a quantized V cache (-ctv {cfg.cache_type_v}) needs flash attention, but -fa is off; "
            "use -fa on (or auto), or -ctv f16"
        )
    if fa:
        heads_k = sorted({s.head_k(il) for il in range(s.n_layer)} or {s.key_length})
        heads_v = sorted({s.head_v(il) for il in range(s.n_layer)} or {s.value_length})
        for flag, t, head, what in (*(("-ctk", cfg.cache_type_k, h, "n_embd_head_k") for h in heads_k),
                                    *(("-ctv", cfg.cache_type_v, h, "n_embd_head_v") for h in heads_v)):
            bs = block_size(type_by_name(t))
            if bs > 1 and head % bs:
                raise PricingError(
                    f"{s.path}: {flag} {t} has block size {bs}, which does not divide {what}={head}; "
                    f"llama.cpp refuses it. Use {flag} f16 (or a type whose block size divides {head})"
                )
    return ResolvedContext(n_ctx, n_ctx_seq, n_par, unified, 1 if unified else n_par, n_batch, n_ubatch, fa,
                           tuple(warnings))


def kv_layers(s: GgufStructure, rc: ResolvedContext, cfg: LoadConfig) -> KvInfo:
    """Per-layer context bytes. Raises PricingError when the architecture has no known rules."""
    if s.unsupported:
        raise PricingError(f"{s.path}: {s.unsupported}")
    layers: list[KvLayer] = []
    cells = rc.n_ctx_seq
    cells_swa = 0
    if s.n_swa:
        cells_swa = rc.n_ctx_seq if cfg.swa_full else pad(
            min(rc.n_ctx_seq, s.n_swa * (rc.n_parallel if rc.kv_unified else 1) + rc.n_ubatch), CTX_PAD)
    v_max = max((s.head_v(il) * s.n_head_kv[il] for il in range(s.n_layer)), default=0)  # n_embd_v_gqa_max: all blocks
    rows = max(1, rc.n_parallel)  # llama_memory_recurrent: max(1, n_seq_max) cells, one row each
    for il in range(s.n_layer):
        if s.has_state(il):
            layers.append(recurrent_layer(s, il, rows))
        if not s.has_kv(il):
            continue
        h = s.n_head_kv[il]
        swa = s.swa_layers[il]
        n_cells = cells_swa if swa else cells
        k_w = s.head_k(il) * h
        v_w = v_max if not rc.flash_attn else s.head_v(il) * h
        try:
            k = pad(row_size(cfg.cache_type_k, k_w) * n_cells * rc.n_stream, CPU_TENSOR_ALIGNMENT)
            v = 0 if s.mla else pad(row_size(cfg.cache_type_v, v_w) * n_cells * rc.n_stream, CPU_TENSOR_ALIGNMENT)
        except GgmlTypeError as err:
            raise PricingError(f"{s.path}: layer {il}: {err}; pick another cache type") from err
        layers.append(KvLayer(il, "swa" if swa else "full", n_cells, k, v))
    return KvInfo(
        cells=cells if any(l.kind == "full" for l in layers) else 0,
        cells_swa=cells_swa,
        layers_full=sum(1 for l in layers if l.kind == "full"),
        layers_swa=sum(1 for l in layers if l.kind == "swa"),
        layers_recurrent=sum(1 for l in layers if l.kind == "recurrent"),
        layers=tuple(layers),
    )


def recurrent_layer(s: GgufStructure, il: int, rows: int) -> KvLayer:
    """One recurrent layer's state: f32 r ``[n_embd_r, rows]`` and s ``[n_embd_s, rows]``, each padded to the
    buffer's alignment (``ggml_backend_alloc_ctx_tensors_from_buft``)."""
    return KvLayer(il, "recurrent", rows, pad(row_size("f32", s.n_embd_r) * rows, CPU_TENSOR_ALIGNMENT),
                   pad(row_size("f32", s.n_embd_s) * rows, CPU_TENSOR_ALIGNMENT))


def output_bytes(s: GgufStructure, rc: ResolvedContext, embeddings: bool = False, *, at_load: bool = False) -> int:
    """llama_context::output_reserve: f32 logits (plus embeddings with ``--embeddings``) per output.

    ``at_load``: the buffer the load reserves (one output per slot), as the log prints it. Otherwise the most the
    seat allocates: an embeddings seat outputs every token of a batch, up to ``n_batch``."""
    per_output = 4 * (s.n_vocab + (s.n_embd_out if embeddings else 0))
    outputs = rc.n_parallel if at_load or not embeddings else max(rc.n_parallel, rc.n_batch)
    return per_output * outputs
