"""Engines behind one protocol, chosen from a registry of import strings (like uvicorn's).

Every rule that differs by engine reads the engine's :class:`~fitevict.engines.base.Traits` (``traits(name)``) or
calls its protocol methods; nothing outside this package compares an engine's name. Adding an engine is one module
(a class with ``name``, ``traits`` and the protocol's methods) and one entry here."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from fitevict.engines.base import Engine, EngineBase, PricerBase, Traits

# name -> "module:attribute", imported when an entry first names the engine (torch stays out of the front door)
REGISTRY: dict[str, str] = {
    "llama-server": "fitevict.engines.llama_cpp.server:LlamaServerEngine",
    "transformers": "fitevict.engines.transformers.engine:TransformersEngine",
    "declared": "fitevict.engines.declared.engine:DeclaredEngine",
}


class UnknownEngine(LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown engine {name!r}; available engines: {', '.join(sorted(REGISTRY))}")
        self.name = name


def _load(target: str):
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def engine_class(name: str) -> type[EngineBase]:
    try:
        target = REGISTRY[name]
    except KeyError:
        raise UnknownEngine(name) from None
    return _load(target)


@cache
def _pricer(target: str) -> PricerBase:
    return _load(target)


def pricers() -> list[PricerBase]:
    """Each registered family's pricer, once, in the registry's order."""
    out: list[PricerBase] = []
    for name in REGISTRY:
        if (target := engine_class(name).pricer) and (p := _pricer(target)) not in out:
            out.append(p)
    return out


def pricer_for(path: Path | str) -> PricerBase:
    """The pricer of the family whose file kind ``path`` is: the first registered that claims it."""
    for p in pricers():
        if p.claims(Path(path)):
            return p
    raise UnknownEngine(f"(no family prices {path})")


def folder_pricer(names: Sequence[str]) -> PricerBase | None:
    """The pricer of the family whose model a folder holding ``names`` is, whole: the first registered that says so
    (``PricerBase.model_folder``), or None (a folder of model files, or of none)."""
    for p in pricers():
        if p.model_folder(names):
            return p
    return None


def kind_words(kind: str) -> str:
    """A model of ``kind`` in words, as its family's pricer says it ("GGUF model"); the kind itself when none does."""
    return next((p.words for p in pricers() if p.kind == kind and p.words), kind)


def build_pricer() -> PricerBase:
    """The pricer of the family whose build the engine directory holds: it keys what is learned on this machine
    (engine build @ CPU) and calibrates its process overhead."""
    for p in pricers():
        if p.builds:
            return p
    raise UnknownEngine("(no family keys an engine build)")


def prices_own_process(name: str) -> bool:
    """Whether engine ``name``'s family prices its seats' own process as learned on this machine
    (``PricerBase.own_overhead``)."""
    target = engine_class(name).pricer
    return bool(target) and _pricer(target).own_overhead


def traits(name: str) -> Traits:
    """What engine ``name`` can do (raises ``UnknownEngine``)."""
    return engine_class(name).traits


def engine_for_kind(kind: str) -> str:
    """The engine that loads a model file of ``kind`` ("gguf", "hf") by default: the first registered that can."""
    for name in REGISTRY:
        if kind in traits(name).file_kinds:
            return name
    raise UnknownEngine(f"(none loads {kind} models)")


def engine_for_adapter(kind: str) -> str:
    """The engine that applies an adapter of ``kind`` ("lora", "peft") on its base: the first registered that can."""
    for name in REGISTRY:
        if kind in traits(name).adapter_kinds:
            return name
    raise UnknownEngine(f"(none applies {kind} adapters)")


def adapter_kind_of(path: Path | str) -> str | None:
    """The kind of adapter ``path`` is ("lora", "peft"), as the first registered engine that applies it says."""
    for name in REGISTRY:
        if (kind := engine_class(name).adapter_kind(Path(path))) is not None:
            return kind
    return None


def saved_prompt(path: Path | str) -> list[int]:
    """The tokens of a saved prompt file, read by the engine that keeps prompts (``traits.keeps_prompts``); raises
    OSError or ValueError for a file it cannot read."""
    for name in REGISTRY:
        if traits(name).keeps_prompts:
            return engine_class(name).saved_prompt(Path(path))
    raise ValueError(f"{path}: no registered engine keeps prompts")


def is_engine_process(argv: Sequence[str]) -> bool:
    """Whether a process's command line is one of a registered engine's seats (a recorded pid not yet recycled)."""
    head = " ".join(argv[:4])
    return any(mark in head for name in REGISTRY for mark in traits(name).process_marks)


__all__ = ["REGISTRY", "Engine", "EngineBase", "PricerBase", "Traits", "UnknownEngine", "adapter_kind_of",
           "build_pricer", "engine_class", "engine_for_adapter", "engine_for_kind", "folder_pricer", "is_engine_process", "kind_words", "prices_own_process", "pricer_for",
           "pricers", "saved_prompt", "traits"]
