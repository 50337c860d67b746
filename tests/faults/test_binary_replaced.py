"""The engine binary replaced by another build while seats run, against one real front door (``fitevict serve``)
whose engine is the installed llama-server (a link to it, with its install record beside): the copy is replaced by a build that
differs by one byte of its version string (``0.5.0-dev`` becomes ``0.5.1-dev``), renamed into place as an install
or an upgrade would.

What the running seat does (nothing changes for it), what the next load gets (a clear refusal naming the binary and
both builds), what ``fitevict engine list`` says (the recorded build against the file on disk), and that putting the
old build back lets the load go on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from _frontdoor import FrontDoor, engine_pids_of, front_door, history
from faultrows import FaultSeen
from test_seat_faults import seat_pid

pytestmark = pytest.mark.e2e
STAMP = "INSTALLED.json"


@pytest.fixture(scope="module")
def door(zoo: dict, llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoor]:
    if not (llama_server.parent / STAMP).exists():
        pytest.skip(f"the engine at {llama_server} has no install record ({STAMP}): not installed by fitevict")
    tmp = tmp_path_factory.mktemp("binaryreplaced")
    models = tmp / "models"
    models.mkdir()
    for name in ("alive", "next"):
        shutil.copyfile(zoo["llama-gqa"].path, models / f"{name}.gguf")
    engine = tmp / "engine"
    engine.mkdir()
    # the installed build, through a link (its calibration, kept by the real file's path, is read, not redone),
    # with its install record beside the link
    (engine / "llama-server").symlink_to(llama_server)
    shutil.copy2(llama_server.parent / STAMP, engine / STAMP)
    with front_door(tmp, "--models-dir", str(models), env={"FITEVICT_LLAMA_SERVER": str(engine / "llama-server")},
                    timeout=180) as fd:
        yield fd


def ask(fd: FrontDoor, model: str) -> httpx.Response:
    return httpx.post(fd.base_url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})


def another_build(binary: Path, dest: Path) -> Path:
    """``binary`` with one byte of its version string changed: a build that says another version."""
    data = bytearray(binary.read_bytes())
    at = data.find(b"0.5.0-dev")
    assert at >= 0, "the version string is not in the binary"
    data[at + 4] = ord("1")
    dest.write_bytes(bytes(data))
    dest.chmod(0o755)
    return dest


def engine_list(binary: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "fitevict.cli", "engine", "list", "--json"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "FITEVICT_LLAMA_SERVER": str(binary)})
    return next(r for r in json.loads(out.stdout) if r["name"] == "llama-server")


@pytest.mark.fault(
    fault="the engine binary replaced by another build (one byte of its version string changed, renamed into place) "
          "while a seat runs, then a load of another model",
    kind="real door")
def test_engine_binary_replaced_while_a_seat_runs(door: FrontDoor, tmp_path: Path, fault_seen: FaultSeen) -> None:
    binary = Path(door.data_dir.parent / "engine" / "llama-server")
    assert ask(door, "alive").status_code == 200
    running = seat_pid(door, "alive")
    assert engine_list(binary)["build"]["changed"] is None
    installed = binary.resolve()
    os.replace(another_build(installed, tmp_path / "llama-server.new"), binary)
    try:
        r = ask(door, "next")
        assert fault_seen.client(r.status_code, "the new load") == 502, r.text
        err = r.json()["error"]
        message = fault_seen.client(err["message"], "message")
        assert fault_seen.client(err["code"], "code") == "load_failed"
        assert f"the engine binary {binary} changed since fitevict started" in message
        assert "restart fitevict serve" in message
        fail = next(e for e in history(door) if e["model"] == "next")
        assert fault_seen.history(fail["event"], "its event") == "fail" and fail["reason"] == err["message"]
        seats = [p for p in engine_pids_of(door.proc.pid) if "/next.gguf" in Path(f"/proc/{p}/cmdline").read_text()]
        assert fault_seen.running(seats, "its seats") == []
        assert fault_seen.client(ask(door, "alive").status_code, "the running model") == 200
        assert fault_seen.running(seat_pid(door, "alive") == running, "the running seat, the same process")  # untouched
        listed = engine_list(binary)
        assert "0.5.1-dev" in listed["version"] and "0.5.0-dev" in listed["build"]["recorded"]["version"][0]
        changed = listed["build"]["changed"]  # by the size and time the stamp recorded, or by time alone (older stamp)
        assert changed.startswith(f"{binary} is not the installed file: ") or changed.startswith(
            f"{binary} was modified after its install")
    finally:
        (tmp_path / "back").symlink_to(installed)
        os.replace(tmp_path / "back", binary)  # the old build back
    assert engine_list(binary)["build"]["changed"] is None
    assert fault_seen.client(ask(door, "next").status_code, "with the old build back") == 200
    events = [e["event"] for e in reversed(history(door)) if e["model"] == "next"]
    assert fault_seen.history(events, "its events") == ["fail", "load"]
    assert fault_seen.history(door.log().count("Traceback"), "tracebacks in the log") == 0
