"""Where models come from besides the models directories: the model stores other tools keep (``[stores]`` in the
config), read in place (never written to): Ollama's, the Hugging Face hub cache and
LM Studio's folders. Each reader returns the models a store holds as ``StoreModel`` records named as that store's
own tools name them; the catalog lists them beside the models directories.

    record.py   the record, and the naming of folders with several quantizations
    ollama.py   manifests + sha256 blobs
    hfcache.py  models--org--name/refs/main -> snapshots/<rev>/
    lmstudio.py <publisher>/<repo>/*.gguf
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from fitevict.config import ConfigError, StoresConfig
from fitevict.sources import hfcache, lmstudio, ollama
from fitevict.sources.record import StoreModel, StoreScan, quant_of

# config key -> (the store's name, its default location, its reader), in the order the catalog lists them
READERS: dict[str, tuple[str, Callable[[Mapping[str, str]], Path], Callable[[Path], StoreScan]]] = {
    "ollama": (ollama.STORE, ollama.default_root, ollama.read),
    "hf_cache": (hfcache.STORE, hfcache.default_root, hfcache.read),
    "lmstudio": (lmstudio.STORE, lmstudio.default_root, lmstudio.read),
}


def store_roots(config: StoresConfig, env: Mapping[str, str] | None = None) -> list[tuple[str, Path]]:
    """``(store, folder)`` for every store to read: a configured path (which must be a folder), or the store's
    default location when it exists."""
    env = os.environ if env is None else env
    out = []
    for key, (store, default_root, _read) in READERS.items():
        setting = getattr(config, key)
        if setting is False:
            continue
        if setting is True:
            root = default_root(env)
            if root.is_dir():
                out.append((store, root))
            continue
        if not Path(setting).is_dir():
            raise ConfigError(f"stores.{key} = '{setting}': not a folder; point it at the {store} store, or set "
                              f"stores.{key} = false")
        out.append((store, Path(setting)))
    return out


def read_stores(config: StoresConfig, env: Mapping[str, str] | None = None) -> list[StoreScan]:
    """Every configured store's models, in the order ``READERS`` lists the stores."""
    readers = {store: read for store, _root, read in READERS.values()}
    return [readers[store](root) for store, root in store_roots(config, env)]


def store_lines(config: StoresConfig, scans: list[StoreScan], env: Mapping[str, str] | None = None) -> list[str]:
    """One line per store for the start of ``serve``: where it was read and how many models it holds, or why not."""
    env = os.environ if env is None else env
    read = {scan.store: scan for scan in scans}
    lines = []
    for key, (store, default_root, _read) in READERS.items():
        setting = getattr(config, key)
        if store in read:
            scan = read[store]
            lines.append(f"{store} store at {scan.root}: {len(scan.models)} model(s)"
                         + (f"; {len(scan.notes)} note(s)" if scan.notes else ""))
        elif setting is False:
            lines.append(f"{store} store: off (stores.{key} = false)")
        else:
            lines.append(f"{store} store: none at {default_root(env)}")
    return lines


__all__ = ["READERS", "store_lines", "StoreModel", "StoreScan", "quant_of", "read_stores", "store_roots"]
