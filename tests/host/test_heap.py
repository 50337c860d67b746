"""The door's heap given back to the kernel (host.heap, server.heapkeep), measured by the process's own RSS."""

from __future__ import annotations

import pytest

from fitevict.host import heap
from fitevict.host.procmem import rss_bytes
from fitevict.server.heapkeep import HeapKeep

MiB = 2**20


@pytest.mark.skipif(isinstance(heap.trim(), str), reason="the C library here is not glibc: nothing to trim")
def test_a_round_gives_back_the_free_pages_free_left_inside_the_heap() -> None:
    """128 MiB freed below a chunk still in use stays resident after ``free`` (glibc returns only the top of a heap
    on its own): a round gives it back, and says how much by the RSS it read before and after."""
    heap.trim()
    blocks = [bytearray(4096) for _ in range(128 * MiB // 4096)]  # malloc's, not Python's small-object arenas
    for b in blocks:
        b[::512] = b"x" * 8  # touched: resident
    pin = bytearray(4096)  # allocated after them: the heap's top stays in use
    before = rss_bytes()
    del blocks
    after_free = rss_bytes()
    assert before is not None and after_free is not None
    keep = HeapKeep(60.0)
    last = keep.round()
    assert last["trimmed"] is True and last["rss_before_bytes"] >= after_free - 8 * MiB
    assert last["released_bytes"] >= 96 * MiB, (before, after_free, last)
    assert keep.rounds == 1 and keep.released == last["released_bytes"]
    assert keep.to_json()["allocator"].startswith("glibc ")
    del pin


def test_a_door_that_never_trims_says_so() -> None:
    out = HeapKeep(0).to_json()
    assert out["rounds"] == 0 and out["last"] is None and "never" in out["trim_seconds"]


@pytest.mark.skipif(isinstance(heap.trim(), str), reason="the C library here is not glibc: no mallinfo2")
def test_what_the_heap_holds_follows_what_is_kept_and_what_is_freed() -> None:
    """Kept objects raise Python's block count and malloc's bytes in use; freed, both fall back."""
    first = heap.held()
    if isinstance(first["malloc"], str):
        pytest.skip(first["malloc"])
    kept = [bytearray(4096) for _ in range(8 * MiB // 4096)]  # 2,048 blocks of malloc's 4 KiB chunks
    during = heap.held()
    assert during["python_blocks"] - first["python_blocks"] >= 2048
    assert during["malloc"]["in_use_bytes"] - first["malloc"]["in_use_bytes"] >= 8 * MiB
    del kept
    after = heap.held()
    assert during["malloc"]["in_use_bytes"] - after["malloc"]["in_use_bytes"] >= 8 * MiB
    assert during["python_blocks"] - after["python_blocks"] >= 2048


def test_sqlites_own_count_follows_its_page_cache() -> None:
    """A connection that reads a table into its page cache raises SQLite's bytes; closed, they fall back."""
    import sqlite3

    first = heap.held()["sqlite"]
    if isinstance(first, str):
        pytest.skip(first)
    conn = sqlite3.connect(":memory:")
    conn.execute("PRAGMA cache_size=-16384")
    conn.execute("CREATE TABLE t(x BLOB)")
    conn.executemany("INSERT INTO t VALUES (?)", ((b"y" * 1000,) for _ in range(4096)))
    during = heap.held()["sqlite"]
    assert during["in_use_bytes"] - first["in_use_bytes"] >= 4 * MiB
    assert during["peak_bytes"] >= during["in_use_bytes"]
    conn.close()
    assert during["in_use_bytes"] - heap.held()["sqlite"]["in_use_bytes"] >= 4 * MiB
