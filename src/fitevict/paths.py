"""Where fitevict keeps things: the engine cache and the data directory (store, seat logs)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
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


@contextlib.contextmanager
def fresh_folder(dest: Path) -> Iterator[Path]:
    """A new empty sibling of ``dest`` to write a whole folder into. When the block ends it replaces ``dest`` in one
    rename (a reader never sees half a folder); when the block fails it is removed and ``dest`` is left as it was."""
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
