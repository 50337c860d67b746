"""The life-size zoo's recipes: models at the shapes of public models, each on the vocabulary its family uses.

The shapes are the public configs' (``config.json``): layers, widths, heads, FFN, vocabulary, training context,
rope base, norm epsilon and tied embeddings. The one model that is not a whole public model is the Qwen3 MoE: it has
Qwen3-30B-A3B's layer (2048 wide, 32 query / 4 KV heads of 128, 128 experts of which 8 are used, expert FFN 768),
vocabulary and head, and 6 of its 48 layers, so that it is 2.5 GB instead of 17.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import gguf
from gguf import GGMLQuantizationType as QT

from fitevict.zoo.recipes import Recipe, ZooError


class LifeSizeError(ZooError):
    """A life-size model that cannot be written: an unknown name, the engine's source or a binary missing."""


@dataclass(frozen=True, slots=True)
class LifeSize:
    """One life-size model: its recipe, the engine vocabulary it copies (``models/ggml-vocab-<vocab>.gguf``), the
    public model whose shape it has, and where needed a chat template (``models/templates/<template>``, used when
    the vocabulary has none) and llama.cpp's ``rope_freqs`` tensor (Llama 3.1 and later). A K-quant is made by
    ``llama-quantize`` (type ``kquant``) from the life-size model named ``source``."""

    recipe: Recipe
    vocab: str
    shape_of: str
    template: str = ""
    rope_freqs: bool = False
    kquant: str = ""
    source: str = ""

    @property
    def name(self) -> str:
        return self.recipe.name

    @property
    def quant(self) -> str:
        return self.kquant or self.recipe.weight_type.name


_LLAMA_3_2_1B = Recipe(
    name="llama-3.2-1b", arch="llama",
    description="Llama-3.2-1B's shape: 16 layers, 2048 wide, GQA 32/8, FFN 8192, 128,256-token llama-bpe "
                "vocabulary, tied, ctx 131072, Q8_0",
    weight_type=QT.Q8_0, n_vocab=128256, n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, n_ff=8192,
    n_ctx_train=131072, tied=True, rope_base=500000.0, rms_eps=1e-5,
)

