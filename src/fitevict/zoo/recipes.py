"""The zoo's recipes: one frozen record per model (architecture, sizes, quantization, seed), and the layouts."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import gguf
from gguf import GGMLQuantizationType as QT


GENERATOR_VERSION = 1
MANIFEST_NAME = "zoo-manifest.json"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Control tokens first (their ids are the ones llama.cpp's SPM defaults expect: unk 0, bos 1, eos 2).
CONTROL_TOKENS = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
UNK_ID, BOS_ID, EOS_ID, IM_START_ID, IM_END_ID = range(len(CONTROL_TOKENS))
SPACE = "\u2581"  # SentencePiece's word-boundary marker
LETTERS = "etaoinshrdlcumwfgypbvkjxqz"
EXTRA_CHARS = "ETAOINSHRDLCUMWFGYPBVKJXQZ0123456789.,!?'\"-:;()"

FILE_TYPE: dict[QT, int] = {
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
class Recipe:
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
    rope_base: float = 10000.0  # rope.freq_base
    rms_eps: float = 1e-6  # attention.layer_norm_rms_epsilon


# Fields added after the first zoo: left out of a recipe's fingerprint while at their default, so the
# manifests written before them stay current.
LATER_FIELDS: dict[str, object] = {
    "head_dim": 0, "n_ff_exp": 0, "n_ff_shexp": 0, "n_expert_shared": 0, "n_dense_lead": 0, "mla": (),
    "n_nextn": 0, "shortconv": 0, "rope_base": 10000.0, "rms_eps": 1e-6,
}


@dataclass(frozen=True, slots=True)
class Layout:
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
LAYOUTS: dict[str, Layout] = {
    "qwen2": Layout(qkv_bias=True),
    "qwen3": Layout(qk_norm=True),
    "gemma3": Layout(qk_norm=True, post_norms=True),
    "qwen2moe": Layout(qkv_bias=True, shared_expert="qwen2moe"),
    "phi3": Layout(fused_qkv=True, ffn="fused_up"),
    "deepseek2": Layout(mla=True, shared_expert="deepseek2"),
    "gpt2": Layout(layer_norm=True, fused_qkv=True, qkv_bias=True, out_bias=True, ffn="plain", ffn_bias=True,
                    pos_embd=True),
    "starcoder2": Layout(layer_norm=True, qkv_bias=True, out_bias=True, ffn="plain", ffn_bias=True),
    "qwen3moe": Layout(qk_norm=True),
    "falcon": Layout(layer_norm=True, fused_qkv=True, ffn="plain", ffn_norm=False),
    "bloom": Layout(layer_norm=True, fused_qkv=True, qkv_bias=True, out_bias=True, ffn="plain", ffn_bias=True,
                     embd_norm=True),
    "granite": Layout(),
    "cohere2": Layout(ffn_norm=False),  # LayerNorm without bias, parallel attention / FFN
}


RECIPES: tuple[Recipe, ...] = (
    Recipe(
        name="llama-gqa",
        arch="llama",
        description="dense llama, GQA 6 heads / 2 kv heads, untied output, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=3, n_head=6, n_head_kv=2, n_ff=250,
    ),
    Recipe(
        name="llama-tied",
        arch="llama",
        description="dense llama, GQA 6/2, tied embeddings (no output.weight), f32",
        weight_type=QT.F32,
        n_vocab=1003, n_embd=96, n_layer=3, n_head=6, n_head_kv=2, n_ff=250, tied=True,
    ),
    Recipe(
        name="llama-moe",
        arch="llama",
        description="Mixtral-style llama MoE, 4 experts / 2 used, GQA 6/2, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=2, n_head=6, n_head_kv=2, n_ff=136, n_expert=4, n_expert_used=2,
    ),
    Recipe(
        name="gemma2-swa",
        arch="gemma2",
        description="gemma2, sliding window 64 on every other layer, GQA 4/2, tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=4, n_head=4, n_head_kv=2, n_ff=200, tied=True, sliding_window=64,
        extra=(("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0)),
    ),
    Recipe(
        name="llama-q8_0",
        arch="llama",
        description="dense llama, GQA 5/1, Q8_0 weights (f32 norms)",
        weight_type=QT.Q8_0,
        n_vocab=1003, n_embd=160, n_layer=3, n_head=5, n_head_kv=1, n_ff=416,
    ),
    Recipe(
        name="llama-q4_0",
        arch="llama",
        description="dense llama, GQA 5/1, Q4_0 weights (f32 norms)",
        weight_type=QT.Q4_0,
        n_vocab=1003, n_embd=160, n_layer=3, n_head=5, n_head_kv=1, n_ff=416,
    ),
    Recipe(
        name="llama-medium",
        arch="llama",
        description="dense llama, 8 layers, GQA 15/5, untied, f16, about 200 MB",
        weight_type=QT.F16,
        n_vocab=12007, n_embd=960, n_layer=8, n_head=15, n_head_kv=5, n_ff=2600, n_ctx_train=8192,
    ),
    Recipe(
        name="deci-kvarray",
        arch="deci",
        description="deci (llama-like) with per-layer head_count_kv [2, 1, 3, 2] and feed_forward_length arrays, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=4, n_head=6, n_head_kv=(2, 1, 3, 2), n_ff=(200, 136, 200, 264),
    ),
    Recipe(
        name="jamba-hybrid",
        arch="jamba",
        description="jamba hybrid: mamba layers 0 and 2 (head_count_kv 0), attention layers 1 and 3 (GQA 6/2), f32",
        weight_type=QT.F32,
        n_vocab=1003, n_embd=96, n_layer=4, n_head=6, n_head_kv=(0, 2, 0, 2), n_ff=200, tied=True,
        ssm=(4, 192, 16, 6),
    ),
    Recipe(
        name="mamba",
        arch="mamba",
        description="mamba (recurrent, no KV cache), d_inner 192, d_state 16, tied, f32",
        weight_type=QT.F32,
        n_vocab=1003, n_embd=96, n_layer=2, tied=True, ssm=(4, 192, 16, 6),
    ),
    Recipe(
        name="qwen2-bias",
        arch="qwen2",
        description="qwen2: q/k/v biases, GQA 6/2, untied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=3, n_head=6, n_head_kv=2, n_ff=250, seed=1,
    ),
    Recipe(
        name="qwen3-headdim",
        arch="qwen3",
        description="qwen3: q/k norms, head_dim 32 != n_embd/n_head 16 (explicit key/value_length), GQA 5/1, tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=80, n_layer=3, n_head=5, n_head_kv=1, n_ff=232, tied=True, head_dim=32, seed=1,
    ),
    Recipe(
        name="gemma3-swa",
        arch="gemma3",
        description="gemma3: 5 of every 6 layers sliding window 48 (7 layers), head_dim 32, q/k norms, tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=7, n_head=4, n_head_kv=2, n_ff=200, tied=True, sliding_window=48,
        head_dim=32, seed=1,
    ),
    Recipe(
        name="gemma3-q4_0",
        arch="gemma3",
        description="gemma3, Q4_0 weights, n_vocab 1008 so the tied output is repacked (its own CPU_REPACK copy), "
                    "head_dim 64, window 100, MQA 5/1",
        weight_type=QT.Q4_0,
        n_vocab=1008, n_embd=160, n_layer=7, n_head=5, n_head_kv=1, n_ff=416, tied=True, sliding_window=100,
        head_dim=64, seed=1,
    ),
    Recipe(
        name="cohere2-swa",
        arch="cohere2",
        description="cohere2: 3 of every 4 layers sliding window 40 (5 layers), parallel attention/FFN with one "
                    "bias-free LayerNorm, logit scale, GQA 6/2, tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=5, n_head=6, n_head_kv=2, n_ff=250, tied=True, sliding_window=40, seed=1,
        extra=(("logit_scale", 0.125), ("layer_norm_eps", 1e-5)),
    ),
    Recipe(
        name="qwen2moe-shexp",
        arch="qwen2moe",
        description="qwen2moe: 6 experts / 2 used (expert FFN 72) plus a gated shared expert (FFN 136), GQA 6/2, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=2, n_head=6, n_head_kv=2, n_ff=250, n_expert=6, n_expert_used=2,
        n_ff_exp=72, n_ff_shexp=136, seed=1,
    ),
    Recipe(
        name="phi-fusedqkv",  # a general.name containing "phi3" makes llama.cpp require <|endoftext|>
        arch="phi3",
        description="phi3: fused attn_qkv and fused gate/up FFN, GQA 6/3, untied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=3, n_head=6, n_head_kv=3, n_ff=250, seed=1,
    ),
    Recipe(
        name="deepseek2-mla",
        arch="deepseek2",
        description="deepseek2 MLA (kv_lora_rank 64, rope 32, q_lora_rank 48), 1 dense + 2 MoE layers "
                    "(4 experts / 2 used, 1 shared, expert FFN 64) + 1 MTP block, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=4, n_head=4, n_head_kv=1, n_ff=200, n_expert=4, n_expert_used=2,
        n_ff_exp=64, n_expert_shared=1, n_dense_lead=1, mla=(64, 48, 32, 24, 40), n_nextn=1, seed=1,
        extra=(("expert_weights_scale", 1.0),),
    ),
    Recipe(
        name="gpt2-ln",
        arch="gpt2",
        description="gpt2: LayerNorm with bias, learned absolute positions, fused qkv with bias, no GQA (4 heads), "
                    "tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=3, n_head=4, n_head_kv=4, n_ff=260, tied=True, seed=1,
    ),
    Recipe(
        name="qwen3moe",
        arch="qwen3moe",
        description="qwen3moe: 8 experts / 2 used with expert FFN 56 (no shared expert), q/k norms, GQA 6/2, tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=2, n_head=6, n_head_kv=2, n_ff=250, n_expert=8, n_expert_used=2,
        n_ff_exp=56, tied=True, seed=1,
    ),
    Recipe(
        name="falcon-mqa",
        arch="falcon",
        description="falcon: multi-query attention (1 kv head of 6), fused qkv, parallel attention/FFN with one "
                    "LayerNorm, untied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=3, n_head=6, n_head_kv=1, n_ff=384, seed=1,
    ),
    Recipe(
        name="bloom-alibi",
        arch="bloom",
        description="bloom: ALiBi (no rope), token_embd_norm, LayerNorm with bias, fused qkv with bias, 4 heads, "
                    "tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=3, n_head=4, n_head_kv=4, n_ff=384, tied=True, seed=1,
    ),
    Recipe(
        name="granite-scaled",
        arch="granite",
        description="granite: llama blocks with logit / residual / embedding / attention scales, GQA 6/2, tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=3, n_head=6, n_head_kv=2, n_ff=250, tied=True, seed=1,
        extra=(("logit_scale", 6.0), ("residual_scale", 0.22), ("embedding_scale", 12.0),
               ("attention_scale", 0.0625)),
    ),
    Recipe(
        name="qwen2-k256",
        arch="qwen2",
        description="qwen2 with k-quant-friendly rows (n_embd 256, head_dim 64), FFN 320, GQA 4/1, untied, f16; "
                    "the source for a llama-quantize Q4_K_M copy",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=256, n_layer=2, n_head=4, n_head_kv=1, n_ff=320, seed=1,
    ),
    Recipe(
        name="starcoder2-gqa",
        arch="starcoder2",
        description="starcoder2: LayerNorm with bias, q/k/v/out and FFN biases, plain GELU FFN, GQA 6/2, untied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=3, n_head=6, n_head_kv=2, n_ff=250, seed=1,
    ),
    Recipe(
        name="lfm2-shortconv",
        arch="lfm2",
        description="lfm2 hybrid: short-convolution layers 0, 1, 3 (l_cache 3, head_count_kv 0) and attention "
                    "layers 2, 4 (GQA 6/2, q/k norms), tied, f16",
        weight_type=QT.F16,
        n_vocab=1003, n_embd=96, n_layer=5, n_head=6, n_head_kv=(0, 0, 2, 0, 2), n_ff=200, tied=True,
        shortconv=3, seed=1,
    ),
    Recipe(
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


# Pure mamba2 models kept outside the zoo (written with ``zoo.write.write_gguf``): ggml-vulkan runs a mamba2 SSM scan
# for a state of 128 or 256 only, so these two differ in what a Vulkan device takes while their weights' types and
# shapes agree (``pricing/backends.op_context``).
MAMBA2_BY_STATE: tuple[Recipe, ...] = tuple(
    Recipe(name=f"mamba2-state{d_state}", arch="mamba2", weight_type=QT.F32, n_vocab=1003, n_embd=256, n_layer=2,
           tied=True, ssm=(4, 512, d_state, 8, 2), seed=3,
           description=f"pure mamba2: d_inner 512 in 8 heads of 64, 2 groups, state {d_state}, tied, f32")
    for d_state in (16, 128))


class ZooError(ValueError):
    """A zoo request that cannot be carried out (unknown name, unwritable directory)."""


def _up64(n: int) -> int:
    return -(-n // 64) * 64


def _realistic(r: Recipe) -> Recipe:
    """Zoo v2: the same model with the shapes real models have: 64-wide heads (n_embd = heads * 64), FFN, expert,
    MLA and SSM widths rounded up to multiples of 64. The CPU kernels (repack, AMX, bitsandbytes) take paths by
    these shapes, so a test model with toy shapes exercises a path real models never take."""
    ff = tuple(_up64(f) for f in r.n_ff) if isinstance(r.n_ff, tuple) else _up64(r.n_ff)
    n_embd = r.n_head * 64 if r.n_head else _up64(r.n_embd * 2)
    changes: dict[str, object] = {"n_embd": n_embd, "n_ff": ff, "n_ff_exp": _up64(r.n_ff_exp) if r.n_ff_exp else 0,
                                  "n_ff_shexp": _up64(r.n_ff_shexp) if r.n_ff_shexp else 0}
    if r.head_dim:
        changes["head_dim"] = 64
    if r.mla:
        changes["mla"] = (64, 64, 64, 64, 64)  # kv_lora, q_lora, rope, nope, v_head
    if r.ssm:  # d_inner 2 * n_embd (llama.cpp's one expansion), dt_rank n_embd / 16 (mamba2: its head count)
        d_conv, _inner, d_state, dt_rank, *groups = r.ssm
        changes["ssm"] = (d_conv, 2 * n_embd, d_state, dt_rank if groups else n_embd // 16, *groups)
    return replace(r, **changes)  # type: ignore[arg-type]


# Zoo v1 is frozen: the known answers measured on other machines (tests/data/hardware) were made with its files.
# v2 (the default) has realistic shapes; "llama-odd" keeps v1's uneven ones on purpose (n_embd 96 in 16-wide
# heads, FFN 250), the one model whose shapes no kernel was made for.
ZOO_VERSION = 2
_ODD = replace(RECIPES[0], name="llama-odd", description="dense llama with deliberately uneven shapes (n_embd 96 in "
               "6 heads of 16, FFN 250, n_vocab 1003): zoo v1's llama-gqa, kept to test what odd shapes do")
_VERSIONS: dict[int, tuple[Recipe, ...]] = {1: RECIPES, 2: (*(_realistic(r) for r in RECIPES), _ODD)}


def recipes(version: int = ZOO_VERSION) -> tuple[Recipe, ...]:
    if version not in _VERSIONS:
        raise ZooError(f"zoo version {version}: use {' or '.join(map(str, _VERSIONS))}")
    return _VERSIONS[version]


def recipe(name: str, version: int = ZOO_VERSION) -> Recipe:
    found = next((r for r in recipes(version) if r.name == name), None)
    if found is None:
        names = ", ".join(r.name for r in recipes(version))
        raise ZooError(f"unknown zoo model {name!r} in zoo v{version}; allowed: {names}")
    return found


ZOO_NAMES: tuple[str, ...] = tuple(r.name for r in recipes())
BY_NAME: dict[str, Recipe] = {r.name: r for r in recipes()}
