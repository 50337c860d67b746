"""Engines behind one protocol, chosen from a registry of import strings (like uvicorn's).

Every rule that differs by engine reads the engine's :class:`~fitevict.engines.base.Traits` (``traits(name)``) or
calls its protocol methods; nothing outside this package compares an engine's name. Adding an engine is one module
(a class with ``name``, ``traits`` and the protocol's methods) and one entry here."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from fitevict.engines.base import Engine, EngineBase, Traits

# name -> "module:attribute", imported when an entry first names the engine (torch stays out of the front door)
REGISTRY: dict[str, str] = {
    "llama-server": "fitevict.engines.llama_cpp.server:LlamaServerEngine",
    "transformers": "fitevict.engines.transformers.engine:TransformersEngine",
}


class UnknownEngine(LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown engine {name!r}; available engines: {', '.join(sorted(REGISTRY))}")
        self.name = name


def engine_class(name: str) -> type[EngineBase]:
    try:
        target = REGISTRY[name]
    except KeyError:
        raise UnknownEngine(name) from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


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


def is_engine_process(argv: Sequence[str]) -> bool:
    """Whether a process's command line is one of a registered engine's seats (a recorded pid not yet recycled)."""
    head = " ".join(argv[:4])
    return any(mark in head for name in REGISTRY for mark in traits(name).process_marks)


__all__ = ["REGISTRY", "Engine", "EngineBase", "Traits", "UnknownEngine", "engine_class", "engine_for_adapter",
           "engine_for_kind", "is_engine_process", "traits"]
