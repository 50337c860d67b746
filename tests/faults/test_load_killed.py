"""A seat killed or stopped before it is ready, against one real front door (``fitevict serve``) and real llama-server
seats: by the kernel's OOM killer of a memory cgroup the seat was moved into, by a plain ``SIGKILL`` whose sender the
kernel does not name, or stopped by ``SIGSTOP`` (a load that stalls).

The load is held by the fault shim (``faultshim.c``, hold-open): the new engine blocks before it opens the model
file and writes its pid to a marker file; the test then moves that pid into a capped memory cgroup (skipped where
this machine gives none) or kills it, and lets it go on. For each: what the client receives (the load's failure,
naming how the engine ended), what history's ``fail`` says (its cause, in the words a serving seat's ``crash``
uses, with the kernel's own where it gives them), and that the next request loads the model and is served.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from _cgroups import memory_cgroup, remove_cgroup
from _frontdoor import FrontDoor, engine_pids_of, front_door, history, poll
from faultrows import FaultSeen
from _shim import build_shim, shim_env
from test_seat_faults import ends, gone

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
CAP_BYTES = 2 << 20  # the memory cap: a seat charges its buffers to its new cgroup as it loads


@contextlib.contextmanager
def held_door(zoo: dict, tmp: Path, names: tuple[str, ...], stall_seconds: float) -> Iterator[tuple[FrontDoor, Path]]:
    """A door serving copies of llama-gqa named ``names``, whose engines hold before they open a model file while
    the flag file (returned) exists."""
    models = tmp / "models"
    models.mkdir()
    for name in names:
        shutil.copyfile(zoo["llama-gqa"].path, models / f"{name}.gguf")
    cfg = tmp / "fitevict.toml"
    cfg.write_text(f"[policy]\nprompt_cache = false\n[engine]\nstall_seconds = {stall_seconds:g}\n")
    flag, shim = tmp / "hold", tmp / "shim"
    shim.mkdir()
    env = shim_env(build_shim(shim), models, flag, "hold-open", exe="llama-server")
    with front_door(tmp, "--config", str(cfg), "--models-dir", str(models), env=env, timeout=180) as fd:
        poll(lambda: (p := httpx.get(fd.base_url + "/health").json()["prices_read_ahead"])["done"] == p["models"],
             "the prices read ahead (the dry run opens the file too)")
        yield fd, flag


@pytest.fixture(scope="module")
def held(zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FrontDoor, Path]]:
    """A door whose engines may be held as long as a test needs (a load stalls only after 120 s)."""
    with held_door(zoo, tmp_path_factory.mktemp("loadkilled"), ("oom", "killed"), 120) as door:
        yield door


def ask(fd: FrontDoor, model: str) -> httpx.Response:
    return httpx.post(fd.base_url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})


def held_load(fd: FrontDoor, flag: Path, model: str, fault) -> tuple[int, httpx.Response]:
    """Ask for ``model`` with its engine held before it opens the model file; ``fault(pid)`` once it is held, then
    the hold released. The engine's pid and the client's answer."""
    marker = Path(f"{flag}.held")
    marker.unlink(missing_ok=True)
    flag.touch()
    got: list[httpx.Response] = []
    t = threading.Thread(target=lambda: got.append(ask(fd, model)))
    t.start()
    try:
        poll(lambda: marker.exists() and marker.read_text().strip(), "the engine held before it opens the model",
             timeout=60)
        pid = int(marker.read_text())
        assert pid in engine_pids_of(fd.proc.pid) and f"/{model}.gguf" in Path(f"/proc/{pid}/cmdline").read_text()
        fault(pid)
    finally:
        flag.unlink(missing_ok=True)
        t.join(120)
    assert got, f"no answer for {model}"
    return pid, got[0]


def check_failed(fd: FrontDoor, model: str, pid: int, answer: httpx.Response, seen: FaultSeen) -> dict:
    """The client told the load failed (502 ``load_failed``); its ``fail`` in history (returned), the engine reaped."""
    assert seen.client(answer.status_code, "status") == 502, answer.text
    error = answer.json()["error"]
    assert error["type"] == "engine_error" and seen.client(error["code"], "code") == "load_failed"
    poll(lambda: gone(pid), f"engine pid {pid} reaped")
    assert seen.running(gone(pid), "the engine reaped") is True
    assert seen.history(ends(fd, model), "its events") == ["fail"]
    fail = next(e for e in history(fd) if e["model"] == model and e["event"] == "fail")
    assert fail["details"]["pid"] == pid
    assert seen.history(fail["details"]["exit_code"], "`fail` exit_code") == -signal.SIGKILL
    assert seen.client(fail["reason"] == error["message"], "its message is the `fail` reason") is True
    return fail


def check_loads(fd: FrontDoor, model: str, seen: FaultSeen) -> None:
    r = ask(fd, model)
    assert seen.client(r.status_code, "the next request") == 200, r.text
    assert seen.history(ends(fd, model), "then") == ["fail", "load"]


@pytest.mark.fault(
    fault="a seat killed by the kernel's OOM killer before it is ready: its engine, held before it opens the model, "
          "moved into a memory cgroup capped at 2 MiB, then let load",
    kind="real door")
def test_a_seat_oom_killed_before_it_is_ready(held: tuple[FrontDoor, Path], fault_seen: FaultSeen) -> None:
    fd, flag = held
    cgroup = memory_cgroup(CAP_BYTES, "an OOM kill of a loading seat in a memory cgroup")
    try:
        pid, answer = held_load(fd, flag, "oom", lambda p: (cgroup / "cgroup.procs").write_text(str(p)))
        fail = check_failed(fd, "oom", pid, answer, fault_seen)
    finally:
        remove_cgroup(cgroup)
    d = fail["details"]
    if d["cause"] != "oom-killer" and not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("the kernel log (/dev/kmsg) cannot be read here, and the engine was killed before the door looked "
                    "at it in its new cgroup: no witness could name the OOM killer")
    assert fault_seen.history(d["cause"], "cause") == "oom-killer" and d["oom"], d
    assert f"Killed process {pid} (" in d["oom"] or str(cgroup) in d["oom"]
    reason = fault_seen.history(fail["reason"], "reason")
    assert "was killed by the kernel's OOM killer (SIGKILL, exit code -9)" in reason
    assert d["oom"] in reason and "(cause: oom-killer)" in reason
    check_loads(fd, "oom", fault_seen)


@pytest.mark.fault(
    fault="a seat `SIGKILL`ed before it is ready by a sender the kernel does not name (its engine held before it "
          "opens the model, then killed)",
    kind="real door")
def test_a_seat_killed_before_it_is_ready_is_killed_not_oom(held: tuple[FrontDoor, Path],
                                                           fault_seen: FaultSeen) -> None:
    fd, flag = held
    pid, answer = held_load(fd, flag, "killed", lambda p: os.kill(p, signal.SIGKILL))
    fail = check_failed(fd, "killed", pid, answer, fault_seen)
    assert fault_seen.history(fail["details"]["cause"], "cause") == "killed"
    assert fault_seen.history(fail["details"]["oom"], "oom") is None, fail["details"]
    reason = fault_seen.history(fail["reason"], "reason")
    assert "was killed (SIGKILL, exit code -9: the kernel's OOM killer, or another program)" in reason
    assert "(cause: killed)" in reason
    check_loads(fd, "killed", fault_seen)


@pytest.fixture(scope="module")
def held_briefly(zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FrontDoor, Path]]:
    """A door whose loads stall after ``engine.stall_seconds`` = 2 (a hold is let go at once after its fault)."""
    with held_door(zoo, tmp_path_factory.mktemp("loadstopped"), ("stopped",), 2) as door:
        yield door


@pytest.mark.fault(
    fault="a seat `SIGSTOP`ped before it is ready (its engine held before it opens the model, stopped, then let go)",
    kind="real door")
def test_a_seat_stopped_before_it_is_ready_stalls_its_load(held_briefly: tuple[FrontDoor, Path],
                                                          fault_seen: FaultSeen) -> None:
    fd, flag = held_briefly
    pid, answer = held_load(fd, flag, "stopped", lambda p: os.kill(p, signal.SIGSTOP))
    assert fault_seen.client(answer.status_code, "status") == 502, answer.text
    error = answer.json()["error"]
    assert error["type"] == "engine_error" and fault_seen.client(error["code"], "code") == "load_failed", error
    message = fault_seen.client(error["message"], "message")
    assert "load stalled" in message and "was stopped by a signal (state T)" in message, error
    poll(lambda: gone(pid), f"engine pid {pid} reaped")
    assert fault_seen.running(gone(pid), "the engine reaped") is True
    assert fault_seen.history(ends(fd, "stopped"), "its events") == ["fail"]
    fail = next(e for e in history(fd) if e["model"] == "stopped" and e["event"] == "fail")
    assert fault_seen.history(fail["reason"] == error["message"], "the `fail` reason is the message") is True
    assert fail["details"]["pid"] == pid, fail
    check_loads(fd, "stopped", fault_seen)
