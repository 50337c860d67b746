"""Read a GGUF file's structure (hyper-parameters and tensor layout) into a frozen ``GgufStructure``.

Only the header is parsed (``gguf_header.read_header``: scalars and short arrays decoded, the vocabulary's long
arrays stepped over by length; tensor data is never touched).
The structure carries everything pricing needs: per-layer KV geometry, the SWA / recurrent layer
pattern llama.cpp derives for the architecture, and every tensor with its ggml type, byte size and
absolute file offset (the mmap span is computed from offsets, not sums).

Reading a file is the one I/O step of pricing; ``load_structure`` caches by (path, size, mtime_ns).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gguf import GGMLQuantizationType

from fitevict.pricing.perfile import PerFile
from fitevict.pricing.ggml_types import nbytes
from fitevict.pricing.gguf_header import Header, HeaderError, read_header
from fitevict.pricing.layers import (
    HYBRID_RULES,
    MEMORYLESS_ARCHS,
    RECURRENT_ARCHS,
    SWA_ON_ATTENTION,
    LayerKinds,
    layer_kinds,
    state_widths,
)


class PricingError(ValueError):
    """A model file or configuration that cannot be priced; the message names the file and the problem."""


# Architectures whose memory llama.cpp builds as a plain (or sliding-window) attention KV cache
# (llama_model::create_memory's default branch, neither recurrent nor hybrid, no per-arch cache class).
ATTENTION_ARCHS: frozenset[str] = frozenset({
    "llama", "deci", "llama4", "mistral3", "qwen", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "phi2", "phi3",
    "phimoe", "gemma", "gemma2", "gemma3", "starcoder", "starcoder2", "granite", "granitemoe", "olmo", "olmo2",
    "olmoe", "internlm2", "stablelm", "gpt2", "gptneox", "falcon", "command-r", "cohere2", "exaone", "exaone4",
    "smollm3", "gpt-oss", "baichuan", "orion", "minicpm", "bloom", "mpt", "refact", "codeshell", "arcee",
    "ernie4_5", "ernie4_5-moe", "hunyuan-dense", "hunyuan-moe", "seed_oss", "apertus", "glm4", "glm4moe",
    "deepseek", "deepseek2", "minicpm3",
})
# Recurrent (RECURRENT_ARCHS) and hybrid (HYBRID_RULES) architectures: see layers.py.
HYBRID_ARCHS: frozenset[str] = frozenset(HYBRID_RULES)

# Architectures whose loader marks the MTP blocks (block index >= n_layer - nextn_predict_layers) TENSOR_SKIP
# unless MTP speculative decoding is on: their weights are in the file but in no buffer.
MTP_SKIP_ARCHS: frozenset[str] = frozenset({
    "deepseek2", "deepseek32", "deepseek4", "glm4moe", "glm-dsa", "glm5-next", "qwen3next", "qwen35", "qwen35moe",
    "mimo2", "step35", "hy_v3", "cohere2moe", "bailingmoe3", "nemotron_h",
})


@dataclass(frozen=True, slots=True)
class SwaRule:
    """How an architecture's ``load_arch_hparams`` (src/models/<arch>.cpp) turns on sliding-window attention.

    ``period``/``dense_first`` are ``load_swa_pattern``'s defaults (a ``sliding_window_pattern`` key, number or
    per-layer array, overrides them): dense_first False makes layer il SWA iff ``il % p < p - 1``, True iff
    ``il % p != 0``. ``window`` is the n_swa llama.cpp sets itself (0: only the ``sliding_window`` key);
    ``forced`` means that value wins over the key. ``when``: "always"; "key>0" (the key is present and
    positive); "key!=0" (unless the key is present and 0); "n_layer=N" (only for that depth).
    """

    period: int
    dense_first: bool = False
    window: int = 0
    forced: bool = False
    when: str = "always"


# One row per architecture, as hard-coded in llama.cpp 0c1e570.
SWA_RULES: dict[str, SwaRule] = {
    "gemma2": SwaRule(2, window=4096),
    "gemma3": SwaRule(6, when="key>0"),
    "gemma3n": SwaRule(5),
    "cohere2": SwaRule(4),
    "cohere2moe": SwaRule(4, dense_first=True),
    "gpt-oss": SwaRule(2),
    "llama4": SwaRule(4, window=8192, forced=True, when="key!=0"),  # chunked attention, always 8192
    "olmo2": SwaRule(4, when="key>0"),
    "exaone4": SwaRule(4, window=4096, when="n_layer=64"),
    "exaone-moe": SwaRule(4, window=128),
    "afmoe": SwaRule(4, when="key>0"),
    "mellum": SwaRule(4, when="key>0"),
    "plamo3": SwaRule(8, when="key>0"),
    "smallthinker": SwaRule(4, dense_first=True, window=4096, forced=True, when="key>0"),
    "muse-glimmer": SwaRule(4),
    # phi3 reads sliding_window but llama.cpp disables Phi SWA (swa_type NONE): no row.
}


def swa_layout(arch: str, n_layer: int, window_key: int | None,
               pattern_key: int | list[int] | None) -> tuple[int, tuple[bool, ...]]:
    """(n_swa, per-layer is-SWA) as llama.cpp derives them for ``arch``; (0, all False) without SWA."""
    none = (0, (False,) * n_layer)
    rule = SWA_RULES.get(arch)
    if rule is None:
        return none
    on = {
        "always": True,
        "key>0": window_key is not None and window_key > 0,
        "key!=0": window_key is None or window_key != 0,
    }.get(rule.when, rule.when == f"n_layer={n_layer}")
    if not on:
        return none
    n_swa = rule.window if rule.forced else (window_key if window_key is not None else rule.window)
    if isinstance(pattern_key, list):
        layers = tuple(bool(x) for x in (pattern_key + [0] * n_layer)[:n_layer])
    else:
        p = rule.period if pattern_key is None else int(pattern_key)
        layers = tuple(
            (p == 0 or il % p != 0) if rule.dense_first else (p == 0 or il % p < p - 1) for il in range(n_layer)
        )
    if not n_swa or not any(layers):
        return none
    return n_swa, layers


BLOCK_RE = re.compile(r"^blk\.(\d+)\.")
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
    key_length_swa: int = 0  # head sizes of SWA layers (attention.key/value_length_swa; default the full ones)
    value_length_swa: int = 0
    mla: bool = False  # multi-head latent attention: K cache only, key_length wide, one kv head
    n_layer_nextn: int = 0  # trailing next-token-prediction (MTP) blocks: no KV cache, weights not loaded
    n_embd_out_key: int = 0  # embedding_length_out (hparams.n_embd_out_impl); 0 = n_embd
    pooling_type: int | None = None  # {arch}.pooling_type (llama_pooling_type); None: the file declares none
    # per block: holds an attention KV cache / a recurrent state (layers.layer_kinds); () = derive the default
    layer_attention: tuple[bool, ...] = ()
    layer_recurrent: tuple[bool, ...] = ()
    wkv_head_size: int = 0  # RWKV
    token_shift_count: int = 2  # RWKV
    shortconv_l_cache: int = 0  # LFM2 short convolution
    n_merges: int = 0  # tokenizer.ggml.merges entries (a BPE vocabulary's merge ranks)

    @property
    def n_embd_out(self) -> int:
        """hparams.n_embd_out(): the width of one embedding output."""
        return self.n_embd_out_key or self.n_embd

    @property
    def n_layer_trunk(self) -> int:
        """hparams.n_layer(): the blocks the main graph runs (block_count minus the MTP blocks)."""
        return self.n_layer - self.n_layer_nextn
    metadata: tuple[tuple[str, str], ...] = field(default=())

    def head_k(self, il: int) -> int:
        """n_embd_head_k(il): the SWA layers' own key size where the file gives one."""
        return (self.key_length_swa or self.key_length) if self.swa_layers[il] else self.key_length

    def head_v(self, il: int) -> int:
        return (self.value_length_swa or self.value_length) if self.swa_layers[il] else self.value_length

    @property
    def is_recurrent(self) -> bool:
        return self.arch in RECURRENT_ARCHS

    @property
    def is_moe(self) -> bool:
        return self.expert_count > 0

    def dominant_type(self) -> str:
        """The ggml type holding the most weight bytes: the file's quantization, for signatures and Ollama's
        ``quantization_level``."""
        by_type: dict[str, int] = {}
        for t in self.tensors:
            by_type[t.ggml_type.name] = by_type.get(t.ggml_type.name, 0) + t.nbytes
        return max(by_type, key=by_type.__getitem__) if by_type else "unknown"

    def tensor(self, name: str) -> TensorInfo | None:
        for t in self.tensors:
            if t.name == name:
                return t
        return None

    def _widths(self) -> tuple[int, int]:
        return state_widths(self.n_embd, wkv_head_size=self.wkv_head_size, token_shift_count=self.token_shift_count,
                            shortconv_l_cache=self.shortconv_l_cache, ssm_d_conv=self.ssm_d_conv,
                            ssm_d_inner=self.ssm_d_inner, ssm_d_state=self.ssm_d_state, ssm_n_group=self.ssm_n_group)

    @property
    def n_embd_r(self) -> int:
        """Recurrent conv / token-shift state width per cell (llama_hparams::n_embd_r)."""
        return self._widths()[0]

    @property
    def n_embd_s(self) -> int:
        """Recurrent scan / wkv state width per cell (llama_hparams::n_embd_s)."""
        return self._widths()[1]

    @property
    def kinds(self) -> LayerKinds:
        """Per block: KV cache and / or recurrent state (layers.layer_kinds)."""
        return LayerKinds(tuple(self.has_kv(il) for il in range(self.n_layer)),
                          tuple(self.has_state(il) for il in range(self.n_layer)), "")

    def has_kv(self, il: int) -> bool:
        """Block ``il`` holds an attention KV cache in the main context."""
        return self.layer_attention[il] if self.layer_attention else il < self.n_layer_trunk

    def has_state(self, il: int) -> bool:
        """Block ``il`` holds a recurrent state."""
        return bool(self.layer_recurrent) and self.layer_recurrent[il]


