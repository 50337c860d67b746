"""The Hugging Face hub cache, read in place: ``models--org--name/refs/main`` names the snapshot, whose files are
links into ``blobs/``.

A repository is served as ``org/name``; a snapshot with several GGUF quantizations serves each as
``org/name:<QUANT>`` (split GGUFs count as one). A snapshot of ``config.json`` and ``*.safetensors`` is a
transformers model. The names older fitevict versions gave (``name``, ``org~name``, a file's stem) stay aliases.
Nothing is written to the cache.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from fitevict.sources.files import HF_CACHE_RE as REPO_RE
from fitevict.sources.record import StoreModel, StoreScan, folder_models

STORE = "hf-cache"


def default_root(env: Mapping[str, str]) -> Path:
    """``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
    ``~/.cache/huggingface/hub`` (the hub library's own order)."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    cache = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else _home(env) / ".cache"
    return cache / "huggingface" / "hub"


def _home(env: Mapping[str, str]) -> Path:
    return Path(env["HOME"]) if env.get("HOME") else Path.home()


def snapshot_of(repo: Path, notes: list[str]) -> Path | None:
    """The snapshot ``refs/main`` names; without refs, the only snapshot. Several snapshots and no ref: none (the
    cache does not say which is current)."""
    ref = repo / "refs" / "main"
    if ref.is_file():
        rev = ref.read_text().strip()
        snap = repo / "snapshots" / rev
        if snap.is_dir():
            return snap
        notes.append(f"{repo}: refs/main names {rev!r}, which has no folder in snapshots/; skipped")
        return None
    snaps = repo / "snapshots"
    revs = sorted(p for p in snaps.iterdir() if p.is_dir()) if snaps.is_dir() else []
    if len(revs) == 1:
        return revs[0]
    if revs:
        notes.append(f"{repo}: no refs/main and {len(revs)} snapshots ({', '.join(p.name for p in revs)}); "
                     "skipped, since none is marked current")
    return None


def old_keys(parts: list[str], stem: str, several: bool) -> list[str]:
    """The keys a models directory gave this model before: ``name``, ``org~name`` (``stem``, ``name~stem``,
    ``org~name~stem`` for one of several)."""
    tail = [stem] if several else []
    out = ["~".join(parts[len(parts) - n:] + tail) for n in range(1, len(parts) + 1)]
    return list(dict.fromkeys([stem, *out] if several else out))


def read_repo(repo: Path, notes: list[str], store: str = STORE) -> list[StoreModel]:
    """The models of one cached repository ``models--org--name``."""
    m = REPO_RE.match(repo.name)
    if m is None:
        return []
    snap = snapshot_of(repo, notes)
    if snap is None:
        return []
    parts = m["name"].split("--")
    return folder_models(store, "/".join(parts), snap, notes, lambda stem, several: old_keys(parts, stem, several))


def read(root: Path) -> StoreScan:
    """Every model repository of the cache at ``root`` (datasets and spaces are not models)."""
    notes: list[str] = []
    models: list[StoreModel] = []
    for name in sorted(os.listdir(root)):
        repo = root / name
        if REPO_RE.match(name) and repo.is_dir():
            models += read_repo(repo, notes)
    return StoreScan(STORE, root, tuple(models), tuple(notes))
