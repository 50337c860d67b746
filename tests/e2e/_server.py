"""Run one real llama-server for a test: own process group, log to a file, wait for /health, always stop.

    with running_server(llama_server, model.path, "-dev", "none", "-c", "512", "-np", "1") as srv:
        httpx.post(f"{srv.base_url}/v1/chat/completions", json=...)

A server that exits or does not become healthy within ``timeout`` fails the test with the tail of its log.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

STOP_GRACE_S = 10.0
CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGILL, signal.SIGBUS, signal.SIGABRT)


class EngineCrashed(AssertionError):
    """The engine died by a crash signal before it was healthy (the pinned build does, on Intel AMX, with quantized
    weights and repacking on)."""

    def __init__(self, why: str, signal_name: str) -> None:
        super().__init__(why)
        self.signal_name = signal_name


@dataclass(frozen=True, slots=True)
class ServerHandle:
    port: int
    base_url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def free_port() -> int:
    """A loopback port that was free a moment ago (the server binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_group(proc: subprocess.Popen[bytes], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group, wait ``grace`` seconds, then SIGKILL it; reap the leader."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass  # exited between poll and kill
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace)
    # children that outlived the leader
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the group is gone: nothing left to stop


def _wait_healthy(proc: subprocess.Popen[bytes], base_url: str, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    with httpx.Client(timeout=2.0) as client:
        while True:
            try:
                r = client.get(f"{base_url}/health")
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}"
            except httpx.TransportError as e:
                last = f"{type(e).__name__}"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"llama-server at {base_url} not healthy after {timeout:.0f}s (last: {last}); "
                    f"log {log_path}:\n{log_tail(log_path)}"
                )
            try:
                # waits for the process to exit, at most a short poll interval
                rc = proc.wait(timeout=min(0.1, remaining))
            except subprocess.TimeoutExpired:
                continue
            why = f"llama-server exited with code {rc} before becoming healthy; log {log_path}:\n{log_tail(log_path)}"
            if -rc in CRASH_SIGNALS:
                raise EngineCrashed(why, signal.Signals(-rc).name)
            raise AssertionError(why)


@contextmanager
def running_server(
    binary: Path,
    model_path: Path,
    *args: str,
    timeout: float = 60.0,
    log_path: Path | None = None,
) -> Iterator[ServerHandle]:
    """Start ``binary -m model_path --host 127.0.0.1 --port <free> *args``, yield once /health is 200, then stop.

    Without ``log_path`` the log goes to a temporary file that is removed after a clean run and kept
    (and named in the failure) otherwise.
    """
    own_log = log_path is None
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    cmd = [str(binary), "-m", str(model_path), "--host", "127.0.0.1", "--port", str(port), *args]
    clean = False
    with log_path.open("wb") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            _wait_healthy(proc, base_url, log_path, timeout)
            yield ServerHandle(port=port, base_url=base_url, proc=proc, log_path=log_path)
            clean = True
        finally:
            stop_group(proc)
    if own_log and clean:
        log_path.unlink(missing_ok=True)
