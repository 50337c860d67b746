"""Process-group plumbing shared by everything that starts an engine process."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: ask the kernel to SIGKILL this child if fitevict dies, so no engine outlives it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def stop_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the process group, wait ``grace_s``, then SIGKILL it (blocking)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        proc.wait(timeout=grace_s)


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
    """True while any process of group ``pgid`` exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cmdline(pid: int) -> list[str]:
    """The argv of ``pid`` from /proc, or [] when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []
