"""The launcher alone (``seat.launching.Launcher``), with a real engine process: a tiny HTTP server run by
Python, which answers ``/health`` once it listens, and says what llama-server says when its port is taken. A port
taken between its choice and the bind is retried once on another port; any other failure, or a second bind failure,
is final and handed back."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

from fitevict.config import EngineConfig
from fitevict.engines.base import LaunchSpec
from fitevict.engines.process import free_port
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.schedule.errors import LoadFailed
from fitevict.schedule.seats import Seat, SeatTable
from fitevict.seat.launching import Attempt, Failed, Launcher
from fitevict.engines.llama_cpp.server import BIND_FAILED

from . import fakeparts

ENGINE = f"""
import http.server, sys
port, mode = int(sys.argv[1]), sys.argv[2]
if mode == "broken":
    print("error: the model file is not a GGUF", flush=True)
    sys.exit(1)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
try:
    server = http.server.HTTPServer(("127.0.0.1", port), Health)
except OSError as e:
    print("{BIND_FAILED}: " + str(e), flush=True)
    sys.exit(1)
server.serve_forever()
"""


class Processes:
    """The engine's argv (``mode``: serve, or exit as a broken model does), ports from ``ports`` in turn, one log per
    attempt; the logs it was told it may let go."""

    def __init__(self, tmp: Path, ports: list[int], mode: str = "serve") -> None:
        self.tmp, self.ports, self.mode = tmp, ports, mode
        self.chosen: list[int] = []
        self.done: list[Path] = []
        (tmp / "engine.py").write_text(ENGINE)

    def next_port(self) -> int:
        self.chosen.append(self.ports[len(self.chosen)])
        return self.chosen[-1]

    def log_path(self, key: str) -> Path:
        return self.tmp / f"{key}-{len(self.chosen)}.log"

    def launch_spec(self, entry, path: Path, cfg: LoadConfig, port: int) -> LaunchSpec:
        argv = (sys.executable, str(self.tmp / "engine.py"), str(port), self.mode)
        return LaunchSpec(argv, dict(os.environ), port, "/health")

    def done_with_log(self, path: Path) -> None:
        self.done.append(path)


PRICES = SimpleNamespace(signature=lambda path, cfg: "sig", own_overhead=lambda path, cfg: None,
                         host_buffers=lambda: "")


def _launch(tmp_path: Path, ports: list[int], mode: str = "serve"):
    table = SeatTable()
    table.place(Seat("m", LoadConfig(n_ctx=512), "m", 0.0))
    processes = Processes(tmp_path, ports, mode)
    records, ending = fakeparts.Records(), fakeparts.Ending()
    spawned: list[str] = []

    async def changed() -> None:
        pass

    async def scenario() -> tuple[Attempt, Failed | None]:
        launcher = Launcher(processes, table, asyncio.get_running_loop().time,
                            EngineConfig(health_timeout_seconds=60, stall_seconds=60), prices=PRICES,  # type: ignore
                            ending=ending, records=records, spawned=lambda key, cfg: spawned.append(key),
                            changed=changed)
        attempt = Attempt()
        plan = SimpleNamespace(key="m", action="load", split="")
        got = await launcher.launch(attempt, fakeparts.entry(), LoadConfig(n_ctx=512), tmp_path / "m.gguf",
                                    fakeparts.PRICE, plan)  # type: ignore[arg-type]
        return attempt, got

    attempt, got = asyncio.run(scenario())
    return SimpleNamespace(attempt=attempt, failed=got, processes=processes, records=records, ending=ending,
                           spawned=spawned, table=table)


def _stop(seat) -> None:
    if seat is not None and seat.pgid is not None and seat.proc.returncode is None:
        os.killpg(seat.pgid, signal.SIGKILL)


def test_a_taken_port_is_retried_once_on_another(tmp_path: Path) -> None:
    squatter = socket.socket()  # another program, listening on the port chosen first
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken, free = squatter.getsockname()[1], free_port()
    try:
        got = _launch(tmp_path, [taken, free])
    finally:
        squatter.close()
    seat = got.attempt.seat
    try:
        assert got.failed is None and seat.port == free and got.processes.chosen == [taken, free]
        assert seat.proc.returncode is None and got.table.get("m").process is seat  # it serves, attached
        first_log = tmp_path / "m-1.log"
        assert BIND_FAILED in first_log.read_text() and got.processes.done == [first_log]  # read, then let go
        assert len(got.ending.calls) == 1 and got.spawned == ["m", "m"]  # the first attempt ended, one more start
        ids = [i for i, _ in got.records.kept]
        assert [s for _, s in got.records.kept] == [None, None, "ready"] and ids[1] == ids[2] == seat.id != ids[0]
    finally:
        _stop(seat)


def test_a_second_bind_failure_is_final(tmp_path: Path) -> None:
    squatters = [socket.socket(), socket.socket()]
    for s in squatters:
        s.bind(("127.0.0.1", 0))
        s.listen()
    try:
        got = _launch(tmp_path, [s.getsockname()[1] for s in squatters] + [free_port()])
    finally:
        for s in squatters:
            s.close()
    assert isinstance(got.failed, Failed) and isinstance(got.failed.error, LoadFailed)
    assert len(got.processes.chosen) == 2 and len(got.ending.calls) == 2  # no third start
    assert got.failed.res.freed_bytes == fakeparts.FREED
    assert [s for _, s in got.records.kept] == [None, None]  # never ready


def test_any_other_failure_is_final_at_once(tmp_path: Path) -> None:
    got = _launch(tmp_path, [free_port(), free_port()], mode="broken")
    assert isinstance(got.failed, Failed) and "exited with code 1" in str(got.failed.error)
    assert "not a GGUF" in str(got.failed.error)  # the log's tail, in the error
    assert got.spawned == ["m"] and len(got.ending.calls) == 1 and got.attempt.crash is None
