"""Stores laid out in a temporary HOME from tiny GGUF files, made read-only while the tests read them."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path below ``root`` (links not followed) with its mtime and size: what writing would change."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_mtime_ns, st.st_size)
    return out


def set_writable(root: Path, writable: bool) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for p in [Path(dirpath), *(Path(dirpath) / f for f in filenames)]:
            if p.is_symlink():
                continue
            mode = p.stat().st_mode
            p.chmod(mode | stat.S_IWUSR if writable else mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


@pytest.fixture
def freeze() -> Iterator:
    """``freeze(root)`` makes a store read-only (chmod a-w) and returns its ``tree``; every frozen store is made
    writable again at the end of the test."""
    frozen: list[Path] = []

    def do(root: Path) -> dict[str, tuple[int, int]]:
        set_writable(root, False)
        frozen.append(root)
        return tree(root)

    yield do
    for root in frozen:
        set_writable(root, True)
