"""Demo LoRA adapters for the zoo: small, deterministic GGUF adapters that llama-server really applies.

An adapter for the zoo model ``<base>`` is written as ``<base>.adapters/<name>.gguf`` beside ``<base>.gguf``
(the catalog's convention: it serves as ``<base>:<name>``). The file follows the pinned llama.cpp's adapter
loader (``src/llama-adapter.cpp``): ``general.type = adapter``, ``adapter.type = lora``,
``adapter.lora.alpha``, ``general.architecture`` equal to the base's, and for each adapted weight ``W`` a pair
``W.lora_a`` (ggml ``ne = [n_in, r]``) and ``W.lora_b`` (``ne = [r, n_out]``), f32. The engine applies
``W x + scale * (alpha / r) * B (A x)``.

The pairs adapt the attention q / v projections and the output matrix of every block, with weights large
enough that greedy decoding follows each adapter: two adapters give different tokens, and a scale of 0 gives
the base's.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from fitevict.pricing.gguf import load_structure
from fitevict.zoo import BY_NAME, ZooError

ADAPTER_DIR_SUFFIX = ".adapters"
DEMO_ADAPTERS: tuple[str, ...] = ("sql", "poem", "math", "chat")
DEMO_BASE = "llama-gqa"
#: weights each demo adapter adapts (suffixes of the base's tensor names)
_TARGETS: tuple[str, ...] = ("attn_q.weight", "attn_v.weight", "output.weight")


@dataclass(frozen=True, slots=True)
class ZooAdapter:
    """One written adapter. ``file_bytes`` is its size on disk (a file-size figure, not a memory price)."""

    base: str
    name: str
    path: Path
    rank: int
    file_bytes: int


def adapter_dir(base_file: Path) -> Path:
    """Where the adapters of the GGUF ``base_file`` live: ``<stem>.adapters/`` beside it."""
    return base_file.with_name(base_file.name[: -len(".gguf")] + ADAPTER_DIR_SUFFIX)


def _pairs(base_file: Path, rank: int) -> list[tuple[str, tuple[int, int], tuple[int, int]]]:
    """(weight name, numpy shape of lora_a, numpy shape of lora_b) per adapted weight of the base file as written
    (whichever zoo version wrote it).

    Numpy shapes are ggml's ``ne`` reversed: ``lora_a`` ne ``[n_in, r]`` is ``(r, n_in)``."""
    out = []
    for t in load_structure(base_file).tensors:
        if len(t.shape) == 2 and t.name.endswith(_TARGETS):
            n_in, n_out = t.shape
            out.append((t.name, (rank, n_in), (n_out, rank)))
    return out


def _data(base: str, adapter: str, tensor: str, shape: tuple[int, int], std: float) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(f"{base}:{adapter}/{tensor}".encode()))
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)


def write_adapter(base_file: Path, base: str, name: str, *, rank: int = 8) -> ZooAdapter:
    """Write the demo adapter ``name`` for the zoo model ``base`` (whose file is ``base_file``)."""
    recipe = BY_NAME.get(base)
    if recipe is None:
        raise ZooError(f"unknown zoo model {base!r}; adapters can be written for: {', '.join(sorted(BY_NAME))}")
    pairs = _pairs(base_file, rank)
    if not pairs:
        raise ZooError(f"zoo model {base!r} has no 2-D weights named *{', *'.join(_TARGETS)} to adapt")
    folder = adapter_dir(base_file)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.gguf"
    tmp = folder / f".{name}.gguf.tmp-{os.getpid()}"
    w = gguf.GGUFWriter(tmp, recipe.arch)
    try:
        w.add_type(gguf.GGUFType.ADAPTER)
        w.add_string(gguf.Keys.Adapter.TYPE, "lora")
        w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(rank))  # scale = alpha / r = 1
        w.add_name(f"fitevict zoo {base}:{name}")
        for weight, a_shape, b_shape in pairs:
            w.add_tensor(f"{weight}.lora_a", _data(base, name, weight + ".a", a_shape, 0.5))
            w.add_tensor(f"{weight}.lora_b", _data(base, name, weight + ".b", b_shape, 0.5))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    try:
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return ZooAdapter(base, name, path, rank, path.stat().st_size)


def write_adapters(dest: Path, *, base: str = DEMO_BASE, names: Iterable[str] = DEMO_ADAPTERS,
                   rank: int = 8) -> list[ZooAdapter]:
    """The demo adapters of ``base`` (whose file ``dest/<base>.gguf`` must exist), rewritten each time: a few
    KiB each, deterministic."""
    base_file = Path(dest) / f"{base}.gguf"
    if not base_file.is_file():
        raise ZooError(f"{base_file}: the base model is missing; write it first (fitevict demo-models {dest} "
                       f"--only {base})")
    return [write_adapter(base_file, base, n, rank=rank) for n in names]


__all__ = ["ADAPTER_DIR_SUFFIX", "DEMO_ADAPTERS", "DEMO_BASE", "ZooAdapter", "adapter_dir", "write_adapter",
           "write_adapters"]
