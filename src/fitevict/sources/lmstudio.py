"""LM Studio's models folder, read in place: ``<publisher>/<repo>/*.gguf``.

A repository is served as ``publisher/repo``, or ``publisher/repo:<QUANT>`` per file when it holds several
quantizations; projectors (``mmproj``) beside them go with them. Nothing is written to the folder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from fitevict.sources.record import StoreModel, StoreScan, folder_models

STORE = "lmstudio"


def default_root(env: Mapping[str, str]) -> Path:
    """``~/.lmstudio/models``; where only the older ``~/.cache/lm-studio/models`` exists, that one."""
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    new, old = home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"
    return old if old.is_dir() and not new.is_dir() else new


def read(root: Path) -> StoreScan:
    notes: list[str] = []
    models: list[StoreModel] = []
    for publisher in sorted(os.listdir(root)):
        pdir = root / publisher
        if publisher.startswith(".") or not pdir.is_dir():
            continue
        for repo in sorted(os.listdir(pdir)):
            rdir = pdir / repo
            if not repo.startswith(".") and rdir.is_dir():
                models += folder_models(STORE, f"{publisher}/{repo}", rdir, notes)
    return StoreScan(STORE, root, tuple(models), tuple(notes))
