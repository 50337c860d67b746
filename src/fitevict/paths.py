"""Where fitevict keeps things: the engine cache and the data directory (store, seat logs)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$FITEVICT_CACHE_DIR``, else ``$XDG_CACHE_HOME/fitevict``, else ``~/.cache/fitevict``."""
    if env := os.environ.get("FITEVICT_CACHE_DIR"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "fitevict"


def data_dir() -> Path:
    """``$FITEVICT_DATA_DIR``, else ``$XDG_DATA_HOME/fitevict``, else ``~/.local/share/fitevict``."""
    if env := os.environ.get("FITEVICT_DATA_DIR"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "fitevict"
