"""Host memory read from the real /proc of processes the tests start."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fitevict.host.procmem import HostMemoryError, read_meminfo, read_process, read_tree, rss_bytes, tree_rss_bytes

MiB = 1024 * 1024
PAGE = os.sysconf("SC_PAGE_SIZE")
ANON = 64 * MiB
FILE = 32 * MiB


def _huge_page() -> int:
    p = Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
    return int(p.read_text()) if p.exists() else PAGE


# What the interpreter itself may touch while it allocates (object headers, the loop's frames,
# allocator arenas), plus one transparent huge page of rounding.
SLACK = 256 * PAGE + _huge_page()

CHILD = f"""
import mmap, sys
sys.stdout.write("base\\n"); sys.stdout.flush()
sys.stdin.readline()
anon = bytearray({ANON})
anon[::{PAGE}] = b"\\x01" * ({ANON} // {PAGE})      # touch every page: committed
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
total = sum(m[i] for i in range(0, {FILE}, {PAGE}))  # read every page: mapped
sys.stdout.write("grown\\n"); sys.stdout.flush()
sys.stdin.readline()
"""


class Child:
    """A python process that allocates 64 MiB anonymous and maps 32 MiB of a file when told to."""

    def __init__(self, tmp: Path) -> None:
        data = tmp / "weights.bin"
        data.write_bytes(b"\x07" * FILE)
        self.p = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(data)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.pid = self.p.pid

    def wait_for(self, line: str) -> None:
        got = self.p.stdout.readline().strip()  # type: ignore[union-attr]
        assert got == line, f"child said {got!r}, expected {line!r}"

    def go(self) -> None:
        self.p.stdin.write("go\n")  # type: ignore[union-attr]
        self.p.stdin.flush()  # type: ignore[union-attr]

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Child]:
    c = Child(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def test_committed_and_mapped_grow_by_what_the_child_touched(child: Child) -> None:
    child.wait_for("base")
    before = read_process(child.pid)
    child.go()
    child.wait_for("grown")
    after = read_process(child.pid)
    assert before.source == after.source == "smaps_rollup", after.reason
    d_committed = after.committed_bytes - before.committed_bytes  # type: ignore[operator]
    d_mapped = after.mapped_bytes - before.mapped_bytes  # type: ignore[operator]
    assert ANON - SLACK <= d_committed <= ANON + SLACK, d_committed / MiB
    assert FILE - SLACK <= d_mapped <= FILE + SLACK, d_mapped / MiB
    # RSS counts both kinds (and shared pages fully): at least the sum of what PSS saw
    assert after.rss_bytes >= after.committed_bytes + after.mapped_bytes  # type: ignore[operator]
    assert after.host_bytes == after.committed_bytes + after.mapped_bytes  # type: ignore[operator]


def test_tree_includes_descendants(child: Child) -> None:
    child.wait_for("base")
    child.go()
    child.wait_for("grown")
    tree = read_tree(os.getpid())
    alone = read_process(child.pid)
    assert tree.pids[0] == os.getpid() and child.pid in tree.pids
    assert tree.committed_bytes >= alone.committed_bytes + read_process(os.getpid()).committed_bytes - SLACK  # type: ignore[operator]
    assert tree.committed_bytes >= ANON  # type: ignore[operator]


def test_unreadable_smaps_rollup_falls_back_to_rss_never_zero(child: Child, tmp_path: Path) -> None:
    child.wait_for("base")
    child.go()
    child.wait_for("grown")
    # a /proc view where smaps_rollup is missing but status is the live kernel file
    fake_proc = tmp_path / "proc"
    (fake_proc / str(child.pid)).mkdir(parents=True)
    (fake_proc / str(child.pid) / "status").symlink_to(f"/proc/{child.pid}/status")
    m = read_process(child.pid, proc=fake_proc)
    assert m.source == "rss-fallback"
    assert "smaps_rollup" in m.reason and "RSS" in m.reason
    assert m.committed_bytes is not None and m.committed_bytes >= ANON - SLACK  # RssAnon saw the bytearray
    assert m.mapped_bytes is not None and m.mapped_bytes >= FILE - SLACK  # RssFile saw the mapping
    tree = read_tree(child.pid, proc=fake_proc)
    assert tree.pids == (child.pid,) and tree.source == "rss-fallback"
    assert tree.committed_bytes is not None and tree.committed_bytes >= ANON - SLACK


def test_process_that_does_not_exist_is_unavailable_with_reason() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # exited and reaped: its pid names no process now
    m = read_process(gone.pid)
    assert m.source == "unavailable"
    assert m.committed_bytes is None and m.mapped_bytes is None and m.rss_bytes is None and m.host_bytes is None
    assert str(gone.pid) in m.reason
    t = read_tree(gone.pid)
    assert t.source == "unavailable" and t.committed_bytes is None


def test_meminfo_reads_the_machine() -> None:
    mem = read_meminfo()
    assert 0 < mem.available_bytes <= mem.total_bytes
    assert mem.total_bytes % 1024 == 0  # meminfo counts in kB


def test_meminfo_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(HostMemoryError, match="nope"):
        read_meminfo(tmp_path / "nope")
    old = tmp_path / "meminfo"
    old.write_text("MemTotal:       16384 kB\nMemFree:        1024 kB\n")
    with pytest.raises(HostMemoryError, match="MemAvailable"):
        read_meminfo(old)


def test_a_process_that_exited_or_is_exiting_is_told_from_one_that_runs() -> None:
    """``exiting``: a running child is not; killed and not reaped yet (a zombie), or reaped, it is. The flags field's
    ``PF_EXITING`` (set when the kernel's exit begins, before the process's sockets close) says so too."""
    from fitevict.host.procmem import PF_EXITING, exiting, stat_exiting

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not exiting(child.pid)
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, still a zombie: not reaped
        assert exiting(child.pid)
    finally:
        child.kill()
        child.wait()
    assert exiting(child.pid)  # reaped: gone
    line = Path("/proc/self/stat").read_text()
    comm, fields = line.rsplit(")", 1)[0], line.rsplit(")", 1)[1].split()
    assert not stat_exiting(line)
    fields[6] = str(int(fields[6]) | PF_EXITING)
    assert stat_exiting(comm + ") " + " ".join(fields)) and stat_exiting("") and stat_exiting("1 (x) Z")


def test_reading_a_process_interns_none_of_its_ids(child: Child, monkeypatch: pytest.MonkeyPatch) -> None:
    """The door reads every seat's /proc files every second: through ``pathlib`` (which, in Python 3.11, interns
    every part of a path it parses) each read put the pid and every thread id into the interpreter's table of
    interned strings and took them out again, and that churn doubled the table (1.8 MiB of the door's memory) within
    half an hour of a soak. The readers go through string paths: no id is interned."""
    from fitevict.host import oomkill, procmem
    from fitevict.seat import frozen

    interned: list[str] = []
    real = sys.intern
    monkeypatch.setattr(sys, "intern", lambda s: interned.append(s) or real(s))
    assert Path("/proc", "interned-by-pathlib").parts and (interned or sys.version_info >= (3, 12))  # the probe works
    interned.clear()
    pid = child.pid
    assert read_tree(pid).source != "unavailable" and read_process(pid).source != "unavailable"
    assert any(p.pid == pid for p in procmem.largest_processes(set(), n=10_000))
    assert frozen.progress(pid) is not None and frozen.frozen_by_cgroup(pid) is None
    assert procmem.process_state(pid) in ("S", "R") and not procmem.exiting(pid)
    assert oomkill.observe(pid).started_s is not None
    assert [s for s in interned if s.isdigit()] == []  # no pid, no thread id (a cgroup's fixed names may be)


def test_the_load_progress_counter_grows_with_what_a_descendant_touches(child: Child) -> None:
    """``tree_rss_bytes`` (statm, no page walk) sees a child's pages come in, as ``load_advanced`` needs."""
    child.wait_for("base")
    before_child, before_tree = rss_bytes(child.pid), tree_rss_bytes(os.getpid())
    child.go()
    child.wait_for("grown")
    grew = rss_bytes(child.pid) - before_child  # type: ignore[operator]
    assert ANON + FILE - SLACK <= grew <= ANON + FILE + SLACK, grew / MiB
    assert tree_rss_bytes(os.getpid()) - before_tree >= grew - SLACK  # type: ignore[operator]
    # the kernel's counter against smaps_rollup's page walk: the same pages (the counter may lag by a per-CPU batch)
    assert abs(rss_bytes(child.pid) - read_process(child.pid).rss_bytes) <= SLACK  # type: ignore[operator]
    assert tree_rss_bytes(2**22 + 7) is None and rss_bytes(2**22 + 7) is None  # no such process
