"""How much disk fitevict's data folder holds, by part: the store (its database, write-ahead log and shared memory
file), seat logs, kept prompts (KV files), the demo models, and the rest. Measured by walking the folder (``lstat``
of every file: its blocks on disk, so sparse and partly written files count what they really take)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: the data folder's parts, by their first path component (see seat/processes.py, supervisor/kvkeep.py)
PARTS = {"seats": "seat logs", "kv": "kept prompts", "demo-models": "demo models", "cluster": "cluster nodes"}
STORE_FILES = ("fitevict.db", "fitevict.db-wal", "fitevict.db-shm")


@dataclass(frozen=True, slots=True)
class DataDirUsage:
    """Measured bytes on disk of a data folder, by part (``None`` total: the folder could not be read, see ``why``)."""

    path: str
    total_bytes: int | None
    parts: dict[str, int] = field(default_factory=dict)
    files: int = 0
    why: str | None = None  # why the figure is unavailable, or what could not be read

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "total_bytes": self.total_bytes, "parts": dict(self.parts), "files": self.files,
                "source": "measured: the blocks of every file under the folder (lstat)", "why": self.why}


def _part(rel: Path) -> str:
    if rel.parts[0] in STORE_FILES or rel.name.startswith("fitevict.db"):
        return "store"
    return PARTS.get(rel.parts[0], "other") if len(rel.parts) > 1 else "other"


def data_dir_usage(folder: Path) -> DataDirUsage:
    """Walk ``folder`` and add up each file's blocks on disk by part. A file removed meanwhile is skipped; a folder
    that cannot be read makes the figure unavailable, with the reason."""
    folder = Path(folder)
    if not folder.is_dir():
        return DataDirUsage(str(folder), None, why=f"{folder} is not a folder (nothing written yet?)")
    parts: dict[str, int] = {}
    files = 0
    errors: list[str] = []
    for root, _dirs, names in os.walk(folder, onerror=lambda e: errors.append(f"{e.filename}: {e.strerror}")):
        for name in names:
            p = Path(root) / name
            try:
                st = p.lstat()
            except FileNotFoundError:
                continue  # removed while the folder was walked: it takes nothing now
            part = _part(p.relative_to(folder))
            parts[part] = parts.get(part, 0) + st.st_blocks * 512
            files += 1
    if errors:
        return DataDirUsage(str(folder), None, parts, files, why="; ".join(errors[:3]))
    return DataDirUsage(str(folder), sum(parts.values()), parts, files)


__all__ = ["DataDirUsage", "data_dir_usage"]
