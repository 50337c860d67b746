"""Process-group plumbing shared by everything that starts an engine process."""

from __future__ import annotations

import ctypes
import os
import signal
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
