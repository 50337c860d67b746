"""A file's pages in the page cache, measured with mincore on real files this test writes, and the supervisor's read
ahead (``LiveEffects.prefetch``) making a dropped file resident again. The kernel reads ahead asynchronously, so the
test polls the measured residency (no event tells when the device has delivered the pages)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from types import SimpleNamespace

from fitevict.host.pagecache import COUNTED, SOURCE, cached_words, drop, read_ahead, residency
from fitevict.supervisor.effects import LiveEffects

MiB = 1024 * 1024


def _write(path: Path, n: int) -> Path:
    path.write_bytes(os.urandom(n))
    return path


def _resident_within(path: Path, want: int, seconds: float = 30.0) -> int:
    deadline = time.monotonic() + seconds
    while True:
        got = residency(path).resident_bytes
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.01)  # the device delivers the pages; nothing to await


def test_mincore_sees_each_page_dropped_or_read(tmp_path: Path) -> None:
    f = _write(tmp_path / "model.gguf", 8 * MiB)
    f.read_bytes()
    full = residency(f)
    assert (full.file_bytes, full.resident_bytes, full.fraction, full.source) == (8 * MiB, 8 * MiB, 1.0, SOURCE)
    fd = os.open(f, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 4 * MiB, 4 * MiB, os.POSIX_FADV_DONTNEED)  # the second half only
    finally:
        os.close(fd)
    assert residency(f).resident_bytes == 4 * MiB
    drop(f)
    assert residency(f).resident_bytes == 0
    assert residency(f).to_json()["counted"] == "reclaimable: never budgeted"


def test_a_folder_counts_every_file_and_a_missing_one_is_unavailable(tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    folder.mkdir()
    for name, n in (("a.safetensors", 2 * MiB), ("b.safetensors", 3 * MiB), ("empty.json", 0)):
        _write(folder / name, n).read_bytes()
    got = residency(folder)
    assert (got.file_bytes, got.resident_bytes) == (5 * MiB, 5 * MiB)
    gone = residency(tmp_path / "absent.gguf")
    assert gone.resident_bytes is None and gone.fraction is None
    assert gone.source.startswith("unavailable, because mincore of") and "absent.gguf" in gone.source


def test_read_ahead_asks_for_every_byte(tmp_path: Path) -> None:
    f = _write(tmp_path / "m.gguf", 3 * MiB + 5)
    drop(f)
    assert read_ahead(f) == (1, 3 * MiB + 5)
    assert _resident_within(f, 3 * MiB + 5) == 3 * MiB + 5  # the last page is partly the file's: counted to its end


def test_the_prefetch_effect_makes_a_dropped_file_resident(tmp_path: Path) -> None:
    f = _write(tmp_path / "next.gguf", 48 * MiB)  # larger than one span of the kernel's readahead
    drop(f)
    assert residency(f).resident_bytes == 0

    async def scenario() -> None:
        tasks: list[asyncio.Task] = []

        def spawn(coro, name, on_done=None):
            tasks.append(asyncio.get_running_loop().create_task(coro, name=name))
            return tasks[-1]
        ports = SimpleNamespace(planning=SimpleNamespace(plan_budget=None, footprints=None), store=None, spawn=spawn)
        LiveEffects(ports).prefetch(str(f))  # type: ignore[arg-type]
        await asyncio.gather(*tasks)  # off the event loop: the loop only awaited it

    asyncio.run(scenario())
    assert _resident_within(f, 48 * MiB) == 48 * MiB


def test_ps_and_plan_show_the_share_cached_as_reclaimable(tmp_path: Path, capsys) -> None:
    from rich.console import Console

    from fitevict.cli.admin import _show_plan, ps_table

    f = _write(tmp_path / "m.gguf", 4 * MiB)
    drop(f)
    fd = os.open(f, os.O_RDONLY)
    try:
        os.pread(fd, MiB, 0)  # the first MiB read (the kernel may read further ahead: measured, not assumed)
    finally:
        os.close(fd)
    doc = residency(f).to_json()
    share = f"{100 * doc['fraction']:.0f}%"
    assert cached_words(doc) == share and cached_words(None) == "-" and cached_words(residency(tmp_path / "x")
                                                                                     .to_json()) == "?"
    row = {"key": "m", "state": "ready", "placement": "100% CPU", "in_flight": 0, "waiting": 0, "ctx": 4096,
           "devices": {"CPU": {"measured_bytes": 290, "predicted_bytes": 300}}, "last_used": None, "unload_at": None,
           "page_cache": doc}
    out = Console(width=120, record=True)
    out.print(ps_table([row], time.time(), "http://one"))
    head, line = [t for t in out.export_text().splitlines() if t.strip() and "──" not in t][1:3]
    assert head.split()[5] == "cached" and share in line.split()
    plan = {"action": "hit", "key": "m", "reason": "resident", "budget_bytes": {}, "evict": []}
    _show_plan(plan, None, False, doc)
    assert f"its file in the page cache: {share}" in capsys.readouterr().out and COUNTED in doc["counted"]