def _per_layer(v: object, n: int, default: int) -> tuple[int, ...]:
    if v is None:
        return (default,) * n
    if isinstance(v, list):
        vals = [int(x) for x in v]
        return tuple((vals + [vals[-1] if vals else default] * n)[:n])
    return (int(v),) * n  # type: ignore[call-overload]


def parse_structure(path: str | Path) -> GgufStructure:
    """Parse ``path``. Raises PricingError naming the file for a non-GGUF, truncated or malformed file."""
    p = Path(path)
    size, header = _open(p)
    arch = header.scalar("general.architecture")
    if not isinstance(arch, str):
        raise PricingError(f"{p}: the GGUF has no general.architecture key; it is not a llama.cpp model file")

    def key(name: str) -> object | None:
        v = header.scalar(f"{arch}.{name}")
        return list(v) if isinstance(v, tuple) else v

    n_layer = int(key("block_count") or 0)  # type: ignore[arg-type]
    n_embd = int(key("embedding_length") or 0)  # type: ignore[arg-type]
    heads = _heads(key, n_layer, n_embd)
    tensors = _tensors(header, p, size)
    n_vocab = header.array_len("tokenizer.ggml.tokens") or int(key("vocab_size") or 0)  # type: ignore[arg-type]
    if not n_vocab:
        te = next((t for t in tensors if t.name == "token_embd.weight"), None)
        n_vocab = te.shape[1] if te and len(te.shape) > 1 else 0
    layout = _layout(arch, key, n_layer, heads["n_head_kv"])
    meta = tuple(
        (k, str(v)) for k in ("general.name", "general.file_type") if (v := header.scalar(k)) is not None
    )
    return GgufStructure(
        path=str(p), file_bytes=size, arch=arch, n_layer=n_layer, n_embd=n_embd, n_vocab=n_vocab,
        n_ctx_train=int(key("context_length") or 0),  # type: ignore[arg-type]
        **heads, **layout, n_embd_out_key=int(key("embedding_length_out") or 0),  # type: ignore[call-overload]
        expert_count=int(key("expert_count") or 0), expert_used_count=int(key("expert_used_count") or 0),  # type: ignore[arg-type]
        ssm_d_conv=int(key("ssm.conv_kernel") or 0), ssm_d_inner=int(key("ssm.inner_size") or 0),  # type: ignore[arg-type]
        ssm_d_state=int(key("ssm.state_size") or 0), ssm_n_group=int(key("ssm.group_count") or 0),  # type: ignore[arg-type]
        tensors=tuple(tensors), data_offset=header.data_offset,
        tied_output=not any(t.name == "output.weight" for t in tensors),
        unsupported=_unsupported(arch), metadata=meta,
        pooling_type=int(pt) if (pt := key("pooling_type")) is not None else None,  # type: ignore[call-overload]
        wkv_head_size=int(key("wkv.head_size") or 0),  # type: ignore[call-overload]
        token_shift_count=int(key("token_shift_count") or 2),  # type: ignore[call-overload]
        shortconv_l_cache=int(key("shortconv.l_cache") or 0),  # type: ignore[call-overload]
        n_merges=header.array_len("tokenizer.ggml.merges") or 0,
    )


