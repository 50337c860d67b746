"""What the stores say about their models, turned into catalog settings (fitevict.sources reads them).

- Ollama's ``params`` become the model's settings: ``num_ctx`` its ctx, the sampling fields its request defaults
  (``num_predict`` as ``max_tokens``); fields with no place here (``num_gpu``, ``num_thread``, ...) are named in a
  note. A ``[models.<key>]`` entry for the same key wins field by field.
- Ollama's ``adapter`` layers make the model an adapter served on the seat of its base (the model blob): the base is
  the store's model of that blob, or, when no manifest serves the blob bare, a model keyed by the blob's digest
  (``sha256-<12 hex>``). A request applies one adapter: a manifest with several adapter layers is one adapter model
  per layer, the first under the manifest's name, layer n as ``<name>:<n>`` (``layer_names``).
- A model's implicit aliases (a store's older names, ``name`` for ``name:latest``) that another model already
  answers to are dropped with a note; the other model keeps the name. One that several models have implicitly is
  none of theirs (a note says so).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fitevict.config import ModelConfig
from fitevict.pricing.lora import is_lora_gguf
from fitevict.sources import StoreModel

#: Ollama parameter -> the request field it fills (llama-server reads these on its OpenAI routes)
OLLAMA_REQUEST_FIELDS: dict[str, str] = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "typical_p": "typical_p",
    "seed": "seed", "stop": "stop", "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "num_predict": "max_tokens",
    "mirostat": "mirostat", "mirostat_tau": "mirostat_tau", "mirostat_eta": "mirostat_eta",
}


def store_settings(record: StoreModel, key: str, own: ModelConfig | None, notes: list[str]) -> ModelConfig:
    """The settings of a store's model: its params under its ``[models.<key>]`` entry (which wins)."""
    ctx = record.params.get("num_ctx")
    defaults = {OLLAMA_REQUEST_FIELDS[k]: v for k, v in record.params.items() if k in OLLAMA_REQUEST_FIELDS}
    unused = sorted(k for k in record.params if k not in OLLAMA_REQUEST_FIELDS and k != "num_ctx")
    if unused:
        notes.append(f"{record.store} model {record.name!r}: params {', '.join(unused)} have no setting here; "
                     "not applied")
    own = own or ModelConfig(key=key)
    if not defaults and not isinstance(ctx, int):
        return own
    return dataclasses.replace(
        own, ctx=own.ctx if own.ctx is not None else (ctx if isinstance(ctx, int) and ctx >= 0 else None),
        request_defaults=MappingProxyType({**defaults, **own.request_defaults}))


def digest_key(blob: Path) -> str:
    """``sha256-<first 12 hex digits>``: the key of an Ollama model blob no manifest serves bare."""
    return blob.name[: len("sha256-") + 12]


def layer_names(record: StoreModel) -> list[str]:
    """The keys of a store model's adapter layers: its own name for the first; ``<name>:<n>`` for layer n of
    several (the first is also ``<name>:1``)."""
    return [record.name if n == 1 else f"{record.name}:{n}" for n in range(1, len(record.adapters) + 1)]


def adapter_models(records: Iterable[StoreModel], base_key_of: Mapping[str, str], user: Mapping[str, ModelConfig],
                   notes: list[str]) -> dict[str, ModelConfig]:
    """``[models.<key>]``-style entries for the store models that are adapters (``base``, ``path`` set), one per
    adapter layer (keys: ``layer_names``); ``base_key_of`` maps a model file's real path to its base's key."""
    out: dict[str, ModelConfig] = {}
    for r in records:
        several = len(r.adapters) > 1
        base = base_key_of[os.path.realpath(r.path)]
        for n, (key, layer) in enumerate(zip(layer_names(r), r.adapters), 1):
            if not is_lora_gguf(layer):
                notes.append(f"{r.store} model {r.name!r}: adapter {layer} is not a GGUF LoRA adapter; {key!r} is "
                             "not listed")
                continue
            own = user.get(key) or ModelConfig(key=key)
            implicit = [*r.aliases, f"{r.name}:1"] if several and n == 1 else r.aliases if n == 1 else ()
            settings = store_settings(r, key, own, notes)
            out[key] = dataclasses.replace(settings, path=layer, base=base,
                                           aliases=tuple(dict.fromkeys([*own.aliases, *implicit])))
    return out


def with_store_fields(entries: list, store_adapters: Iterable[StoreModel],
                      adapters: Mapping[str, ModelConfig]) -> list:
    """Entries of the stores' adapter models with the store they came from and its default system message, and
    their own request defaults over their base's (``adapters``: from ``adapter_models``)."""
    records = {key: r for r in store_adapters for key in layer_names(r)}
    out = []
    for e in entries:
        r = records.get(e.key)
        if r is not None:
            own = adapters[e.key].request_defaults if e.key in adapters else {}
            settings = dataclasses.replace(e.settings, request_defaults=MappingProxyType(
                {**e.settings.request_defaults, **own}))
            e = dataclasses.replace(e, store=r.store, system=r.system, settings=settings)
        out.append(e)
    return out


def drop_clashing_aliases(entries: list, notes: list[str]) -> list:
    """Drop implicit aliases (not ``[models.<key>] aliases``) that another model's key or an earlier alias holds;
    one that several models have implicitly (``x`` for ``alice/x`` and ``bob/x``) answers none of them: it is
    ambiguous (names.py)."""
    keys = {e.key.lower(): e for e in entries}
    implicit: dict[str, list[str]] = {}
    for e in entries:
        for a in e.aliases:
            if a not in e.settings.aliases and a.lower() not in keys:
                implicit.setdefault(a.lower(), []).append(e.key)
    claimed: dict[str, Any] = {}
    out = []
    for e in entries:
        keep = []
        for a in e.aliases:
            other = keys.get(a.lower()) or claimed.get(a.lower())
            mine = a in e.settings.aliases
            if other is not None and other is not e and not mine:
                notes.append(f"{e.key}: the name {a!r} is already {other.key!r}'s ({other.store}); "
                             f"not an alias of {e.key!r} ({e.store})")
                continue
            if not mine and len(several := implicit.get(a.lower(), [])) > 1:
                if several[0] == e.key:
                    notes.append(f"the name {a!r} would be an alias of {', '.join(several)}; it is none of theirs")
                continue
            claimed[a.lower()] = e
            keep.append(a)
        out.append(e if len(keep) == len(e.aliases) else dataclasses.replace(e, aliases=tuple(keep)))
    return out
