"""A model file's pages in the host's page cache: how much of it is there (measured with ``mincore``), and reading it
there ahead of a load (``posix_fadvise(POSIX_FADV_WILLNEED)``).

The page cache is reclaimable: the kernel counts it in MemAvailable, which the host budget reads (``host.budget``),
so neither figure is ever budgeted. A file's residency is what a stopped model keeps warm (the ``cached`` rung), a
read ahead what a load waiting behind an eviction gains while its victim stops. A folder (a Hugging Face model) is
every regular file under it. Blocking calls: run them off the event loop.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

SOURCE = "measured: mincore of the file's pages"
PAGE = mmap.PAGESIZE
_PROT_READ, _MAP_SHARED = 0x1, 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value


@dataclass(frozen=True, slots=True)
class Residency:
    """How much of a model's file(s) the page cache holds now: ``resident_bytes`` of ``file_bytes`` (page-rounded
    pages found resident, at most the file's size), measured with mincore; ``None`` with ``why`` when unavailable."""

    file_bytes: int
    resident_bytes: int | None
    why: str = ""

    @property
    def fraction(self) -> float | None:
        if self.resident_bytes is None:
            return None
        return self.resident_bytes / self.file_bytes if self.file_bytes else 1.0

    @property
    def source(self) -> str:
        return SOURCE if self.resident_bytes is not None else f"unavailable, because {self.why}"

    def to_json(self) -> dict:
        return {"file_bytes": self.file_bytes, "resident_bytes": self.resident_bytes, "fraction": self.fraction,
                "source": self.source, "counted": COUNTED}


COUNTED = "reclaimable: never budgeted"


def cached_words(doc: dict | None) -> str:
    """A ``Residency.to_json`` in a few words: the share of the file in the page cache, or why it is not known."""
    if not doc:
        return "-"
    if doc.get("resident_bytes") is None:
        return "?"
    return f"{100 * doc['fraction']:.0f}%"


def files_of(path: str | Path) -> list[Path]:
    """The regular files a load of ``path`` reads: the file itself, or every regular file under a folder."""
    p = Path(path)
    if p.is_dir():
        return sorted(f for f in p.rglob("*") if f.is_file() and not f.is_symlink())
    return [p]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    return libc


def _file_resident(libc: ctypes.CDLL, f: Path) -> tuple[int, int]:
    """(size, resident bytes) of one file: its pages mapped (never touched, so never faulted in) and asked."""
    fd = os.open(f, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0, 0
        addr = libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap of {f} failed")
        try:
            pages = (size + PAGE - 1) // PAGE
            vec = ctypes.create_string_buffer(pages)
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {f} failed")
            raw = vec.raw
            resident = len(raw) - raw.count(0)  # the kernel sets bit 0 of a resident page's byte, nothing else
        finally:
            libc.munmap(addr, size)
        return size, min(size, resident * PAGE)
    finally:
        os.close(fd)


def residency(path: str | Path) -> Residency:
    """How much of ``path`` (a file, or a folder's files) the page cache holds now, measured with mincore."""
    files = files_of(path)
    total = resident = 0
    try:
        libc = _libc()
        for f in files:
            size, got = _file_resident(libc, f)
            total, resident = total + size, resident + got
    except (OSError, AttributeError) as e:  # AttributeError: a libc without mincore
        size = sum(f.stat().st_size for f in files if f.exists())
        return Residency(size, None, f"mincore of {path} failed: {e}")
    return Residency(total, resident)


# the span of one WILLNEED call: the kernel reads at most its readahead bound per call (max(read_ahead_kb,
# max_sectors_kb) of the file's device: 128 KiB where both are at their usual defaults), so a file is asked for in
# spans no larger than that, every span of it in turn
SPAN = 128 * 1024


def read_ahead(path: str | Path) -> tuple[int, int]:
    """Ask the kernel to read ``path`` (a file, or a folder's files) into the page cache (``POSIX_FADV_WILLNEED``,
    ``SPAN`` bytes a call): it queues the reads and returns without copying a byte; the pages arrive as the device
    delivers them. Blocks only while the device's request queue is full: call it off the event loop. The pages are
    reclaimable, never budgeted. Returns (files, bytes) asked for; raises OSError where a file cannot be opened."""
    if not hasattr(os, "posix_fadvise"):
        raise OSError(f"{path} not read ahead: this platform has no posix_fadvise")
    n = total = 0
    for f in files_of(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            for off in range(0, size, SPAN):
                os.posix_fadvise(fd, off, SPAN, os.POSIX_FADV_WILLNEED)
            n, total = n + 1, total + size
        finally:
            os.close(fd)
    return n, total


def drop(path: str | Path) -> None:
    """Ask the kernel to drop ``path``'s clean pages from the page cache (``POSIX_FADV_DONTNEED``)."""
    for f in files_of(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fdatasync(fd)  # dirty pages cannot be dropped: written back first
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