def _open(p: Path) -> tuple[int, Header]:
    """The file's size and its header; PricingError for an unreadable, non-GGUF or corrupt file."""
    try:
        size = p.stat().st_size
        return size, read_header(p)
    except OSError as err:
        raise PricingError(f"{p}: cannot read the model file: {err.strerror}") from err
    except HeaderError as err:
        if str(err).startswith("not a GGUF file"):
            raise PricingError(f"{p}: {err}; point at a .gguf model") from err
        raise PricingError(f"{p}: the GGUF header cannot be read ({err}); the file is truncated or corrupt") from err


def _heads(key: Callable[[str], object | None], n_layer: int, n_embd: int) -> dict[str, Any]:
    """The attention geometry: heads per layer and the K/V head sizes (full, sliding-window, MLA)."""
    n_head = _per_layer(key("attention.head_count"), n_layer, 0)
    n_head_kv_raw = key("attention.head_count_kv")
    n_head_kv = _per_layer(n_head_kv_raw, n_layer, 0) if n_head_kv_raw is not None else n_head
    first_head = next((h for h in n_head if h), 0)
    head = n_embd // first_head if first_head else 0  # llama.cpp's default for both head sizes
    key_length = int(key("attention.key_length") or head)  # type: ignore[arg-type]
    value_length = int(key("attention.value_length") or head)  # type: ignore[arg-type]
    key_length_swa = int(key("attention.key_length_swa") or key_length)  # type: ignore[arg-type]
    value_length_swa = int(key("attention.value_length_swa") or value_length)  # type: ignore[arg-type]
    # MLA (hparams.is_mla): the cache holds one latent row per token (K only; V is a view of it)
    mla = bool(key("attention.key_length_mla")) and bool(key("attention.value_length_mla"))
    return {"n_head": n_head, "n_head_kv": n_head_kv, "key_length": key_length, "value_length": value_length,
            "key_length_swa": key_length_swa, "value_length_swa": value_length_swa, "mla": mla}


