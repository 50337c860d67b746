"""An rpc-server process (``ggml-rpc-server``, built beside llama-server): the host's CPU offered as an RPC device.

``ggml-rpc-server -H HOST -p PORT -t THREADS`` serves until stopped; ``llama-server --rpc HOST:PORT`` then lists its
device as ``RPCn``. Started here in its own process group, so that one stop (SIGTERM the group, grace, SIGKILL) ends
it, and it dies with fitevict (``orphan_proof``); its pid is what the RPC device's reader measures
(``host.devmem.RpcServerReader``). It runs with SIGPIPE ignored (``restore_signals=False``, as Python has it): the
pinned rpc-server dies of SIGPIPE when a client goes away mid-reply (a dry run stopped after its fit step), and every
later load then fails to connect.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from fitevict.engines.process import orphan_proof, stop_group
from fitevict.host.procnet import listening_pid

BINARY = "ggml-rpc-server"
START_TIMEOUT_S = 30.0


class RpcServerError(RuntimeError):
    """The rpc-server did not start: the message quotes what it printed."""


@dataclass
class RpcServer:
    endpoint: str  # HOST:PORT, what --rpc and devices.rpc take
    proc: subprocess.Popen[bytes]
    log_path: Path | None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, grace: float = 5.0) -> int:
        """SIGTERM its group, wait ``grace``, SIGKILL the group; its exit code."""
        stop_group(self.proc, grace)
        return self.proc.wait()


def rpc_server_binary(llama_server: Path) -> Path | None:
    """The rpc-server built beside ``llama_server``, or None when that build has none."""
    p = Path(llama_server).with_name(BINARY)
    return p if p.is_file() and os.access(p, os.X_OK) else None


def start_rpc_server(binary: Path, port: int, log_path: Path | None = None, *, host: str = "127.0.0.1",
                     threads: int = 1, timeout: float = START_TIMEOUT_S) -> RpcServer:
    """Start ``binary`` on ``host:port`` (its output to ``log_path``, or dropped) and return once it listens there
    (its socket seen in /proc/net/tcp)."""
    endpoint = f"{host}:{port}"
    argv, preexec = orphan_proof([str(binary), "-H", host, "-p", str(port), "-t", str(threads)])
    with (log_path.open("wb") if log_path is not None else open(os.devnull, "wb")) as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=preexec, restore_signals=False)
    server = RpcServer(endpoint, proc, log_path)
    deadline = time.monotonic() + timeout
    while listening_pid(endpoint).pid != proc.pid:
        if proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            tail = log_path.read_text(errors="replace")[-800:] if log_path is not None else "(output dropped)"
            raise RpcServerError(f"{binary} on {endpoint} did not listen within {timeout:g} s "
                                 f"(exit code {proc.returncode}): {tail}")
        try:
            proc.wait(0.05)  # its exit ends the wait at once; listening has no event to await
        except subprocess.TimeoutExpired:
            continue
    return server
