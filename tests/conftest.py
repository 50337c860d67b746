"""Shared fixtures: the real engine binaries and the generated GGUF zoo.

e2e tests need the llama.cpp build; the README's test command builds it first
(``fitevict engine install llama.cpp``). A missing engine is an error in e2e tests, not a skip.

The model stores of the machine running the tests (its ``~/.ollama``, Hugging Face cache, LM Studio folder) are
never read: every store is switched off for the ``fitevict serve`` processes tests start (``FITEVICT_OLLAMA``,
``FITEVICT_HF_CACHE``, ``FITEVICT_LMSTUDIO`` = false, which beat a config file), and in this process each store's
default place is a folder that does not exist. A test that builds a store points at it (``[stores]`` path, or
``FITEVICT_*`` for a server), or asks for ``store_defaults`` to have the default places under its own HOME read.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fitevict import sources

FAULTS = str(Path(__file__).resolve().parent / "faults")
if FAULTS not in sys.path:
    sys.path.insert(0, FAULTS)

# the fault table: the ``fault_seen`` fixture for fault tests in any folder, and the plugin that writes their rows
from faultrows import fault_seen, pytest_configure  # noqa: E402,F401

STORE_SWITCHES = ("FITEVICT_OLLAMA", "FITEVICT_HF_CACHE", "FITEVICT_LMSTUDIO")
_DEFAULT_PLACES = dict(sources.READERS)


@pytest.fixture(scope="session", autouse=True)
def no_stores_of_this_machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every store off for started servers; in this process, the stores' default places are nowhere."""
    nowhere = tmp_path_factory.mktemp("no-stores") / "absent"
    with pytest.MonkeyPatch.context() as mp:
        for var in STORE_SWITCHES:
            mp.setenv(var, "false")
        for key, (store, _default_root, read) in _DEFAULT_PLACES.items():
            mp.setitem(sources.READERS, key, (store, lambda env, k=key: nowhere / k, read))
        yield


@pytest.fixture
def store_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary HOME (returned, not created) whose stores are read from their own default places
    (``~/.ollama/models``, ``~/.cache/huggingface/hub``, ``~/.lmstudio/models``): the stores' variables unset, the
    switches back to their defaults."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    for var in (*STORE_SWITCHES, "OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    for key, reader in _DEFAULT_PLACES.items():
        monkeypatch.setitem(sources.READERS, key, reader)
    return home


@pytest.fixture(scope="session")
def llama_server() -> Path:
    """Path of the llama-server binary fitevict resolves (config, env, PATH, cache)."""
    from fitevict.engines.llama_cpp.install import resolve_binary

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
