"""Which layers hold an attention KV cache and which a recurrent state, as the pinned llama.cpp decides it.

llama.cpp 0c1e570 marks each layer recurrent or not in the architecture's ``load_arch_hparams``
(``hparams.is_recr_impl``, src/models/<arch>.cpp) and picks the memory in ``llama_model::create_memory``:

- a recurrent architecture (``llm_arch_is_recurrent``: mamba, mamba2, rwkv6, rwkv6qwen2, rwkv7, arwkv7) gets a
  ``llama_memory_recurrent`` over every trunk layer;
- a hybrid (``llm_arch_is_hybrid``) gets ``llama_memory_hybrid`` (``_iswa`` with sliding windows), whose KV cache
  takes the layers ``filter_attn`` accepts (default: not recurrent, over all blocks) and whose recurrent memory
  takes those ``filter_recr`` accepts (default: recurrent, over the trunk);
- anything else gets an attention KV cache over every block (the trunk only when the file has MTP blocks).

The rule that marks a layer recurrent is one of a few shapes, named here and assigned per architecture.
The recurrent state widths follow ``llama_hparams::n_embd_r`` / ``n_embd_s``: RWKV (``wkv.head_size``), LFM2's
short convolution (``shortconv.l_cache``), else the mamba form from the ``ssm.*`` keys.

Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

# llm_arch_is_recurrent: every trunk layer holds a recurrent state, none a KV cache
RECURRENT_ARCHS: frozenset[str] = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})

# llm_arch_is_hybrid, with the rule its load_arch_hparams / create_memory use:
#   "kv0"      recurrent iff head_count_kv[il] == 0 (trunk); KV on every other block
#   "kv0-ff0"  nemotron_h: recurrent iff head_count_kv == 0 and feed_forward_length == 0 (trunk);
#              KV iff not recurrent and feed_forward_length == 0 (an MLP block holds neither)
#   "both"     falcon-h1: every layer holds both a KV cache and a recurrent state
#   "interval" qwen3next family: attention.recurrent_layers, else every full_attention_interval-th trunk layer
#              is attention (default 4), the rest recurrent; MTP blocks hold neither
HYBRID_RULES: dict[str, str] = {
    "jamba": "kv0", "granitehybrid": "kv0", "lfm2": "kv0", "lfm2moe": "kv0", "plamo2": "kv0",
    "nemotron_h": "kv0-ff0", "nemotron_h_moe": "kv0-ff0",
    "falcon-h1": "both",
    "qwen3next": "interval", "qwen35": "interval", "qwen35moe": "interval",
}
# Hybrids whose sliding window applies to every attention layer when attention.sliding_window > 0
SWA_ON_ATTENTION: frozenset[str] = frozenset({"lfm2", "lfm2moe"})
DEFAULT_FULL_ATTENTION_INTERVAL = 4
DEFAULT_TOKEN_SHIFT_COUNT = 2  # llama_hparams::token_shift_count


@dataclass(frozen=True, slots=True)
class LayerKinds:
    """Per block (``block_count`` entries): does it hold a KV cache, a recurrent state, both or neither."""

    attention: tuple[bool, ...]
    recurrent: tuple[bool, ...]
    rule: str  # "attention", "recurrent" or a HYBRID_RULES value

    def kind(self, il: int, swa: bool = False) -> str:
        """"attention" ("attention+swa" for a sliding-window layer), "recurrent", "attention+recurrent" or "none"
        (an MLP-only or MTP block)."""
        parts = [k for k, on in (("attention+swa" if swa else "attention", self.attention[il]),
                                 ("recurrent", self.recurrent[il])) if on]
        return "+".join(parts) or "none"


# Architectures for which llama_model::create_memory makes no memory at all (it returns nullptr): encoders (BERT and
# its kin), embedding-only and diffusion models. No block holds a KV cache or a recurrent state, at any context.
MEMORYLESS_ARCHS: frozenset[str] = frozenset({
    "bert", "jina-bert-v2", "jina-bert-v3", "nomic-bert", "nomic-bert-moe", "neo-bert", "eurobert",
    "wavtokenizer-dec", "modern-bert", "gemma-embedding", "dream", "llada", "llada-moe", "rnd1",
})


def layer_kinds(arch: str, n_layer: int, n_nextn: int, n_head_kv: tuple[int, ...], n_ff: tuple[int, ...],
                recurrent_key: list[int] | int | None = None, full_attention_interval: int | None = None
                ) -> LayerKinds:
    """The layer kinds of ``arch`` (``n_layer`` blocks of which the last ``n_nextn`` are MTP blocks)."""
    trunk = n_layer - n_nextn
    idx = range(n_layer)
    if arch in MEMORYLESS_ARCHS:
        return LayerKinds((False,) * n_layer, (False,) * n_layer, "none")
    if arch in RECURRENT_ARCHS:
        return LayerKinds((False,) * n_layer, tuple(i < trunk for i in idx), "recurrent")
    rule = HYBRID_RULES.get(arch)
    if rule == "kv0":
        recr = tuple(i < trunk and n_head_kv[i] == 0 for i in idx)
        return LayerKinds(tuple(not r for r in recr), recr, rule)
    if rule == "kv0-ff0":
        recr = tuple(i < trunk and n_head_kv[i] == 0 and n_ff[i] == 0 for i in idx)
        return LayerKinds(tuple(not recr[i] and n_ff[i] == 0 for i in idx), recr, rule)
    if rule == "both":
        return LayerKinds((True,) * n_layer, tuple(i < trunk for i in idx), rule)
    if rule == "interval":
        if isinstance(recurrent_key, list):
            marks = [bool(x) for x in (recurrent_key + [0] * n_layer)[:n_layer]]
        elif recurrent_key is not None:
            marks = [bool(recurrent_key)] * n_layer
        else:
            every = full_attention_interval or DEFAULT_FULL_ATTENTION_INTERVAL
            marks = [i < trunk and (i + 1) % every != 0 for i in idx]
        return LayerKinds(tuple(i < trunk and not marks[i] for i in idx), tuple(i < trunk and marks[i] for i in idx),
                          rule)
    # an attention model: every block, or the trunk when MTP blocks are filtered out of the main context's cache
    return LayerKinds(tuple(i < trunk for i in idx) if n_nextn else (True,) * n_layer, (False,) * n_layer,
                      "attention")


def state_widths(n_embd: int, *, wkv_head_size: int, token_shift_count: int, shortconv_l_cache: int,
                 ssm_d_conv: int, ssm_d_inner: int, ssm_d_state: int, ssm_n_group: int) -> tuple[int, int]:
    """(n_embd_r, n_embd_s): f32 elements of one recurrent layer's conv / token-shift state and of its scan state,
    per cell, as ``llama_hparams::n_embd_r`` / ``n_embd_s`` compute them."""
    if wkv_head_size:  # RWKV: token shifts and the wkv state
        return token_shift_count * n_embd, n_embd * wkv_head_size
    if shortconv_l_cache:  # LFM2's short convolution keeps l_cache - 1 columns; no scan state
        return n_embd * (shortconv_l_cache - 1), ssm_d_state * ssm_d_inner
    conv = max(ssm_d_conv - 1, 0) * (ssm_d_inner + 2 * ssm_n_group * ssm_d_state)
    return conv, ssm_d_state * ssm_d_inner
