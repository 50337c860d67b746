"""Engines behind one protocol, chosen from a registry of import strings (like uvicorn's)."""

from __future__ import annotations

import importlib

from fitevict.engines.base import Engine

# name -> "module:attribute", imported when an entry first names the engine (torch stays out of the front door)
REGISTRY: dict[str, str] = {
    "llama-server": "fitevict.engines.llama_server:LlamaServerEngine",
    "transformers": "fitevict.engines.torch_engine:TransformersEngine",
}


class UnknownEngine(LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown engine {name!r}; available engines: {', '.join(sorted(REGISTRY))}")
        self.name = name


def engine_class(name: str) -> type[Engine]:
    try:
        target = REGISTRY[name]
    except KeyError:
        raise UnknownEngine(name) from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)
