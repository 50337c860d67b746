"""Read a GGUF file's structure (hyper-parameters and tensor layout) into a frozen ``GgufStructure``.

Only the header is parsed (``gguf.GGUFReader`` memory-maps the file; tensor data is never touched).
The structure carries everything pricing needs: per-layer KV geometry, the SWA / recurrent layer
pattern llama.cpp derives for the architecture, and every tensor with its ggml type, byte size and
absolute file offset (the mmap span is computed from offsets, not sums).

Reading a file is the one I/O step of pricing; ``load_structure`` caches by (path, size, mtime_ns).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

from fitevict.pricing.ggml_types import nbytes


class PricingError(ValueError):
    """A model file or configuration that cannot be priced; the message names the file and the problem."""


# Architectures whose memory llama.cpp builds as a plain (or sliding-window) attention KV cache.
ATTENTION_ARCHS: frozenset[str] = frozenset({
    "llama", "deci", "llama4", "mistral3", "qwen", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "phi2", "phi3",
    "phimoe", "gemma", "gemma2", "gemma3", "starcoder", "starcoder2", "granite", "granitemoe", "olmo", "olmo2",
    "olmoe", "internlm2", "stablelm", "gpt2", "gptneox", "falcon", "command-r", "cohere2", "exaone", "exaone4",
    "smollm3", "gpt-oss", "baichuan", "orion", "minicpm", "bloom", "mpt", "refact", "codeshell", "arcee",
    "ernie4_5", "ernie4_5-moe", "hunyuan-dense", "hunyuan-moe", "seed_oss", "apertus", "glm4", "glm4moe",
})
# Architectures whose memory is a recurrent state only (one cell per sequence, independent of ctx).
RECURRENT_ARCHS: frozenset[str] = frozenset({"mamba", "mamba2"})
# Hybrid: layers with head_count_kv 0 hold a recurrent state, the others a KV cache (llama_memory_hybrid).
HYBRID_ARCHS: frozenset[str] = frozenset({"jamba"})

# SWA layer pattern hard-coded per architecture in llama.cpp (src/models/<arch>.cpp: load_swa_pattern):
# (period, dense_first, default n_swa, needs the sliding_window key to be SWA at all).
# period p, dense_first False: layer il is SWA iff il % p < p - 1; dense_first True: iff il % p != 0.
SWA_PATTERNS: dict[str, tuple[int, bool, int, bool]] = {
    "gemma2": (2, False, 4096, False),
    "gemma3": (6, False, 0, True),
    "gemma3n": (5, False, 0, True),
    "cohere2": (4, False, 0, False),
    "gpt-oss": (2, False, 0, False),
    "llama4": (4, False, 0, True),
    "olmo2": (4, False, 0, True),
    "exaone4": (4, False, 0, True),
    "phi3": (1, False, 0, True),
}

_BLK = re.compile(r"^blk\.(\d+)\.")
EXPERT_RE = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")  # llama.cpp's LLM_FFN_EXPS_REGEX


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor: where it lives in the file and what it costs."""

    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]  # ne0 first, as GGUF stores it
    nbytes: int
    offset: int  # absolute file offset of the data
    layer: int | None  # blk index; None for input/output tensors
    expert: bool  # an MoE expert tensor (matches llama.cpp's --n-cpu-moe pattern)

    @property
    def role(self) -> str:
        """``input`` (token_embd & other unnumbered tensors), ``output`` (output, output_norm) or ``layer``."""
        if self.layer is not None:
            return "layer"
        if self.name.startswith(("output.", "output_norm.")):
            return "output"
        return "input"

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


