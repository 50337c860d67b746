"""ggml-rpc-server, as every build installs it: it serves this machine's CPU as a device that llama-server lists
as RPC0 when given its endpoint."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fitevict.engines.llama_cpp.devices import list_devices
from fitevict.engines.process import free_port, stop_group

pytestmark = pytest.mark.e2e


def _listening(port: int) -> bool:
    """Whether a socket listens on 127.0.0.1:``port`` (``/proc/net/tcp``: state 0A is LISTEN)."""
    want = f"0100007F:{port:04X}"
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return any(r.split()[1] == want and r.split()[3] == "0A" for r in rows)


def test_rpc_server_serves_a_device_llama_server_lists_as_rpc0(engine_bin_dir: Path, tmp_path: Path) -> None:
    server = engine_bin_dir / "ggml-rpc-server"
    assert server.is_file(), f"every build installs ggml-rpc-server beside llama-server ({engine_bin_dir})"
    port = free_port()
    log = tmp_path / "rpc-server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port), "-t", "1"], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # the server prints its banner into a buffered pipe: its listening socket is the event to wait for
        while not _listening(port):
            try:
                proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                continue
            pytest.fail(f"ggml-rpc-server exited {proc.returncode} before listening: {log.read_text()[-2000:]}")
        devices = list_devices(engine_bin_dir / "llama-server", rpc=[f"127.0.0.1:{port}"])
        rpc = [d for d in devices if d.backend == "RPC"]
        assert [(d.name, d.description) for d in rpc] == [("RPC0", f"127.0.0.1:{port}")]
        assert 0 < rpc[0].free_bytes <= rpc[0].total_bytes
        assert proc.poll() is None  # it keeps serving after a client came and went
    finally:
        stop_group(proc)
    assert proc.returncode is not None and not _listening(port)
