"""Was a process killed by the kernel's OOM killer? What the kernel tells, read while the process lives and after.

A SIGKILL alone does not say who sent it. Two witnesses can:
- the process's memory cgroup counts the OOM kills among its members (cgroup v1 ``memory.oom_control``'s
  ``oom_kill``, v2 ``memory.events``' ``oom_kill``; the kernel counts a kill in the victim's cgroup whether the limit
  hit was the cgroup's or the machine's). Its path and count are read while the process lives (``CgroupSeen``); a
  count that rose by the time the process is gone, with the process dead by SIGKILL, is the OOM killer's mark;
- the kernel log (``/dev/kmsg``, readable by root unless locked down) names the victim: "Killed process <pid>
  (<comm>) ...". Exact, where it can be read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fitevict.host.procmem import proc_text, process_state

CGROUP_ROOT = Path("/sys/fs/cgroup")
KMSG_MAX_RECORDS = 20000  # a look at the kernel log reads at most this many records (the ring is far smaller)


@dataclass(frozen=True, slots=True)
class CgroupSeen:
    """A process's memory cgroup and what it said when last read: its OOM-kill count and its limit."""

    path: Path  # the cgroup's directory
    oom_kills: int
    limit_bytes: int | None  # None: no limit (or unreadable)

    def label(self) -> str:
        limit = "no limit" if self.limit_bytes is None else f"limit {self.limit_bytes} B"
        return f"memory cgroup {self.path} ({limit})"


def memory_cgroup(pid: int) -> Path | None:
    """The directory of ``pid``'s memory cgroup (v1 ``memory`` controller, else v2), None when none can be read."""
    try:
        lines = proc_text(pid, "cgroup").splitlines()
    except OSError:
        return None
    v2: Path | None = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if "memory" in controllers.split(","):
            return CGROUP_ROOT / "memory" / rel
        if controllers == "":
            for root in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
                if (root / rel / "memory.events").exists():
                    v2 = root / rel
                    break
    return v2


def _counter(text: str, name: str) -> int | None:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return int(value)
    return None


def read_cgroup(path: Path) -> CgroupSeen | None:
    """The OOM-kill count and limit of the memory cgroup at ``path``, None when it cannot be read (gone, or a
    kernel without the counter)."""
    try:
        if (path / "memory.oom_control").exists():  # v1
            kills = _counter((path / "memory.oom_control").read_text(), "oom_kill")
            raw = (path / "memory.limit_in_bytes").read_text().strip()
            limit = int(raw) if int(raw) < (1 << 62) else None  # v1 says "no limit" with a huge number
        else:
            kills = _counter((path / "memory.events").read_text(), "oom_kill")
            raw = (path / "memory.max").read_text().strip() if (path / "memory.max").exists() else "max"
            limit = None if raw == "max" else int(raw)
    except (OSError, ValueError):
        return None
    return CgroupSeen(path, kills, limit) if kills is not None else None


@dataclass(frozen=True, slots=True)
class Seen:
    """What the kernel said of a living process: when it started (seconds since boot, the kernel log's clock) and
    its memory cgroup."""

    started_s: float | None
    cgroup: CgroupSeen | None


def observe(pid: int) -> Seen:
    """``pid``'s start and memory cgroup as they are now."""
    try:
        ticks = int(proc_text(pid, "stat").rsplit(")", 1)[1].split()[19])
        started: float | None = ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        started = None
    path = memory_cgroup(pid)
    return Seen(started, read_cgroup(path) if path is not None else None)


def follow(pid: int, seen: Seen | None) -> Seen | None:
    """What the kernel says of ``pid`` now (``observe``), taken only while it still lives: a look that ends on a
    zombie or a gone process keeps ``seen`` (the look before), since its cgroup's count may already hold its own kill
    and would hide it."""
    now = observe(pid)
    return now if process_state(pid) not in (None, "Z", "X") else seen


def kernel_log_kill(pid: int, since_s: float | None) -> str | None:
    """The kernel log's line that says it killed ``pid`` for memory ("... Killed process <pid> (<comm>) ..."), the
    latest one written after ``since_s`` (seconds since boot: the process's start, so an earlier process with the
    same pid is not taken for it); None when the log names no such kill or cannot be read (not root, locked
    down)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    found = None
    needle = f"Killed process {pid} ("
    try:
        for _ in range(KMSG_MAX_RECORDS):
            try:
                record = os.read(fd, 8192).decode(errors="replace")
            except BlockingIOError:
                break  # the end of the log
            except BrokenPipeError:
                continue  # a record overwritten while read: the next one follows
            head, _, message = record.partition(";")
            fields = head.split(",")
            at = int(fields[2]) / 1e6 if len(fields) > 2 and fields[2].isdigit() else None
            if needle in message and (since_s is None or at is None or at >= since_s - 1.0):
                found = message.strip()
    finally:
        os.close(fd)
    return found


def cgroup_evidence(seen: CgroupSeen) -> str | None:
    """The OOM kills ``seen``'s cgroup counted since it was read, in words; None when it counted none (or is gone)."""
    now = read_cgroup(seen.path)
    if now is None or now.oom_kills <= seen.oom_kills:
        return None
    return (f"its {seen.label()} counted {now.oom_kills - seen.oom_kills} OOM kill(s) since it was last read "
            f"({seen.oom_kills} -> {now.oom_kills}, the cgroup's oom_kill counter)")


def oom_evidence(pid: int, seen: Seen | None) -> str | None:
    """Why ``pid``, dead by SIGKILL, was the OOM killer's victim, in the kernel's own words (its log line naming the
    pid, and its cgroup's OOM-kill count where it rose since ``seen``: a cgroup the process may have left since is
    not named); None when neither says so."""
    cg = seen.cgroup if seen is not None else None
    line = kernel_log_kill(pid, seen.started_s if seen is not None else None)
    counted = cgroup_evidence(cg) if cg is not None else None
    if line is not None:
        return f"the kernel log says: \"{line}\"" + (f"; {counted}" if counted is not None else "")
    return counted
