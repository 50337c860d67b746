"""A third engine family serves a request end to end: ``tests/engines/echo_engine.py`` (one module) and one
registry entry, added by the process that runs ``fitevict serve``; nothing else of fitevict is edited. The request
goes through the real front door on loopback, the catalog, the price, the plan, the seat's start and the relay."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from _frontdoor import FrontDoor, history, wait_healthy
from _server import free_port

pytestmark = pytest.mark.e2e
ENGINES_DIR = Path(__file__).resolve().parent.parent / "engines"
# the serving process of `fitevict serve` (fitevict.server.main), with the one registry entry added first
REGISTER = ("import sys; sys.path.insert(0, {dir!r}); import fitevict.engines as e; "
            "e.REGISTRY['echo'] = 'echo_engine:EchoEngine'; from fitevict.server.main import main; "
            "sys.exit(main(sys.argv[1:]))")


def echo_seats(door_pid: int) -> list[int]:
    """The door's children that run the echo engine's seat."""
    import psutil

    return [c.pid for c in psutil.Process(door_pid).children() if "echo_engine.py" in " ".join(c.cmdline())]


def _serve(tmp: Path, cfg: Path):
    port = free_port()
    overrides = {"server.port": port, "data_dir": str(tmp / "data")}
    log_path = tmp / "serve.log"
    env = {**os.environ, "FITEVICT_CONFIG": ""}
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", REGISTER.format(dir=str(ENGINES_DIR)), "--config", str(cfg),
                                 "--overrides", json.dumps(overrides)], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    fd = FrontDoor(port, f"http://127.0.0.1:{port}", proc, log_path, tmp / "data")
    wait_healthy(proc, fd.base_url, log_path)
    return fd


def test_a_third_engine_added_by_its_module_and_the_registry_serves_a_request(tmp_path: Path, zoo: dict) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "parrot.gguf")
    cfg = tmp_path / "fitevict.toml"
    cfg.write_text(f'[models.parrot]\npath = "{models / "parrot.gguf"}"\nengine = "echo"\n')
    fd = _serve(tmp_path, cfg)
    try:
        r = httpx.post(fd.base_url + "/v1/chat/completions", timeout=120,
                       json={"model": "parrot", "messages": [{"role": "user", "content": "hello third engine"}]})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "echo: hello third engine"
        seats = echo_seats(fd.proc.pid)
        assert len(seats) == 1
        residents = httpx.get(fd.base_url + "/v1/models/residents", timeout=30).json()["data"]
        assert [(x["key"], x["engine"]) for x in residents] == [("parrot", "echo")]
        load = next(e for e in history(fd) if e["event"] == "load")
        assert load["model"] == "parrot" and load["engine"] == "echo"
        # its own account of what it holds (the file, read whole), as the engine class parsed it from the seat's log
        host = load["details"]["measured"]["devices"][0]
        assert (host["model_bytes"], host["sources"]["model"]) == ((models / "parrot.gguf").stat().st_size,
                                                                   "engine-reported")
    finally:
        os.killpg(fd.proc.pid, signal.SIGTERM)
        code = fd.proc.wait(30)
    assert code == 0, fd.log()
    assert all(not psutil_alive(pid) for pid in seats)  # the seat stopped with its door


def psutil_alive(pid: int) -> bool:
    import psutil

    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
