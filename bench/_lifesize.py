"""The life-size zoo for a bench: written (or reused from the cache) by ``fitevict.zoo.lifesize``, a line per model."""

from __future__ import annotations

from collections.abc import Iterable

from fitevict.engines.llama_cpp.install import resolve_binary, source_dir
from fitevict.zoo import ZooModel
from fitevict.zoo.lifesize import write_life_size


def life_size_models(only: Iterable[str] | None = None) -> list[ZooModel]:
    """The life-size models (all, or those named), from ``<cache>/lifesize``; written on first use."""
    quantize = resolve_binary("llama-quantize").path
    written = write_life_size(source_dir(), only=only, quantize=quantize, progress=lambda line: print(line, flush=True))
    return [w.model for w in written]
