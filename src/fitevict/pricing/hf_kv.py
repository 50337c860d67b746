"""The KV cache of a transformers model, from config.json. Pure.

Per layer and cached token, K and V each hold ``num_key_value_heads x head_dim`` values (the KEY/VALUE head count,
not the attention heads: GQA and MQA models cache fewer heads than they attend with). A sliding-window layer
keeps at most ``sliding_window`` tokens. Which layers slide is spelled four ways across architectures:

- ``layer_types``: a per-layer list of "full_attention" / "sliding_attention" (Gemma 2/3, Qwen2 in transformers 5);
- ``use_sliding_window`` + ``max_window_layers`` (Qwen2 family): layers from ``max_window_layers`` on slide;
- ``sliding_window`` alone (Mistral, Mixtral): every layer slides;
- none of them: every layer is full.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


def text_config(config: Mapping) -> Mapping:
    """The language model's part of a config (multimodal configs nest it under ``text_config``)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) else config


def kv_heads(c: Mapping) -> int:
    """Heads that K and V are cached for: num_key_value_heads (GQA/MQA), else the attention heads."""
    n = c.get("num_key_value_heads") or c.get("multi_query_group_num") or c.get("num_attention_heads")
    if not n:
        raise ValueError("config.json has neither num_key_value_heads nor num_attention_heads")
    return int(n)


def head_dim(c: Mapping) -> int:
    """config.json's head_dim, else hidden_size / num_attention_heads."""
    if c.get("head_dim"):
        return int(c["head_dim"])
    return int(c["hidden_size"]) // int(c["num_attention_heads"])


def sliding_layers(c: Mapping) -> tuple[bool, ...]:
    """Per layer: True where the layer keeps only a sliding window of tokens."""
    n = int(c["num_hidden_layers"])
    window = c.get("sliding_window")
    types = c.get("layer_types")
    if isinstance(types, list) and len(types) == n:
        return tuple(t in ("sliding_attention", "chunked_attention") and bool(window) for t in types)
    if "use_sliding_window" in c:
        if not c.get("use_sliding_window") or not window:
            return (False,) * n
        first = int(c.get("max_window_layers") or 0)
        return tuple(i >= first for i in range(n))
    return (bool(window),) * n


@dataclass(frozen=True, slots=True)
class HfKv:
    """The priced cache: how many layers of each kind, how many tokens each holds, and the bytes."""

    n_ctx: int
    n_seq: int
    layers_full: int
    layers_swa: int
    cells: int  # tokens a full layer holds per sequence
    cells_swa: int  # tokens a sliding layer holds per sequence
    bytes_per_token_layer: int  # K + V of one token in one layer
    total_bytes: int

    def to_json(self) -> dict:
        return {"n_ctx": self.n_ctx, "n_seq": self.n_seq, "layers_full": self.layers_full,
                "layers_swa": self.layers_swa, "cells": self.cells, "cells_swa": self.cells_swa,
                "bytes_per_token_layer": self.bytes_per_token_layer, "bytes": self.total_bytes}


def hf_kv(config: Mapping, n_ctx: int, dtype_bytes: int, n_seq: int = 1) -> HfKv:
    """The KV cache for ``n_seq`` sequences of ``n_ctx`` tokens, K and V of ``dtype_bytes`` per value."""
    c = text_config(config)
    per = 2 * kv_heads(c) * head_dim(c) * dtype_bytes
    slides = sliding_layers(c)
    window = int(c.get("sliding_window") or 0)
    cells_swa = min(n_ctx, window) if window else n_ctx
    n_swa = sum(slides)
    n_full = len(slides) - n_swa
    total = per * n_seq * (n_full * n_ctx + n_swa * cells_swa)
    return HfKv(n_ctx, n_seq, n_full, n_swa, n_ctx, cells_swa, per, total)


def training_context(config: Mapping) -> int | None:
    """The model's training context (max_position_embeddings), if the config says."""
    c = text_config(config)
    v = c.get("max_position_embeddings") or c.get("n_positions") or c.get("seq_length")
    return int(v) if v else None