def _tensors(header: Header, p: Path, size: int) -> list[TensorInfo]:
    """Every tensor, in file order; PricingError for an unknown type or when they end past the file's size."""
    tensors: list[TensorInfo] = []
    for t in header.tensors:
        try:
            qt = GGMLQuantizationType(t.ggml_type)
        except ValueError:
            raise PricingError(f"{p}: tensor {t.name} has ggml type {t.ggml_type}, which this gguf library does not "
                               "know; the file is corrupt or newer than fitevict") from None
        m = BLOCK_RE.match(t.name)
        tensors.append(TensorInfo(
            name=t.name, ggml_type=qt, shape=t.shape, nbytes=nbytes(qt, t.shape), offset=t.offset,
            layer=int(m.group(1)) if m else None, expert=bool(EXPERT_RE.search(t.name)),
        ))
    end = max((t.end for t in tensors), default=0)  # a file without tensors (a vocabulary) needs no padding
    if end > size:
        raise PricingError(
            f"{p}: truncated: its tensors end at byte {end} but the file has {size} bytes; re-download or re-convert it"
        )
    tensors.sort(key=lambda t: t.offset)
    return tensors


def _layout(arch: str, key: Callable[[str], object | None], n_layer: int,
            n_head_kv: tuple[int, ...]) -> dict[str, Any]:
    """The layer pattern llama.cpp derives: which blocks hold KV or recurrent state, the sliding window and the
    next-token-prediction blocks."""
    n_nextn = min(int(key("nextn_predict_layers") or 0), n_layer)  # type: ignore[call-overload]
    swa_raw = key("attention.sliding_window")
    pattern_raw = key("attention.sliding_window_pattern")
    window = int(swa_raw) if swa_raw is not None else None  # type: ignore[call-overload]
    pattern = pattern_raw if isinstance(pattern_raw, list) or pattern_raw is None else int(pattern_raw)  # type: ignore[call-overload]
    n_ff = _per_layer(key("feed_forward_length"), n_layer, 0)
    recr_raw = key("attention.recurrent_layers")
    recr_key = recr_raw if isinstance(recr_raw, list) or recr_raw is None else int(recr_raw)  # type: ignore[call-overload]
    interval = int(key("full_attention_interval") or 0) or None  # type: ignore[call-overload]
    kinds = layer_kinds(arch, n_layer, n_nextn, n_head_kv, n_ff, recr_key, interval)
    n_swa, swa_layers = swa_layout(arch, n_layer - n_nextn, window, pattern)
    swa_layers = swa_layers + (False,) * n_nextn
    if arch in SWA_ON_ATTENTION and window:  # lfm2: the window applies to every attention layer
        n_swa = window
        swa_layers = tuple(il < n_layer - n_nextn and not kinds.recurrent[il] for il in range(n_layer))
    return {"n_swa": n_swa, "swa_layers": swa_layers, "n_layer_nextn": n_nextn,
            "layer_attention": kinds.attention, "layer_recurrent": kinds.recurrent}


