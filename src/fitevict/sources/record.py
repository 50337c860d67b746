"""What a store reader returns: one record per model a store holds, and the naming shared by the stores that keep
GGUF files in folders (the Hugging Face cache, LM Studio): ``org/name``, or ``org/name:<QUANT>`` per file when a
folder holds several quantizations."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fitevict.sources.files import GgufModel, gguf_models, hf_files, is_hf_dir, pick_projector

#: a quantization at the end of a GGUF file stem: Q4_K_M, IQ4_XS, Q8_0, TQ1_0, F16, BF16, UD-Q4_K_XL, MXFP4 ...
_QUANT_RE = re.compile(r"(?:^|[-_.])((?:UD-)?(?:[IT]?Q\d+(?:_[A-Z0-9]+)*|BF16|F16|F32|FP16|FP32|MXFP4(?:_MOE)?))$",
                       re.IGNORECASE)


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class StoreModel:
    """One model as a store holds it. Paths point into the store; nothing is copied."""

    store: str  # "ollama" | "hf-cache" | "lmstudio"
    name: str  # the name its own tools use: "qwen2.5:7b", "Qwen/Qwen3-0.6B-GGUF:Q4_K_M", "lmstudio-community/x"
    kind: str  # "gguf" | "hf" (a safetensors folder)
    path: Path  # the GGUF file (a split's first shard) or the HF folder
    files: tuple[Path, ...]  # every weight file (all shards; an HF folder's *.safetensors)
    model_dir: Path  # the folder ``gguf_files`` are named in
    gguf_files: tuple[str, ...] = ()  # the model GGUFs a request may pick (gguf_file), relative to model_dir
    mmproj: Path | None = None
    adapters: tuple[Path, ...] = ()  # LoRA adapters the store applies on this model (Ollama)
    aliases: tuple[str, ...] = ()  # other names for it: "qwen2.5" for "qwen2.5:latest", older fitevict keys
    params: Mapping[str, Any] = field(default_factory=_empty)  # Ollama's params layer, as written
    system: str | None = None  # Ollama's system layer: the default system message
    template: str | None = None  # Ollama's template layer (a Go template)


@dataclass(frozen=True, slots=True)
class StoreScan:
    """A store's models and what its reader noticed (skipped entries, layers not used)."""

    store: str
    root: Path
    models: tuple[StoreModel, ...]
    notes: tuple[str, ...] = ()


def quant_of(stem: str) -> str | None:
    """The quantization a GGUF file stem ends with, upper-cased (``Qwen3-8B-q4_k_m`` -> ``Q4_K_M``), or None."""
    m = _QUANT_RE.search(stem)
    return m[1].upper() if m else None


def variant_names(name: str, models: Sequence[GgufModel]) -> list[str]:
    """``name`` for one model; ``name:<QUANT>`` each for several, ``name:<file stem>`` where the quantization cannot
    be read from the file name or two files share one."""
    if len(models) == 1:
        return [name]
    quants = [quant_of(m.stem) for m in models]
    return [f"{name}:{q}" if q is not None and quants.count(q) == 1 else f"{name}:{m.stem}"
            for m, q in zip(models, quants)]


def folder_models(store: str, name: str, folder: Path, notes: list[str],
                  old_keys: Callable[[str, bool], Sequence[str]] | None = None) -> list[StoreModel]:
    """The models of one repository folder (its subfolders included, as split quantizations often live in
    ``Q4_K_M/``): a safetensors model or pipeline, or its GGUF models named by ``variant_names``.
    ``old_keys(stem, several)``: the names older versions gave a model (kept as aliases)."""
    names = sorted(os.listdir(folder))
    if is_hf_dir(names):
        old = tuple(old_keys(folder.name, False)) if old_keys else ()
        return [StoreModel(store, name, "hf", folder, hf_files(folder, names), folder, aliases=old)]
    found: list[tuple[str, GgufModel]] = []
    projectors: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        models, projs = gguf_models(Path(dirpath), filenames, notes)
        rel = os.path.relpath(dirpath, folder)
        found += [("" if rel == "." else rel + "/", m) for m in models]
        projectors += projs
    found.sort(key=lambda f: f[1].stem)
    gguf = [m for _, m in found]
    listed = tuple(prefix + m.files[0].name for prefix, m in found)
    proj = pick_projector(projectors)
    out = []
    for m, served in zip(gguf, variant_names(name, gguf)):
        aliases = tuple(old_keys(m.stem, len(gguf) > 1)) if old_keys else ()
        out.append(StoreModel(store, served, "gguf", m.files[0], m.files, folder, listed, proj, aliases=aliases))
    return out
