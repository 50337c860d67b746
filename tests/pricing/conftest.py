"""Small zoo models written once per module run (the 200 MB llama-medium is left to e2e)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fitevict.pricing.gguf import GgufStructure, load_structure

SMALL = ("llama-gqa", "llama-tied", "llama-moe", "gemma2-swa", "llama-q8_0", "llama-q4_0", "deci-kvarray", "mamba",
         "granitehybrid-moe")


@pytest.fixture(scope="session")
def small_zoo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from fitevict.zoo import write_zoo

    dest = tmp_path_factory.mktemp("pricing-zoo")
    return {m.name: m.path for m in write_zoo(dest, only=SMALL, version=1)}  # the figures below are v1's shapes


@pytest.fixture(scope="session")
def structures(small_zoo: dict[str, Path]) -> dict[str, GgufStructure]:
    return {name: load_structure(p) for name, p in small_zoo.items()}