@dataclass(frozen=True, slots=True)
class GgufStructure:
    """What pricing needs from a GGUF file. Per-layer tuples have ``n_layer`` entries."""

    path: str
    file_bytes: int
    arch: str
    n_layer: int
    n_embd: int
    n_vocab: int
    n_ctx_train: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]  # 0 = a layer without KV (recurrent / attention-free)
    key_length: int
    value_length: int
    n_swa: int  # sliding window; 0 = none
    swa_layers: tuple[bool, ...]
    expert_count: int
    expert_used_count: int
    ssm_d_conv: int
    ssm_d_inner: int
    ssm_d_state: int
    ssm_n_group: int
    tensors: tuple[TensorInfo, ...]
    data_offset: int
    tied_output: bool  # no output.weight: llama.cpp duplicates token_embd as the output matrix
    unsupported: str = ""  # non-empty: why the context cannot be priced for this architecture
    metadata: tuple[tuple[str, str], ...] = field(default=())

    @property
    def is_recurrent(self) -> bool:
        return self.arch in RECURRENT_ARCHS

    @property
    def is_hybrid(self) -> bool:
        return self.arch in HYBRID_ARCHS

    @property
    def is_moe(self) -> bool:
        return self.expert_count > 0

    def tensor(self, name: str) -> TensorInfo | None:
        for t in self.tensors:
            if t.name == name:
                return t
        return None

    @property
    def n_embd_r(self) -> int:
        """Recurrent conv-state width per cell (llama_hparams::n_embd_r, mamba form)."""
        return max(self.ssm_d_conv - 1, 0) * (self.ssm_d_inner + 2 * self.ssm_n_group * self.ssm_d_state)

    @property
    def n_embd_s(self) -> int:
        """Recurrent ssm-state width per cell (llama_hparams::n_embd_s, mamba form)."""
        return self.ssm_d_state * self.ssm_d_inner


def _scalar(reader: GGUFReader, key: str) -> object | None:
    f = reader.fields.get(key)
    if f is None or not f.types:
        return None
    if f.types[0] == GGUFValueType.ARRAY:
        if len(f.types) > 1 and f.types[1] == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8", "replace") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if f.types[0] == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8", "replace")
    return f.parts[f.data[0]].tolist()[0]


def _per_layer(v: object, n: int, default: int) -> tuple[int, ...]:
    if v is None:
        return (default,) * n
    if isinstance(v, list):
        vals = [int(x) for x in v]
        return tuple((vals + [vals[-1] if vals else default] * n)[:n])
    return (int(v),) * n  # type: ignore[call-overload]


def _array_len(reader: GGUFReader, key: str) -> int | None:
    f = reader.fields.get(key)
    if f is None or not f.types or f.types[0] != GGUFValueType.ARRAY:
        return None
    return len(f.data)


