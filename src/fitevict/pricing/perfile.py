"""A file's parse kept in this process, one per path: the parse of the file as it is now.

A cache keyed by a file's identity (path, size, mtime, ...) keeps a new parse each time the file changes, and the
old ones with it, until its bound: a model file touched or rewritten a thousand times over a server's life would
hold up to that many parses (a GGUF's tensor table is tens of kB). Kept per path, a changed file replaces its
entry, so what is kept is bounded by the files there are, not by how often they changed."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
MOST_FILES = 1024  # files kept at once; past it, the longest kept goes first


class PerFile(Generic[T]):
    """``parse(path, *identity)`` called once per file version, the latest version's result kept per path."""

    def __init__(self, parse: Callable[..., T], most: int = MOST_FILES) -> None:
        self._parse, self._most = parse, most
        self._kept: dict[str, tuple[tuple, T]] = {}
        self._lock = threading.Lock()

    def __call__(self, path: str, *identity: object) -> T:
        key = (path, *identity)
        with self._lock:
            got = self._kept.get(path)
        if got is not None and got[0] == key:
            return got[1]
        value = self._parse(*key)  # outside the lock: a parse may take long, and raises for a bad file
        with self._lock:
            self._kept.pop(path, None)
            while len(self._kept) >= self._most:
                self._kept.pop(next(iter(self._kept)))
            self._kept[path] = (key, value)
        return value

    def __len__(self) -> int:
        return len(self._kept)

    def cache_clear(self) -> None:
        with self._lock:
            self._kept.clear()


__all__ = ["MOST_FILES", "PerFile"]
