"""Cgroups for fault tests: a child cgroup made for one test (a memory cap, a freezer), or the test skipped with the
reason this machine gives none (not root, no such controller, a read-only hierarchy); removed once empty."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from _frontdoor import poll

V1_MEMORY = Path("/sys/fs/cgroup/memory")


def new_cgroup(root: Path, what: str) -> Path:
    """A fresh child cgroup under ``root``, or the test skipped with the reason this machine gives none."""
    if os.geteuid() != 0:
        pytest.skip(f"{what}: needs root to make a cgroup (uid {os.geteuid()})")
    if not root.is_dir():
        pytest.skip(f"{what}: no {root} on this machine")
    path = root / f"fitevict-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as e:
        pytest.skip(f"{what}: cannot make a cgroup under {root}: {e}")
    return path


def memory_cgroup(cap: int, what: str) -> Path:
    """A child memory cgroup capped at ``cap`` bytes (cgroup v1's memory controller, else v2's)."""
    if (V1_MEMORY / "memory.limit_in_bytes").exists():
        path = new_cgroup(V1_MEMORY, what)
        (path / "memory.limit_in_bytes").write_text(str(cap))
        return path
    control = Path("/sys/fs/cgroup/cgroup.subtree_control")
    if not control.exists() or "memory" not in control.read_text().split():
        pytest.skip(f"{what}: neither cgroup v1's memory controller nor v2's is enabled here")
    path = new_cgroup(control.parent, what)
    (path / "memory.max").write_text(str(cap))
    return path


def unified_root(what: str) -> Path:
    """Where cgroup v2 is mounted (the whole hierarchy, or its ``unified`` half on a hybrid machine)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[0] == "cgroup2":
            return Path(left.split()[4])
    pytest.skip(f"{what}: no cgroup v2 hierarchy mounted")


def remove_cgroup(path: Path) -> None:
    """Remove a test's cgroup: a process still in it (a test that failed) is moved to the hierarchy's parent first,
    then the kernel's emptying of it is awaited."""
    for pid in (path / "cgroup.procs").read_text().split():
        try:
            (path.parent / "cgroup.procs").write_text(pid)
        except OSError:
            continue  # it exited meanwhile
    poll(lambda: not (path / "cgroup.procs").read_text().split(), f"{path} empty")
    path.rmdir()
