"""Host memory as the kernel reports it: /proc/meminfo for the machine, smaps_rollup for a process tree.

A process tree (a seat: the engine and its children) is read from ``/proc/PID/smaps_rollup``:
``committed = Pss_Anon + Pss_Shmem`` (memory that only goes away when the process does),
``mapped = Pss_File`` (file-backed pages, e.g. mmap'd weights: page cache that stays reclaimable),
and ``Rss`` for comparison (RSS counts shared pages fully in every process; PSS splits them).

When smaps_rollup cannot be read (permissions, an old kernel without the Pss_* split), the reading
falls back to ``/proc/PID/status`` (RssAnon + RssShmem, RssFile), labelled ``rss-fallback`` with the
reason. A process that cannot be read at all is ``unavailable`` with the reason -- never 0.

A process's files are read through plain string paths (``proc_text``), never ``pathlib``: Python 3.11's pathlib
interns every part of a path it parses, so each new pid or thread id read that way takes a slot in the
interpreter's table of interned strings, and freeing it leaves the slot used until the table is rebuilt. Read every
second for every seat, that churn made the table grow to twice its size (+1.8 MiB of the door's memory, once).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil

from fitevict.units import KiB

PROC = Path("/proc")

MemSource = Literal["smaps_rollup", "rss-fallback", "unavailable"]
_RANK: dict[str, int] = {"smaps_rollup": 0, "rss-fallback": 1, "unavailable": 2}


class HostMemoryError(RuntimeError):
    """The machine's memory totals could not be read."""


@dataclass(frozen=True, slots=True)
class HostMemory:
    """The machine's memory: MemTotal and MemAvailable (which counts reclaimable page cache as available)."""

    total_bytes: int
    available_bytes: int
    source: str = "meminfo"
    committed_bytes: int | None = None  # AnonPages + Shmem: anonymous memory every process holds right now


@dataclass(frozen=True, slots=True)
class ProcessMemory:
    """Host memory of one process or a process tree. Byte fields are None only when ``source == "unavailable"``."""

    pids: tuple[int, ...]  # the processes that were read (root first)
    committed_bytes: int | None  # Pss_Anon + Pss_Shmem (fallback: RssAnon + RssShmem)
    mapped_bytes: int | None  # Pss_File (fallback: RssFile)
    rss_bytes: int | None  # Rss, for comparison
    source: MemSource
    reason: str = ""  # why a fallback or unavailable source was used; which pids vanished mid-read

    @property
    def host_bytes(self) -> int | None:
        """What the host budget counts for this tree: committed + mapped."""
        if self.committed_bytes is None or self.mapped_bytes is None:
            return None
        return self.committed_bytes + self.mapped_bytes


