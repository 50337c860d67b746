"""A transformers (torch) seat that dies, freezes or is told to stop while it generates, against one real front door
and real torch seat processes: the client gets an error in its API's shape, history's ``crash`` says how the seat
ended, nothing of it is left running, and the next request loads the model again."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from fitevict.engines.transformers.seat import STARTED_LINE
from _frontdoor import FrontDoor, front_door, history, poll
from faultrows import FaultSeen
from test_seat_faults import STALL_S, ends, gone, kill_left

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
HF = "hf-llama-gqa"
CAUSES = {signal.SIGKILL: "killed", signal.SIGSTOP: "frozen", signal.SIGTERM: "told-to-stop"}


@pytest.fixture(scope="module")
def door(hf_zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoor]:
    tmp = tmp_path_factory.mktemp("torchfaults")
    models = tmp / "models"
    models.mkdir()
    for sig in CAUSES:
        shutil.copytree(hf_zoo[HF].path, models / sig.name.lower())
    cfg = tmp / "fitevict.toml"
    cfg.write_text(f"[policy]\nprompt_cache = false\n[engine]\nstall_seconds = {STALL_S}\n")
    with front_door(tmp, "--config", str(cfg), "--models-dir", str(models), timeout=240) as fd:
        yield fd


def torch_seat_pid(fd: FrontDoor, model: str) -> int:
    """The pid of ``model``'s torch seat (a child of the front door running ``fitevict.engines.transformers.seat``)."""
    pids = [c.pid for c in psutil.Process(fd.proc.pid).children(recursive=True)
            if "transformers.seat" in (cmd := " ".join(c.cmdline())) and f"/{model}" in cmd]
    assert len(pids) == 1, pids
    return pids[0]


def chat(fd: FrontDoor, model: str, **body) -> httpx.Response:
    return httpx.post(fd.base_url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], **body})


@pytest.mark.fault(
    fault="a transformers (torch) seat `SIGKILL`ed, `SIGSTOP`ped or sent `SIGTERM` by another program while it "
          "generates a streamed answer",
    kind="real door")
@pytest.mark.parametrize("sig", list(CAUSES), ids=lambda s: s.name)
def test_a_torch_seat_faulted_mid_answer(door: FrontDoor, sig: signal.Signals, fault_seen: FaultSeen) -> None:
    model = sig.name.lower()
    assert chat(door, model, max_tokens=2).status_code == 200
    pid = torch_seat_pid(door, model)
    log = Path(os.readlink(f"/proc/{pid}/fd/2"))  # the seat's log
    done = threading.Event()

    def hit_once_begun() -> None:  # the seat's log says the answer began (the first request's came before)
        poll(lambda: done.is_set() or log.read_text(errors="replace").count(STARTED_LINE) == 2, "the answer begun")
        if not done.is_set():
            os.kill(pid, sig)

    hit = threading.Thread(target=hit_once_begun)  # not on the client's 200: its head may come with the first text,
    hit.start()  # and the streamer sends whole words, so the first text may come only at the end
    lines = []
    try:
        with httpx.stream("POST", door.base_url + "/v1/chat/completions", timeout=60, json={
                "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3000,
                "ignore_eos": True, "stream": True}) as r:  # random weights may say EOS before the signal lands
            assert fault_seen.client(r.status_code, "status") == 200
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    finally:
        done.set()
        hit.join()
    try:
        _the_fault_was_told(door, model, sig, pid, lines, fault_seen)
    finally:
        kill_left(pid)  # only a seat a failed test left running: a SIGTERMed seat ends on its own
    assert fault_seen.client(chat(door, model, max_tokens=2).status_code, "the next request") == 200
    assert fault_seen.running(torch_seat_pid(door, model) != pid, "the next request's seat a new process") is True
    assert fault_seen.history(ends(door, model)[-1], "then") == "load"


def _the_fault_was_told(door: FrontDoor, model: str, sig: signal.Signals, pid: int, lines: list[str],
                        seen: FaultSeen) -> None:
    """What the client saw, the seat reaped, and its crash in history with the signal's cause."""
    # a seat told to stop cuts its answer at the next token before its teardown: never a whole answer
    error = json.loads(lines[-1][len("data: "):])["error"]
    assert error["type"] == "engine_error" and seen.client(error["code"], "its last event's error.code") == \
        "engine_lost", error
    poll(lambda: gone(pid), f"seat pid {pid} reaped")
    assert seen.running(gone(pid), "the seat reaped") is True
    poll(lambda: ends(door, model)[-1:] == ["crash"], "the crash in history")
    assert seen.history(ends(door, model), "the model's events") == ["load", "crash"]
    crash = next(e for e in history(door) if e["model"] == model and e["event"] == "crash")
    assert seen.history(crash["details"]["cause"], "`crash` cause") == CAUSES[sig] and crash["details"]["pid"] == pid
    if sig == signal.SIGTERM:
        assert crash["details"]["exit_code"] == 0 and "SIGTERM received" in crash["reason"], crash
