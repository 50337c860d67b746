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


REFERENCE_MEDIUM_MIB = 280  # the medium's priced host bytes where fixed budgets in MiB were laid out (no extra buffers)


def machine_budgets(zoo: dict, budgets_mib: dict[str, int]) -> dict[str, int]:
    """Budgets laid out in MiB against a medium priced at ``REFERENCE_MEDIUM_MIB``, scaled to this machine's price of
    the medium (never down): a CPU whose engine copies weights into extra host buffers (AMX, repack) prices every
    model higher, and a budget that held a model there must hold it here."""
    here = price(load_structure(zoo["llama-medium"].path), LoadConfig(n_ctx=4096, n_parallel=1),
                 host=HERE).footprint.bytes_on(HOST)
    scale = max(1.0, here / (REFERENCE_MEDIUM_MIB * 2**20))
    return {name: round(mib * scale) for name, mib in budgets_mib.items()}