def _kib_fields(text: str, wanted: tuple[str, ...]) -> dict[str, int]:
    """Parse "Key:   123 kB" lines, returning bytes for the wanted keys that are present."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if sep and key in wanted:
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[key] = int(parts[0]) * (KiB if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def read_meminfo(path: Path = PROC / "meminfo") -> HostMemory:
    """MemTotal and MemAvailable. Raises HostMemoryError naming the file and what was missing."""
    try:
        text = path.read_text()
    except OSError as e:
        raise HostMemoryError(f"cannot read {path}: {e}; set ram_limit to declare the host budget") from e
    f = _kib_fields(text, ("MemTotal", "MemAvailable", "AnonPages", "Shmem"))
    missing = [k for k in ("MemTotal", "MemAvailable") if k not in f]
    if missing:
        raise HostMemoryError(f"{path} has no {', '.join(missing)} (kernel < 3.14?); set ram_limit to declare the host budget")
    committed = f["AnonPages"] + f["Shmem"] if "AnonPages" in f and "Shmem" in f else None
    return HostMemory(f["MemTotal"], f["MemAvailable"], "meminfo", committed)


def proc_text(pid: int | str, name: str, *, proc: str | os.PathLike[str] = PROC) -> str:
    """The text of ``proc/PID/NAME`` (``name`` may go deeper: ``task/TID/stat``), read through a string path
    (see the module's doc). Raises ``OSError`` as ``open`` does."""
    with open(f"{os.fspath(proc)}/{pid}/{name}") as f:
        return f.read()


def proc_tasks(pid: int) -> list[str]:
    """The thread ids of ``pid`` (``/proc/PID/task``), as strings. Raises ``OSError`` when it is gone."""
    return os.listdir(f"/proc/{pid}/task")


_SMAPS_KEYS = ("Rss", "Pss_Anon", "Pss_File", "Pss_Shmem")
_STATUS_KEYS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")


def read_process(pid: int, *, proc: Path = PROC) -> ProcessMemory:
    """One process from ``proc/PID/smaps_rollup``, falling back to ``proc/PID/status``."""
    rollup, status = (f"{os.fspath(proc)}/{pid}/{name}" for name in ("smaps_rollup", "status"))
    why = ""
    try:
        f = _kib_fields(proc_text(pid, "smaps_rollup", proc=proc), _SMAPS_KEYS)
        missing = [k for k in _SMAPS_KEYS if k not in f]
        if not missing:
            return ProcessMemory(
                (pid,), f["Pss_Anon"] + f["Pss_Shmem"], f["Pss_File"], f["Rss"], "smaps_rollup"
            )
        why = f"{rollup} lacks {', '.join(missing)} (kernel older than 5.x?)"
    except OSError as e:
        why = f"cannot read {rollup}: {e.strerror or e}"
    try:
        f = _kib_fields(proc_text(pid, "status", proc=proc), _STATUS_KEYS)
    except OSError as e:
        return ProcessMemory((pid,), None, None, None, "unavailable", f"{why}; cannot read {status}: {e.strerror or e}")
    missing = [k for k in _STATUS_KEYS if k not in f]
    if missing:
        # kernel threads and zombies have no Rss* lines
        return ProcessMemory((pid,), None, None, None, "unavailable", f"{why}; {status} lacks {', '.join(missing)}")
    return ProcessMemory(
        (pid,),
        f["RssAnon"] + f["RssShmem"],
        f["RssFile"],
        f["VmRSS"],
        "rss-fallback",
        f"{why}; RSS from {status} counts shared pages fully",
    )


def descendants(pid: int) -> tuple[int, ...]:
    """Every live descendant of ``pid`` (children, grandchildren, ...); () when pid is gone."""
    try:
        return tuple(c.pid for c in psutil.Process(pid).children(recursive=True))
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return ()


def read_tree(pid: int, *, proc: Path = PROC) -> ProcessMemory:
    """``pid`` and all its descendants, summed. The source is the weakest any member had.

    A descendant that exits between listing and reading has freed its memory and is skipped (named in
    ``reason``); when the root itself cannot be read the whole tree is unavailable.
    """
    root = read_process(pid, proc=proc)
    if root.source == "unavailable":
        return root
    parts = [root]
    gone: list[int] = []
    for child in descendants(pid):
        m = read_process(child, proc=proc)
        if m.source == "unavailable":
            if psutil.pid_exists(child):
                return ProcessMemory(
                    (pid, child), None, None, None, "unavailable", f"descendant {child} unreadable: {m.reason}"
                )
            gone.append(child)
            continue
        parts.append(m)
    source = max((p.source for p in parts), key=_RANK.__getitem__)
    reasons = sorted({p.reason for p in parts if p.reason})
    if gone:
        reasons.append(f"exited while reading: {', '.join(map(str, gone))}")
    return ProcessMemory(
        tuple(p.pids[0] for p in parts),
        sum(p.committed_bytes or 0 for p in parts),  # all members have bytes: unavailable ones returned above
        sum(p.mapped_bytes or 0 for p in parts),
        sum(p.rss_bytes or 0 for p in parts),
        source,  # type: ignore[arg-type]
        "; ".join(reasons),
    )


NOT_FILES = ("/dev/", "/memfd:", "/SYSV")  # file-looking mappings that are not a file's pages on disk


@dataclass(frozen=True, slots=True)
class FilePages:
    """One process's mappings of some files, from ``/proc/PID/smaps``: ``rss`` counts their resident pages whole,
    ``pss`` its share of them (a page mapped by k processes counts 1/k); ``files`` names the files matched."""

    rss: int
    pss: int
    files: tuple[str, ...] = ()


def mapping_path(header: str) -> str | None:
    """The file a ``/proc/PID/smaps`` header line maps (``addresses perms offset dev inode path``), "" for an
    anonymous mapping, None when the line is not a header."""
    first = header.split(None, 1)[0] if header.strip() else ""
    if "-" not in first or first.endswith(":"):
        return None
    parts = header.split(None, 5)
    path = parts[5].rstrip("\n") if len(parts) > 5 else ""
    return path if path.startswith("/") and not path.startswith(NOT_FILES) else ""


def file_pages(pid: int | str, wanted: Callable[[str, str], bool]) -> FilePages | None:
    """Rss and Pss of ``pid``'s mappings of the files ``wanted(path, exe)`` picks (``exe``: the process's own
    executable, ``/proc/PID/exe``), summed over every mapping of them; None when the process cannot be read."""
    try:
        exe = os.readlink(f"{PROC}/{pid}/exe")
        text = proc_text(pid, "smaps")
    except OSError:
        return None
    rss = pss = 0
    files: set[str] = set()
    inside = False
    for line in text.splitlines():
        path = mapping_path(line)
        if path is not None:
            inside = bool(path) and wanted(path, exe)
            if inside:
                files.add(path)
        elif inside and line.startswith("Rss:"):
            rss += int(line.split()[1]) * KiB
        elif inside and line.startswith("Pss:"):
            pss += int(line.split()[1]) * KiB
    return FilePages(rss, pss, tuple(sorted(files)))


@dataclass(frozen=True, slots=True)
class OtherProcess:
    """One process that is not fitevict's, by the host memory it holds (PSS: committed + mapped)."""

    pid: int
    name: str
    bytes: int
    source: MemSource

    def to_json(self) -> dict:
        return {"pid": self.pid, "name": self.name, "bytes": self.bytes, "source": self.source}


def largest_processes(exclude: set[int], n: int = 5, *, proc: Path = PROC) -> list[OtherProcess]:
    """The ``n`` processes holding most host memory, leaving out ``exclude`` (fitevict and its seats). A process
    whose memory cannot be read (another user's, or gone) is skipped: it is not counted as 0."""
    out: list[OtherProcess] = []
    for entry in os.scandir(proc):
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        pid = int(entry.name)
        m = read_process(pid, proc=proc)
        if m.host_bytes is None or m.host_bytes == 0:
            continue
        try:
            name = proc_text(pid, "comm", proc=proc).strip()
        except OSError:
            name = "?"
        out.append(OtherProcess(pid, name, m.host_bytes, m.source))
    return sorted(out, key=lambda p: -p.bytes)[:n]


def anon_status_bytes(pid: int | str) -> int | None:
    """RssAnon + RssShmem of ``pid`` from ``/proc/PID/status`` (a counter the kernel keeps: cheap to read for every
    process), None when it cannot be read (gone, another user's, a kernel thread without those lines)."""
    try:
        f = _kib_fields(proc_text(pid, "status"), ("RssAnon", "RssShmem"))
    except OSError:
        return None
    return f["RssAnon"] + f["RssShmem"] if len(f) == 2 else None


def process_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (``R``, ``S``, ``T`` stopped, ``t`` traced, ``Z``, ...), None when it is
    gone."""
    try:
        return proc_text(pid, "stat").rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def signal_mask(pid: int, key: str, tid: str | None = None) -> int | None:
    """One signal mask of ``pid`` (of its thread ``tid`` when given) as ``/proc/PID/status`` shows it: ``SigCgt``
    (caught: a handler installed), ``SigBlk`` (blocked now), ``SigPnd`` (pending); signal N is bit N-1. None when
    it is gone or the line cannot be read."""
    try:
        status = proc_text(pid, f"task/{tid}/status" if tid is not None else "status")
    except OSError:
        return None
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name == key:
            try:
                return int(value.strip(), 16)
            except ValueError:
                return None
    return None


def cpu_ticks(pid: int) -> int | None:
    """The CPU time ``pid`` has used so far (user + system, clock ticks), None when it is gone."""
    try:
        fields = proc_text(pid, "stat").rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


PF_EXITING = 0x4  # the kernel's task flag: do_exit has begun (set before the process's files and sockets close)


def exiting(pid: int) -> bool:
    """``pid`` has exited or is exiting: gone, a zombie, or the kernel's exit under way (``PF_EXITING``). A killed
    process's sockets close during its exit, before it can be reaped: who reads a broken connection first may find
    it still exiting."""
    try:
        return stat_exiting(proc_text(pid, "stat"))
    except OSError:
        return True


def stat_exiting(stat: str) -> bool:
    """A ``/proc/PID/stat`` line says its process is a zombie, or its exit has begun (the flags field has
    ``PF_EXITING``); an unreadable line says it is gone. Pure."""
    try:
        fields = stat.rsplit(")", 1)[1].split()
        return fields[0] in ("Z", "X") or bool(int(fields[6]) & PF_EXITING)
    except (IndexError, ValueError):
        return True


def rss_bytes(pid: int | str = "self") -> int | None:
    """A process's resident set (this one's by default), read now from ``/proc/PID/statm``: the kernel's counter,
    so reading it walks no page table and takes no lock the process needs (``smaps_rollup`` does both, for tens of
    ms on a process holding GBs); None where it cannot be read."""
    try:
        with open(f"{PROC}/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def tree_rss_bytes(pid: int) -> int | None:
    """``pid``'s resident set and its descendants' (``rss_bytes``), None when ``pid`` itself cannot be read. A
    progress signal for a load, not a price's measure (that is PSS: ``read_tree``)."""
    own = rss_bytes(pid)
    return None if own is None else own + sum(rss_bytes(c) or 0 for c in descendants(pid))
