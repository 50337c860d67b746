"""Adapters in the catalog: LoRA adapters become models ``<base key>:<adapter>`` served on their base's seat.

The convention (one, documented in docs/adapters.md):
- a GGUF LoRA adapter (``general.type = adapter``, ``adapter.type = lora``) in ``<base file stem>.adapters/``
  beside the base GGUF is the model ``<base key>:<adapter file stem>``;
- a PEFT adapter folder (``adapter_config.json``) whose ``base_model_name_or_path`` names a model in the catalog
  (its key, an alias, ``owner/repo`` or its folder) is ``<base key>:<folder name>``, engine ``transformers``;
- a ``[models.<key>]`` entry with ``path`` (the adapter file or folder) and ``base`` names any adapter.

A base's entry lists every adapter its engine loads (``loras``, in key order): a GGUF base its GGUF adapters, an
HF base its PEFT folders. Its seat starts with all of them, priced together, so that switching adapters never
reloads the base.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from fitevict.config import ConfigError, ModelConfig
from fitevict.engines import adapter_kind_of, engine_for_adapter, traits
from fitevict.pricing.lora import is_lora_gguf
from fitevict.pricing.peft import PEFT_CONFIG, PEFT_WEIGHTS

ADAPTER_DIR_SUFFIX = ".adapters"


def adapter_folder(base_file: Path, stem: str) -> Path:
    """``<stem>.adapters/`` beside the base's file."""
    return base_file.parent / f"{stem}{ADAPTER_DIR_SUFFIX}"


def is_adapter_folder(folder: Path, names: Iterable[str]) -> bool:
    """True for ``X.adapters/`` beside a GGUF ``X.gguf`` (or ``X-00001-of-N.gguf``): not a model folder."""
    if not folder.name.endswith(ADAPTER_DIR_SUFFIX):
        return False
    stem = folder.name[: -len(ADAPTER_DIR_SUFFIX)]
    return any(n == f"{stem}.gguf" or (n.startswith(f"{stem}-00001-of-") and n.endswith(".gguf")) for n in names)


def is_peft_folder(names: Iterable[str]) -> bool:
    return PEFT_CONFIG in set(names)


def peft_base_name(folder: Path) -> str | None:
    """``base_model_name_or_path`` of a PEFT adapter folder, or None when it cannot be read."""
    try:
        doc = json.loads((folder / PEFT_CONFIG).read_text())
    except (OSError, ValueError):
        return None
    name = doc.get("base_model_name_or_path") if isinstance(doc, dict) else None
    return name if isinstance(name, str) and name else None


def _base_candidates(name: str) -> list[str]:
    """Names to look a PEFT base up by: as written, its last path part, and ``owner~repo``."""
    parts = [p for p in name.replace("\\", "/").split("/") if p]
    out = [name, *(parts[-1:]), *(["~".join(parts[-2:])] if len(parts) >= 2 else [])]
    return list(dict.fromkeys(out))


def _gguf_adapters(folder: Path, notes: list[str]) -> list[Path]:
    if not folder.is_dir():
        return []
    out = []
    for name in sorted(os.listdir(folder)):
        p = folder / name
        if name.startswith(".") or not name.lower().endswith(".gguf") or not p.is_file():
            continue
        if is_lora_gguf(p):
            out.append(p)
        else:
            notes.append(f"{p}: not a GGUF LoRA adapter (general.type = adapter, adapter.type = lora); skipped")
    return out


def _file_bytes(path: Path) -> int:
    if path.is_dir():
        w = path / PEFT_WEIGHTS
        return w.stat().st_size if w.is_file() else sum(p.stat().st_size for p in path.glob("*.safetensors"))
    return path.stat().st_size


def adapter_entries(models: Mapping[str, ModelConfig], found_keys: Mapping[str, object]) -> dict[str, ModelConfig]:
    """The ``[models.<key>]`` entries about adapters: those with ``base``, and ``B:X`` keys (no path) that no
    discovered model has, which adjust a discovered adapter."""
    return {k: m for k, m in models.items()
            if m.base is not None or (m.path is None and ":" in m.key and m.key.lower() not in found_keys)}


def lookup(entries: Iterable, name: str):
    """The entry whose key, alias or path is ``name`` (names case-insensitive), or None."""
    low = name.lower()
    for e in entries:
        if any(n.lower() == low for n in e.names):
            return e
        if os.path.isabs(name) and os.path.exists(name) and e.path.exists() and os.path.samefile(e.path, name):
            return e
    return None


