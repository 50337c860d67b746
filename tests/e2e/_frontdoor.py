"""Run a real ``fitevict serve`` for a test: its own process group, a log file, /health awaited, always stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from _server import free_port, log_tail


@dataclass(frozen=True, slots=True)
class FrontDoor:
    port: int
    base_url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    data_dir: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def requests(self, **fields) -> list[dict]:
        """The request log's lines (logger ``fitevict.request``, JSON) whose fields equal ``fields``, oldest first."""
        out = []
        for line in self.log().splitlines():
            i = line.find(' fitevict.request {')
            if i >= 0:
                got = json.loads(line[i + len(' fitevict.request '):])
                if all(got.get(k) == v for k, v in fields.items()):
                    out.append(got)
        return out

    def await_requests(self, n: int = 1, timeout: float = 30.0, **fields) -> list[dict]:
        """At least ``n`` request log lines matching ``fields``: a line is written once the answer's last byte went
        out, which the client may see first."""
        def enough() -> list[dict] | None:
            got = self.requests(**fields)
            return got if len(got) >= n else None

        return poll(enough, f"{n} request log line(s) with {fields}", timeout)


def wait_healthy(proc: subprocess.Popen[bytes], url: str, log_path: Path, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"fitevict serve exited with {proc.returncode}:\n{log_tail(log_path, 60)}")
        try:
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass  # not listening yet
        try:
            proc.wait(0.1)
        except subprocess.TimeoutExpired:
            pass  # still starting
    raise AssertionError(f"fitevict serve not healthy within {timeout} s:\n{log_tail(log_path, 60)}")


@contextmanager
def front_door(tmp: Path, *args: str, env: dict | None = None, timeout: float = 60.0) -> Iterator[FrontDoor]:
    """``fitevict serve`` with this process's environment, ``env`` over it (a value of None unsets a variable):
    no config file and, as for every test, no store unless ``env`` turns one on (tests/conftest.py). ``timeout``:
    seconds to wait for its /health."""
    port = free_port()
    data = tmp / "data"
    log_path = tmp / f"serve-{port}.log"
    argv = [sys.executable, "-m", "fitevict.cli", "serve", "--port", str(port), "--data-dir", str(data), *args]
    full_env = {k: v for k, v in {**os.environ, "FITEVICT_CONFIG": "", **(env or {})}.items() if v is not None}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=full_env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, log_path, timeout)
        yield FrontDoor(port, url, proc, log_path, data)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def engine_pids_of(parent_pid: int) -> list[int]:
    """llama-server processes whose parent is ``parent_pid``."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent_pid and cmd.endswith(b"llama-server"):
            out.append(int(d.name))
    return out


def history(fd: FrontDoor, *, key: str | None = None, limit: int = 1000, **params) -> list[dict]:
    """``GET /v1/models/history`` (newest first), with ``key`` as the bearer key where the server wants one."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.get(fd.base_url + "/v1/models/history", params={"limit": limit, **params}, headers=headers, timeout=60)
    r.raise_for_status()
    return r.json()["data"]


def poll(fn, what: str, timeout: float = 60.0):
    """Wait for an observable condition of a server we do not own (its state over HTTP): the first truthy result."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