def parse_structure(path: str | Path) -> GgufStructure:
    """Parse ``path``. Raises PricingError naming the file for a non-GGUF, truncated or malformed file."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as err:
        raise PricingError(f"{p}: cannot read the model file: {err.strerror}") from err
    try:
        with p.open("rb") as f:
            magic = f.read(4)
    except OSError as err:
        raise PricingError(f"{p}: cannot read the model file: {err.strerror}") from err
    if magic != b"GGUF":
        raise PricingError(f"{p}: not a GGUF file (starts with {magic!r}, expected b'GGUF'); point at a .gguf model")
    try:
        reader = GGUFReader(p, "r")
    except (ValueError, IndexError, OSError, KeyError, OverflowError) as err:
        raise PricingError(f"{p}: the GGUF header cannot be read ({err}); the file is truncated or corrupt") from err

    arch = _scalar(reader, "general.architecture")
    if not isinstance(arch, str):
        raise PricingError(f"{p}: the GGUF has no general.architecture key; it is not a llama.cpp model file")

    def key(name: str) -> object | None:
        return _scalar(reader, f"{arch}.{name}")

    n_layer = int(key("block_count") or 0)  # type: ignore[arg-type]
    n_embd = int(key("embedding_length") or 0)  # type: ignore[arg-type]
    n_head = _per_layer(key("attention.head_count"), n_layer, 0)
    n_head_kv_raw = key("attention.head_count_kv")
    n_head_kv = _per_layer(n_head_kv_raw, n_layer, 0) if n_head_kv_raw is not None else n_head
    first_head = next((h for h in n_head if h), 0)
    key_length = int(key("attention.key_length") or (n_embd // first_head if first_head else 0))  # type: ignore[arg-type]
    value_length = int(key("attention.value_length") or key_length)  # type: ignore[arg-type]

    tensors: list[TensorInfo] = []
    for t in reader.tensors:
        qt = GGMLQuantizationType(int(t.tensor_type))
        shape = tuple(int(x) for x in np.asarray(t.shape).tolist())
        m = _BLK.match(t.name)
        nb = nbytes(qt, shape)
        tensors.append(TensorInfo(
            name=t.name, ggml_type=qt, shape=shape, nbytes=nb, offset=int(t.data_offset),
            layer=int(m.group(1)) if m else None, expert=bool(EXPERT_RE.search(t.name)),
        ))
    end = max((t.end for t in tensors), default=reader.data_offset)
    if end > size:
        raise PricingError(
            f"{p}: truncated: its tensors end at byte {end} but the file has {size} bytes; re-download or re-convert it"
        )
    tensors.sort(key=lambda t: t.offset)

    n_vocab = _array_len(reader, "tokenizer.ggml.tokens") or int(key("vocab_size") or 0)  # type: ignore[arg-type]
    if not n_vocab:
        te = next((t for t in tensors if t.name == "token_embd.weight"), None)
        n_vocab = te.shape[1] if te and len(te.shape) > 1 else 0

    swa_raw = key("attention.sliding_window")
    n_swa = int(swa_raw or 0)  # type: ignore[arg-type]
    swa_layers = (False,) * n_layer
    pat = SWA_PATTERNS.get(arch)
    if pat is not None:
        period, dense_first, default_swa, needs_key = pat
        if not (needs_key and swa_raw is None):
            n_swa = n_swa or default_swa
            explicit = key("attention.sliding_window_pattern")
            if isinstance(explicit, list):
                swa_layers = tuple(bool(x) for x in (explicit + [False] * n_layer)[:n_layer])
            else:
                period = int(explicit) if explicit is not None else period  # type: ignore[arg-type]
                swa_layers = tuple(
                    (period == 0 or (il % period != 0)) if dense_first else (period == 0 or il % period < period - 1)
                    for il in range(n_layer)
                )
    if not any(swa_layers):
        n_swa = 0

    unsupported = ""
    known = ATTENTION_ARCHS | RECURRENT_ARCHS | HYBRID_ARCHS
    if arch not in known:
        unsupported = (
            f"architecture {arch!r} has no KV/state rules in fitevict's pricing (known: {', '.join(sorted(known))})"
        )

    meta = tuple(
        (k, str(v)) for k in ("general.name", "general.file_type") if (v := _scalar(reader, k)) is not None
    )
    return GgufStructure(
        path=str(p), file_bytes=size, arch=arch, n_layer=n_layer, n_embd=n_embd, n_vocab=n_vocab,
        n_ctx_train=int(key("context_length") or 0),  # type: ignore[arg-type]
        n_head=n_head, n_head_kv=n_head_kv, key_length=key_length, value_length=value_length,
        n_swa=n_swa, swa_layers=swa_layers,
        expert_count=int(key("expert_count") or 0), expert_used_count=int(key("expert_used_count") or 0),  # type: ignore[arg-type]
        ssm_d_conv=int(key("ssm.conv_kernel") or 0), ssm_d_inner=int(key("ssm.inner_size") or 0),  # type: ignore[arg-type]
        ssm_d_state=int(key("ssm.state_size") or 0), ssm_n_group=int(key("ssm.group_count") or 0),  # type: ignore[arg-type]
        tensors=tuple(tensors), data_offset=int(reader.data_offset),
        tied_output=not any(t.name == "output.weight" for t in tensors),
        unsupported=unsupported, metadata=meta,
    )


@lru_cache(maxsize=256)
def _cached(path: str, size: int, mtime_ns: int) -> GgufStructure:
    return parse_structure(path)


def load_structure(path: str | Path) -> GgufStructure:
    """``parse_structure`` cached by (path, size, mtime_ns): a changed file is parsed again."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except OSError as err:
        raise PricingError(f"{p}: cannot read the model file: {err.strerror}") from err
    return _cached(p, st.st_size, st.st_mtime_ns)