def add_adapters(entries: list, peft_folders: Iterable[Path], models: Mapping[str, ModelConfig],
                 notes: list[str]) -> list:
    """The catalog's entries plus one per adapter; GGUF bases get their ``loras``.

    ``entries`` are the base entries (``CatalogEntry``); ``models`` holds the ``[models.<key>]`` entries that name an adapter (``base`` set, or a key of a found
    adapter to adjust)."""
    found: list[tuple[str, Path, object, str]] = []  # (key, path, base entry, kind)
    for base in entries:
        if base.kind == "gguf":
            stem = base.path.name[: -len(".gguf")]
            stem = stem.split("-00001-of-")[0] if "-00001-of-" in stem else stem
            for p in _gguf_adapters(adapter_folder(base.path, stem), notes):
                found.append((f"{base.key}:{p.name[: -len('.gguf')]}", p, base, "lora"))
    for folder in peft_folders:
        name = peft_base_name(folder)
        base = next((b for c in _base_candidates(name) if (b := lookup(entries, c)) is not None), None) if name else None
        if base is None:
            notes.append(f"{folder}: PEFT adapter for {name!r}, which is not a model in the catalog; not listed "
                         f"(put the base in models_dirs or name it with [models.<key>] base)")
            continue
        found.append((f"{base.key}:{folder.name}", folder, base, "peft"))
    discovered = {id(f) for f in found}  # two entries may name one file (two store models of one adapter)
    adjust: dict[str, ModelConfig] = {}
    for m in models.values():
        if m.base is None:
            adjust[m.key.lower()] = m
            continue
        base = lookup(entries, m.base)
        where = f"models.{m.key}.base = {m.base!r}"
        if base is None:
            raise ConfigError(f"{where}: no such model in the catalog; name the key of the adapter's base model")
        if m.path is None:
            raise ConfigError(f"models.{m.key}: an adapter needs path (the GGUF adapter file or the PEFT folder)")
        kind = adapter_kind_of(m.path)
        if kind is None:
            raise ConfigError(f"models.{m.key}.path = '{m.path}': neither a GGUF LoRA adapter (general.type = adapter, "
                              f"adapter.type = lora) nor a PEFT folder with {PEFT_CONFIG}")
        applier = engine_for_adapter(kind)
        if base.kind not in traits(applier).file_kinds:
            raise ConfigError(f"{where}: {m.path} is a {kind} adapter, which {applier} applies on a base of kind "
                              f"{'/'.join(traits(applier).file_kinds)}; {m.base!r} is {base.engine} ({base.kind}); "
                              "name such a base or an adapter of another kind")
        found = [f for f in found if id(f) not in discovered  # a discovered adapter named anew
                 or f[1].resolve() != m.path.resolve() or f[2].key != base.key]
        found.append((m.key, m.path, base, kind))
        adjust[m.key.lower()] = m
    by_base: dict[str, list[Path]] = {}
    for key, path, base, kind in sorted(found, key=lambda f: f[0].lower()):
        held = by_base.setdefault(base.key, [])
        if kind in traits(base.engine).adapter_kinds and path not in held:
            held.append(path)  # one file under two keys (two store names of one adapter) is loaded once
    bases = [replace(b, loras=tuple(by_base.get(b.key, ()))) for b in entries]
    out = list(bases)
    base_by_key = {b.key: b for b in bases}
    for key, path, base, kind in found:
        base = base_by_key[base.key]
        own = adjust.pop(key.lower(), None)
        settings = replace(base.settings, key=key, path=path, base=base.key,
                           aliases=own.aliases if own else (), pin=own.pin if own else base.settings.pin)
        out.append(replace(
            base, key=key, path=path,
            engine=base.engine if kind in traits(base.engine).adapter_kinds else engine_for_adapter(kind),
            aliases=settings.aliases, pinned=settings.pin, file_bytes=_file_bytes(path), settings=settings,
            gguf_files=(), model_dir=path if path.is_dir() else path.parent, kind=kind,
            files=(path / PEFT_WEIGHTS,) if kind == "peft" else (path,), base=base.key, base_path=base.path))
    for key, m in adjust.items():
        if ":" in key:
            raise ConfigError(f"models.{m.key}: no adapter with that key; put the adapter in "
                              f"<base>{ADAPTER_DIR_SUFFIX}/ or set models.{m.key}.path and base")
    return out
