"""The C allocator's hold on the front door's memory. A door that runs for days frees most of what a burst of
requests, a load record or a sampler's reading allocated, but glibc's malloc keeps freed pages mapped inside its
heaps, one heap (arena) per thread that ever allocated, up to eight per core: the door's RSS creeps up although no
object is kept. glibc's own two remedies, applied here:

- ``limit_arenas``: at most ``ARENAS`` arenas (``mallopt(M_ARENA_MAX)``), set before the door's threads start, so
  that the worker threads (``asyncio.to_thread``, SQLite's writer, the sampler) share them instead of each keeping
  its own half-empty heap;
- ``trim``: ``malloc_trim(0)``, which gives the free pages inside every heap back to the kernel (``MADV_DONTNEED``);
  the door runs it every ``server.heap_trim_seconds``.

Elsewhere (musl, macOS) there is no such call: each says "unavailable, because …" and nothing changes."""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any

ARENAS = 2  # the door's threads wait on I/O: two arenas keep their allocations from contending
M_ARENA_MAX = -8  # glibc's malloc.h
_limited: list[str] = []  # what ``limit_arenas`` did in this process


class _Mallinfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (every field a ``size_t``), summed over all arenas."""

    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.cache
def _libc() -> ctypes.CDLL | str:
    """glibc (the symbols this process was linked with), or why it cannot be used."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        if hasattr(libc, "mallinfo2"):  # glibc 2.33 and later
            libc.mallinfo2.restype = _Mallinfo2
    except (OSError, AttributeError, TypeError) as e:
        return f"unavailable, because this process's C library is not glibc: {e}"
    return libc


def allocator() -> str:
    """The C allocator the door runs on, as it names itself."""
    libc = _libc()
    return libc if isinstance(libc, str) else f"glibc {libc.gnu_get_libc_version().decode()}"


def limit_arenas(n: int = ARENAS) -> str:
    """At most ``n`` malloc arenas from now on (arenas made already stay). What was done, or why not."""
    libc = _libc()
    if isinstance(libc, str):
        done = libc
    elif libc.mallopt(M_ARENA_MAX, n) != 1:
        done = f"unavailable, because mallopt(M_ARENA_MAX, {n}) was refused"
    else:
        done = f"at most {n}, set at start-up"
    _limited[:] = [done]
    return done


def arenas() -> str:
    """What ``limit_arenas`` did in this process, or that it was not asked to."""
    return _limited[0] if _limited else "not limited: glibc's default (8 per core)"


def trim() -> bool | str:
    """Give the free pages in malloc's heaps back to the kernel: True if some were, False if none were free, or
    why it could not be done."""
    libc = _libc()
    if isinstance(libc, str):
        return libc
    return bool(libc.malloc_trim(0))


def held() -> dict[str, Any]:
    """What the door's memory is made of, by the allocators' own counts (engine-reported, in this sense): Python's
    allocated blocks (``sys.getallocatedblocks``: objects alive, whatever their size) and malloc's heaps
    (``mallinfo2``: bytes in chunks in use, bytes free inside the heaps, the heaps' size and what is mapped apart: chunks above
    its mmap threshold, each its own mapping).
    Growth in blocks or ``in_use`` is memory kept; growth in ``free`` alone is the allocator's fragmentation."""
    out: dict[str, Any] = {"python_blocks": sys.getallocatedblocks()}
    libc = _libc()
    if isinstance(libc, str):
        out["malloc"] = libc
    elif not hasattr(libc, "mallinfo2"):
        out["malloc"] = f"unavailable, because {allocator()} has no mallinfo2 (glibc 2.33 and later)"
    else:
        m = libc.mallinfo2()
        out["malloc"] = {"in_use_bytes": m.uordblks, "free_bytes": m.fordblks, "heaps_bytes": m.arena,
                         "mapped_apart_bytes": m.hblkhd, "mapped_apart_chunks": m.hblks}
    out["sqlite"] = _sqlite_held()
    return out


def _sqlite_held() -> dict[str, int] | str:
    """SQLite's own count of the bytes it holds in this process (``sqlite3_memory_used``: its page caches,
    prepared statements and schemas, all connections together; part of malloc's bytes in use), or why not."""
    lib = _sqlite_lib()
    if isinstance(lib, str):
        return lib
    return {"in_use_bytes": lib.sqlite3_memory_used(), "peak_bytes": lib.sqlite3_memory_highwater(0)}


def _sqlite_lib() -> ctypes.CDLL | str:
    """The SQLite library the ``sqlite3`` module was linked with, once it is loaded, or why it cannot be read."""
    mod = sys.modules.get("_sqlite3")
    if mod is None:
        return "unavailable, because this process has not loaded SQLite"
    return _sqlite_at(mod.__file__)


@functools.cache
def _sqlite_at(path: str) -> ctypes.CDLL | str:
    try:
        lib = ctypes.CDLL(path)
        lib.sqlite3_memory_used.restype = lib.sqlite3_memory_highwater.restype = ctypes.c_int64
        lib.sqlite3_memory_highwater.argtypes = [ctypes.c_int]
    except (OSError, AttributeError) as e:
        return f"unavailable, because SQLite's memory counters cannot be reached: {e}"
    return lib