LIFE_SIZE: tuple[LifeSize, ...] = (
    LifeSize(Recipe(
        name="qwen2.5-0.5b", arch="qwen2",
        description="Qwen2.5-0.5B's shape: 24 layers, 896 wide, GQA 14/2, FFN 4864, q/k/v biases, 151,936-token "
                    "qwen2 vocabulary, tied, ctx 32768, Q8_0",
        weight_type=QT.Q8_0, n_vocab=151936, n_embd=896, n_layer=24, n_head=14, n_head_kv=2, n_ff=4864,
        n_ctx_train=32768, tied=True, rope_base=1000000.0, rms_eps=1e-6,
    ), vocab="qwen2", shape_of="Qwen/Qwen2.5-0.5B-Instruct"),
    LifeSize(_LLAMA_3_2_1B, vocab="llama-bpe", shape_of="meta-llama/Llama-3.2-1B-Instruct",
             template="meta-llama-Llama-3.2-3B-Instruct.jinja", rope_freqs=True),
    LifeSize(replace(_LLAMA_3_2_1B, name="llama-3.2-1b-q4_k_m",
                     description="llama-3.2-1b made Q4_K_M by llama-quantize (from its Q8_0)"),
             vocab="llama-bpe", shape_of="meta-llama/Llama-3.2-1B-Instruct",
             template="meta-llama-Llama-3.2-3B-Instruct.jinja", rope_freqs=True, kquant="Q4_K_M",
             source="llama-3.2-1b"),
    LifeSize(Recipe(
        name="gemma-3-1b", arch="gemma3",
        description="Gemma-3-1B's shape: 26 layers, 1152 wide, MQA 4/1 of head size 256, FFN 6912, sliding "
                    "window 512 on 5 of every 6 layers, the engine's 262,144-token gemma vocabulary, tied, "
                    "ctx 32768, Q4_0",
        weight_type=QT.Q4_0, n_vocab=262144, n_embd=1152, n_layer=26, n_head=4, n_head_kv=1, n_ff=6912,
        n_ctx_train=32768, tied=True, sliding_window=512, head_dim=256, rope_base=1000000.0, rms_eps=1e-6,
    ), vocab="gemma-4", shape_of="google/gemma-3-1b-it"),
    LifeSize(Recipe(
        name="llama-3.1-8b", arch="llama",
        description="Llama-3.1-8B's shape: 32 layers, 4096 wide, GQA 32/8, FFN 14336, 128,256-token llama-bpe "
                    "vocabulary, untied, ctx 131072, Q4_0",
        weight_type=QT.Q4_0, n_vocab=128256, n_embd=4096, n_layer=32, n_head=32, n_head_kv=8, n_ff=14336,
        n_ctx_train=131072, rope_base=500000.0, rms_eps=1e-5,
    ), vocab="llama-bpe", shape_of="meta-llama/Llama-3.1-8B-Instruct",
        template="meta-llama-Llama-3.1-8B-Instruct.jinja", rope_freqs=True),
    LifeSize(Recipe(
        name="qwen3-30b-a3b-6l", arch="qwen3moe",
        description="Qwen3-30B-A3B's layer shape, 6 of its 48 layers: 2048 wide, GQA 32/4 of head size 128, "
                    "128 experts / 8 used with expert FFN 768, q/k norms, 151,936-token qwen2 vocabulary, "
                    "untied, ctx 40960, Q4_0",
        weight_type=QT.Q4_0, n_vocab=151936, n_embd=2048, n_layer=6, n_head=32, n_head_kv=4, n_ff=6144,
        n_ctx_train=40960, n_expert=128, n_expert_used=8, n_ff_exp=768, head_dim=128, rope_base=1000000.0,
        rms_eps=1e-6,
    ), vocab="qwen2", shape_of="Qwen/Qwen3-30B-A3B (6 of 48 layers)"),
    LifeSize(Recipe(
        name="bge-small-en-v1.5", arch="bert",
        description="bge-small-en-v1.5's shape: BERT, 12 layers, 384 wide, 12 heads, FFN 1536, 30,522-token "
                    "bert-bge vocabulary, 2 token types, 512 positions, CLS pooling, F16",
        weight_type=QT.F16, n_vocab=30522, n_embd=384, n_layer=12, n_head=12, n_head_kv=12, n_ff=1536,
        n_ctx_train=512,
        extra=(("layer_norm_eps", 1e-12), ("causal_attention", False), ("pooling_type", gguf.PoolingType.CLS)),
    ), vocab="bert-bge", shape_of="BAAI/bge-small-en-v1.5"),
)

LIFE_SIZE_NAMES: tuple[str, ...] = tuple(m.name for m in LIFE_SIZE)
LIFE_SIZE_BY_NAME: dict[str, LifeSize] = {m.name: m for m in LIFE_SIZE}


def life_size(name: str) -> LifeSize:
    found = LIFE_SIZE_BY_NAME.get(name)
    if found is None:
        raise LifeSizeError(f"unknown life-size model {name!r}; allowed: {', '.join(LIFE_SIZE_NAMES)}")
    return found


def resolve_life_size(only: list[str] | tuple[str, ...] | None) -> list[LifeSize]:
    """The models to write, in zoo order, with each K-quant's source before it; an unknown name raises
    LifeSizeError listing the allowed ones."""
    wanted = list(LIFE_SIZE_NAMES) if not only else list(dict.fromkeys(only))
    unknown = [n for n in wanted if n not in LIFE_SIZE_BY_NAME]
    if unknown:
        raise LifeSizeError(f"unknown life-size model {', '.join(unknown)}; allowed: {', '.join(LIFE_SIZE_NAMES)}")
    need = set(wanted) | {LIFE_SIZE_BY_NAME[n].source for n in wanted if LIFE_SIZE_BY_NAME[n].source}
    return [m for m in LIFE_SIZE if m.name in need]