def _unsupported(arch: str) -> str:
    """Why an architecture's context cannot be priced ("" when its KV/state rules are known)."""
    known = ATTENTION_ARCHS | RECURRENT_ARCHS | HYBRID_ARCHS | MEMORYLESS_ARCHS
    if arch in known:
        return ""
    return (
        f"architecture {arch!r} has no KV/state rules in fitevict's pricing ({len(known)} known, e.g. "
        f"{', '.join(sorted(known)[:6])}, ...); its weights are priced from the file, its context is not. "
        "Run it once with llama-server -lv 4 and read the KV buffer lines"
    )


FileKey = tuple[str, int, int, int]  # (path, size, mtime_ns, inode): a file as parsed; any change parses it again


class StructureShelf(Protocol):
    """A place that keeps parsed structures across processes (the store's ``store.structures.StoredStructures``).

    ``get`` must not block on I/O (it is called on the event loop): a shelf reads what it holds ahead."""

    def get(self, key: FileKey) -> GgufStructure | None: ...

    def put(self, key: FileKey, structure: GgufStructure) -> None: ...


_shelves: list[StructureShelf] = []  # the newest first; one per running front door or CLI command


def use_shelf(shelf: StructureShelf) -> Callable[[], None]:
    """Consult ``shelf`` before parsing, and give it what is parsed; returns the call that stops that."""
    _shelves.insert(0, shelf)
    _cached.cache_clear()
    return lambda: _shelves.remove(shelf) if shelf in _shelves else None


def _parse(path: str, size: int, mtime_ns: int, inode: int) -> GgufStructure:
    key = (path, size, mtime_ns, inode)
    shelf = _shelves[0] if _shelves else None
    if shelf is not None and (kept := shelf.get(key)) is not None:
        return kept
    parsed = parse_structure(path)
    if shelf is not None:
        shelf.put(key, parsed)
    return parsed


_cached = PerFile(_parse)  # the latest parse per path (pricing.perfile)


def file_key(path: str | Path, what: str = "model file") -> FileKey:
    """(path, size, mtime_ns, inode): what a parse is kept by, here and in the store."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except OSError as err:
        raise PricingError(f"{p}: cannot read the {what}: {err.strerror}") from err
    return p, st.st_size, st.st_mtime_ns, st.st_ino


def file_identity(path: str | Path, what: str = "model file") -> tuple[str, int, int]:
    """(path, size, mtime_ns): the key a parse is cached by, so a changed file is parsed again."""
    return file_key(path, what)[:3]


def load_structure(path: str | Path) -> GgufStructure:
    """``parse_structure`` kept by ``file_key``: in this process, then on the newest shelf (the store)."""
    return _cached(*file_key(path))
