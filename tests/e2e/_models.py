"""The model folder the swap tests share: three distinct copies of the ~200 MB model (so page cache is not
shared between seats), two small models and a copy of one for embeddings."""

from __future__ import annotations

import shutil
from pathlib import Path

from fitevict.pricing.footprint import HOST
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.price import price
from fitevict.engines.llama_cpp.machine import host_buffers

HERE = host_buffers()  # this machine's extra host buffers (its probe, else the rule table): as its engine places


def swap_models(zoo: dict, dest: Path) -> Path:
    for name in ("med-a", "med-b", "med-c"):
        shutil.copyfile(zoo["llama-medium"].path, dest / f"{name}.gguf")
    for name in ("llama-gqa", "llama-q8_0"):
        shutil.copyfile(zoo[name].path, dest / f"{name}.gguf")
    shutil.copyfile(zoo["llama-gqa"].path, dest / "embedder.gguf")
    return dest


def medium_host_bytes(models: Path) -> int:
    """The priced host bytes of one medium copy at ctx 4096, -np 1: the unit the swap budgets are sized in."""
    return price(load_structure(models / "med-a.gguf"), LoadConfig(n_ctx=4096, n_parallel=1), host=HERE).footprint.bytes_on(HOST)
