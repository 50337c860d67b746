"""Device readers by kind, on real processes: an RPC device's memory is its rpc-server process's PSS growth, found
by the port it listens on; what cannot be read says why."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from fitevict.host.devmem import DeviceMeters, EngineReportedReader, RpcServerReader
from fitevict.host.procnet import listening_pid

MiB = 1024**2

# a stand-in server process at the process edge: it listens like an rpc-server and holds what it is told to
SERVER = r"""
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
held = []
for line in sys.stdin:
    n = int(line)
    held = bytearray(n)
    held[::4096] = b"\x01" * len(held[::4096])  # touched: resident
    print("ok", flush=True)
"""


@pytest.fixture
def server():
    p = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    port = int(p.stdout.readline())
    yield p, port
    p.kill()
    p.wait()


def _hold(p: subprocess.Popen, n: int) -> None:
    p.stdin.write(f"{n}\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "ok"


def test_the_listening_process_is_found_by_its_loopback_port(server) -> None:
    p, port = server
    assert listening_pid(f"127.0.0.1:{port}").pid == p.pid
    assert listening_pid(f"localhost:{port}").pid == p.pid
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert listening_pid(f"127.0.0.1:{free}").reason.startswith("unavailable, because nothing listens")
    remote = listening_pid("10.1.2.3:50052")
    assert remote.pid is None and "not on this machine's loopback" in remote.reason


def test_an_rpc_device_is_its_server_s_pss_growth_and_its_release_the_fall(server) -> None:
    p, port = server
    r = RpcServerReader.of("RPC0", f"127.0.0.1:{port}", total_bytes=4096 * MiB)
    assert r.pid == p.pid and r.baseline is not None
    free0 = r.free().bytes
    _hold(p, 64 * MiB)
    held = r.held_by(frozenset({12345}))  # the seat's own pids do not matter: the memory is the server's
    assert held.bytes is not None and 60 * MiB <= held.bytes <= 80 * MiB, held
    assert held.source.startswith("measured: rpc-server pid") and f"{p.pid}" in held.source
    assert free0 - r.free().bytes >= 60 * MiB
    _hold(p, 0)
    assert r.held_by(frozenset()).bytes < 16 * MiB  # back near its idle baseline


def test_a_device_nothing_reads_is_unavailable_with_its_reason_never_zero() -> None:
    r = EngineReportedReader("Vulkan0", "unavailable, because its memory is host memory")
    assert r.held_by(frozenset({1})).bytes is None and "host memory" in r.held_by(frozenset()).reason
    gone = RpcServerReader.of("RPC0", "10.0.0.9:50052", total_bytes=MiB)
    got = gone.held_by(frozenset())
    assert got.bytes is None and got.reason.startswith("unavailable, because 10.0.0.9:50052 is not on")
    assert DeviceMeters().free(["RPC7"])["RPC7"].bytes is None  # no census, no NVML: unavailable, not 0


def test_an_rpc_server_shared_by_two_clients_gives_no_seat_its_whole_growth(server) -> None:
    p, port = server
    r = RpcServerReader.of("RPC0", f"127.0.0.1:{port}", total_bytes=4096 * MiB)
    with socket.create_connection(("127.0.0.1", port)) as mine:
        me = frozenset({os.getpid()})
        assert r.held_by(me).bytes is not None  # this process is its only client
        other = subprocess.Popen([sys.executable, "-c", f"import socket,sys; s=socket.create_connection(('127.0.0.1',"
                                  f" {port})); print('up', flush=True); sys.stdin.read()"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert other.stdout.readline().strip() == "up"
            got = r.held_by(me)
            assert got.bytes is None and f"{other.pid}" in got.reason and "theirs together" in got.reason
        finally:
            other.kill()
            other.wait()
        assert mine.fileno() >= 0
