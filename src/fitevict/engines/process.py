"""Process-group plumbing shared by everything that starts an engine process."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO

from fitevict.host.procmem import exiting, proc_text, process_state, stat_exiting

_PR_SET_PDEATHSIG = 1


_prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved once here: the forked child only calls it


def die_with_parent() -> None:
    """preexec_fn: ask the kernel to SIGKILL this child if fitevict dies, so no engine outlives it."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@functools.cache
def _setpriv() -> str | None:
    """util-linux's setpriv, if it can set the parent-death signal (util-linux 2.33 and later)."""
    path = shutil.which("setpriv")
    if path is None:
        return None
    try:
        usage = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return path if "--pdeathsig" in usage else None


def orphan_proof(argv: Sequence[str]) -> tuple[tuple[str, ...], Callable[[], None] | None]:
    """The argv and preexec_fn that start ``argv`` so that the kernel SIGKILLs it if fitevict dies. With setpriv,
    ``setpriv --pdeathsig KILL -- argv`` (it sets the signal and execs the engine, same pid), so no Python runs in
    the forked child and the spawn needs no full fork of the front door; without it, ``die_with_parent``."""
    setpriv = _setpriv()
    if setpriv is None:
        return tuple(argv), die_with_parent
    return (setpriv, "--pdeathsig", "KILL", "--", *argv), None


class Child:
    """An engine process, started by ``start_child``: its pid, its exit code once it exited, and an awaitable
    ``wait()`` (what fitevict used from ``asyncio.subprocess.Process``)."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self._popen = popen
        self.pid = popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit code, or None while it runs (reaps the process when it has exited)."""
        return self._popen.poll()

    async def wait(self) -> int:
        """Wait for the exit (through a pidfd: no thread and no polling) and return the exit code."""
        while (code := self._popen.poll()) is None:
            await wait_pid_gone(self.pid, None)  # the pid is still ours: nobody else reaps it
        return code


def start_child(argv: Sequence[str], *, stdout: int | IO[bytes], env: dict[str, str] | None = None) -> Child:
    """Start an engine in its own session, stdin from /dev/null, stdout and stderr to ``stdout``, killed by the
    kernel if fitevict dies (``orphan_proof``). ``subprocess.Popen`` spawns with vfork, so the front door's
    memory is not copied: 0.3-0.4 ms on this project's test machine where the event loop's own spawn (uvloop's,
    a full fork) took 6-9 ms, which a request waiting for a cold load would feel."""
    argv, preexec = orphan_proof(argv)
    return Child(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT,
                                  env=env, start_new_session=True, preexec_fn=preexec))


@dataclass(frozen=True, slots=True)
class GroupStop:
    """One stop of a process group, as ``stop_process_group`` saw it: its seconds, whether the leader had exited (or
    was exiting: ``procmem.exiting``) before the SIGTERM (a crash), whether the grace ran out and the group was
    SIGKILLed, and the leader's state then (``T``: stopped by a signal, so the SIGTERM never ran; None when it exited
    within the grace)."""

    seconds: float
    exited_before: bool = False
    killed: bool = False
    state_at_kill: str | None = None


async def stop_process_group(pgid: int | None, grace_s: float, *, proc: Child | None = None,
                             clock: Callable[[], float] = time.monotonic) -> GroupStop:
    """The one way fitevict stops an engine: SIGTERM the process group, wait ``grace_s`` for the leader to
    exit, SIGKILL the group, and make sure no member is left. Returns what it saw (``GroupStop``).

    ``proc`` (our own child, ``Child``) is awaited and reaped; without it (an orphan, or a child of another
    API) the leader is watched through a pidfd.
    """
    t0 = clock()
    if pgid is None:
        return GroupStop(0.0, exited_before=True)
    before = (proc.returncode is not None if proc is not None else not alive(pgid)) or exiting(pgid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    exited = await (_wait_child(proc, grace_s) if proc is not None else wait_pid_gone(pgid, grace_s))
    state = None
    if not exited or group_alive(pgid):
        state = process_state(pgid) if not exited else None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        if proc is not None:
            await proc.wait()
        else:
            await wait_pid_gone(pgid, 10.0)
    return GroupStop(clock() - t0, before, not exited, state)


def stop_group(proc: subprocess.Popen, grace_s: float = 5.0) -> float:
    """``stop_process_group`` for a ``subprocess.Popen`` child, from synchronous code (not on an event loop)."""
    if proc.poll() is not None:
        return 0.0
    took = asyncio.run(stop_process_group(proc.pid, grace_s))
    proc.wait()
    return took.seconds


async def _wait_child(proc: Child, timeout: float) -> bool:
    try:
        await asyncio.wait_for(asyncio.shield(proc.wait()), timeout)
        return True
    except asyncio.TimeoutError:
        return False


async def wait_pid_gone(pid: int, timeout: float | None) -> bool:
    """Wait for a process to exit (a zombie counts as gone), through a pidfd when the kernel has one.
    Returns False when it still runs at ``timeout``."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):  # no pidfd on this kernel: poll the pid instead
        deadline = None if timeout is None else time.monotonic() + timeout
        while alive(pid) and (deadline is None or time.monotonic() < deadline):
            await asyncio.sleep(0.05)
        return not alive(pid)
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(fd, lambda: done.done() or done.set_result(None))
    try:
        await asyncio.wait_for(done, timeout)
        return True
    except asyncio.TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the engine binds it right after; a race loses only that start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not alive for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def group_alive(pgid: int) -> bool:
    """True while a process of group ``pgid`` runs: one that is neither a zombie nor exiting. A member killed with
    its parent (the door) is reparented and may stay a zombie until its new parent reaps it; the group still exists
    for the kernel then (``killpg(pgid, 0)`` succeeds), but nothing of it runs or holds memory."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stats = _group_stats(pgid)
    return stats is None or any(not stat_exiting(stat) for stat in stats)


def _group_stats(pgid: int) -> list[str] | None:
    """The ``/proc/PID/stat`` lines of the members of group ``pgid`` (a process that vanished while read is left
    out); None without ``/proc``."""
    out = []
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return None
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = proc_text(entry.name, "stat")
        except OSError:
            continue
        try:
            if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
                out.append(stat)
        except (IndexError, ValueError):
            continue
    return out


def cmdline(pid: int) -> list[str]:
    """The argv of ``pid`` from /proc, or [] when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []
