"""Shared fixtures: the real engine binaries and the generated GGUF zoo.

e2e tests need the llama.cpp build; the README's test command builds it first
(``fitevict engine install llama.cpp``). A missing engine is an error in e2e tests, not a skip.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def llama_server() -> Path:
    """Path of the llama-server binary fitevict resolves (config, env, PATH, cache)."""
    from fitevict.engines.install import resolve_binary

    found = resolve_binary("llama-server")
    if found.path is None:
        pytest.fail(f"no llama-server: {found.why}. Run: fitevict engine install llama.cpp")
    return found.path


@pytest.fixture(scope="session")
def engine_bin_dir(llama_server: Path) -> Path:
    """Directory holding llama-server, llama-fit-params and llama-quantize."""
    return llama_server.parent


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The demo zoo, written once per session: {name: ZooModel}."""
    from fitevict.zoo import write_zoo

    dest = tmp_path_factory.mktemp("zoo")
    return {m.name: m for m in write_zoo(dest)}


@pytest.fixture(scope="session")
def hf_zoo(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The HF demo folders, built once per session (needs the torch extra): {name: HfZooModel}."""
    from fitevict.zoo.hf import torch_available, write_hf_zoo

    if not torch_available():
        pytest.skip("the torch extra is not installed (pip install 'fitevict[torch]' with a CPU torch wheel)")
    dest = tmp_path_factory.mktemp("hfzoo")
    return {m.name: m for m in write_hf_zoo(dest)}
