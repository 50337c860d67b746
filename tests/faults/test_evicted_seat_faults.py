"""A seat that is killed or frozen while it is evicted, against one real front door (``fitevict serve``), real
llama-server seats and a RAM budget that fits one of two models: a request for the other evicts it.

The evicted seat is stopped by a signal (``SIGSTOP``) before the request that evicts it, so that the eviction's
``SIGTERM`` waits on it: left so, it is still frozen when the stop's grace runs out; or it is ``SIGKILL``ed once the
``SIGTERM`` is seen pending on it (its ``/proc`` status), within the grace. For each: the eviction's event says how the
seat ended during its stop, next to its release verification, no ``crash`` is recorded for it, and the request that
evicted it gets its answer.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from _frontdoor import FrontDoor, front_door, history, poll
from _models import medium_host_bytes
from faultrows import FaultSeen
from test_seat_faults import ends, gone, kill_left, seat_pid

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
GRACE_S = 5.0  # engine.stop_grace_seconds


@contextmanager
def swap_door(zoo: dict, tmp: Path, policy: str = "") -> Iterator[FrontDoor]:
    """A front door over two copies of the medium model, med-a and med-b, with room for one seat (the other model's
    load evicts it); ``policy``: more ``[policy]`` lines. A frozen seat is never killed by the stuck-seat watch
    within a test."""
    models = tmp / "models"
    models.mkdir()
    for name in ("med-a", "med-b"):
        shutil.copyfile(zoo["llama-medium"].path, models / f"{name}.gguf")
    cfg = tmp / "fitevict.toml"
    cfg.write_text(f"[budget]\nram_limit = {int(1.5 * medium_host_bytes(models))}\nram_reserve = 0\n"
                   f"[policy]\nprompt_cache = false\nmin_residency_seconds = 0\n{policy}"
                   f"[engine]\nstall_seconds = 600\nstop_grace_seconds = {GRACE_S}\nrelease_timeout_seconds = 20\n")
    with front_door(tmp, "--config", str(cfg), "--models-dir", str(models), timeout=180) as fd:
        yield fd


@pytest.fixture(scope="module")
def door(zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoor]:
    with swap_door(zoo, tmp_path_factory.mktemp("evictfaults")) as fd:
        yield fd


def ask(fd: FrontDoor, model: str) -> httpx.Response:
    return httpx.post(fd.base_url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})


def resident(fd: FrontDoor, model: str) -> int:
    """``model`` loaded (the other one evicted for it, if it was resident): its seat's pid."""
    r = ask(fd, model)
    assert r.status_code == 200, r.text
    return seat_pid(fd, model)


def last_evict(fd: FrontDoor, model: str) -> dict:
    return next(e for e in history(fd) if e["model"] == model and e["event"] == "evict")


def sigterm_pending(pid: int) -> bool:
    """The stop's SIGTERM is pending on ``pid`` (stopped by a signal, it cannot act on it)."""
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":\t" in line)
    return any(int(status[k], 16) & (1 << (signal.SIGTERM - 1)) for k in ("ShdPnd", "SigPnd"))


def evict_frozen(fd: FrontDoor, victim: str, other: str, *, kill_at_stop: bool) -> tuple[int, httpx.Response]:
    """``victim`` resident and stopped by SIGSTOP, then ``other`` asked for (which evicts it); with ``kill_at_stop``
    the victim SIGKILLed once the eviction's SIGTERM is pending on it. The victim's pid and ``other``'s answer."""
    pid = resident(fd, victim)
    os.kill(pid, signal.SIGSTOP)
    got: list[httpx.Response] = []
    t = threading.Thread(target=lambda: got.append(ask(fd, other)))
    t.start()
    try:
        if kill_at_stop:
            poll(lambda: sigterm_pending(pid), "the eviction's SIGTERM pending on the frozen seat", timeout=120)
            os.kill(pid, signal.SIGKILL)
        t.join(180)
    finally:
        kill_left(pid)
    assert got, f"no answer for {other}"
    poll(lambda: gone(pid), f"seat pid {pid} reaped")
    return pid, got[0]


def check_evicted(fd: FrontDoor, victim: str, other: str, pid: int, answer: httpx.Response, seen: FaultSeen) -> dict:
    """``other`` answered; ``victim``'s eviction recorded, with its release verification, and no crash."""
    assert seen.client(answer.status_code, "the request that evicted it") == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] is not None
    # recorded once its release is verified (or its timeout passes), which may be after the other model answered
    poll(lambda: ends(fd, victim)[-1:] == ["evict"], f"{victim}'s eviction in history")
    assert seen.history(ends(fd, victim)[-2:], "the victim's last events") == ["load", "evict"]
    assert "crash" not in ends(fd, victim)
    ev = last_evict(fd, victim)
    assert ev["details"]["pid"] == pid and other in ev["reason"]
    assert isinstance(seen.history(ev["details"]["release_verified"], "release_verified"), bool)
    assert ev["details"]["release_note"]
    assert seen.running(gone(pid), "the frozen seat's process reaped") is True
    assert seen.running(seat_pid(fd, other) != pid, "the other model's seat, a new process") is True
    return ev


@pytest.mark.fault(
    fault="a seat frozen (`SIGSTOP`) when its eviction begins: the eviction's `SIGTERM` waits on it for the whole stop "
          "grace (5 s in the test)",
    kind="real door")
def test_a_seat_frozen_when_its_eviction_begins_is_killed_after_the_grace(door: FrontDoor,
                                                                         fault_seen: FaultSeen) -> None:
    pid, answer = evict_frozen(door, "med-a", "med-b", kill_at_stop=False)
    ev = check_evicted(door, "med-a", "med-b", pid, answer, fault_seen)
    d = ev["details"]
    assert fault_seen.history(d["stop_ended"], "stop_ended") == "frozen"
    assert fault_seen.history(d["stop_exit_code"], "stop_exit_code") == -signal.SIGKILL, d
    note = fault_seen.history(d["stop_ended_note"], "stop_ended_note")
    assert "stopped by a signal (state T)" in note and "killed by the stop's SIGKILL" in note
    assert f"grace of {GRACE_S:g} s" in note
    assert d["exit_seconds"] >= GRACE_S


@pytest.mark.fault(
    fault="a seat `SIGKILL`ed by another sender while it is evicted (the eviction's `SIGTERM` pending on it, within "
          "the stop's grace)",
    kind="real door")
def test_a_seat_killed_while_it_is_evicted_says_so(door: FrontDoor, fault_seen: FaultSeen) -> None:
    pid, answer = evict_frozen(door, "med-b", "med-a", kill_at_stop=True)
    ev = check_evicted(door, "med-b", "med-a", pid, answer, fault_seen)
    d = ev["details"]
    assert fault_seen.history(d["stop_ended"], "stop_ended") == "killed"
    assert fault_seen.history(d["stop_exit_code"], "stop_exit_code") == -signal.SIGKILL, d
    # within its grace: the stop saw the exit before its own SIGKILL (``stop_account``), not a wall-clock figure
    note = fault_seen.history(d["stop_ended_note"], "stop_ended_note")
    assert "ended by signal 9 (SIGKILL) during the stop, within its grace: not the stop's" in note
    plain = resident(door, "med-b")  # an eviction whose seat runs: it ends on the SIGTERM
    normal = last_evict(door, "med-a")["details"]
    assert normal["stop_ended"] == "sigterm" and "exited on the stop's SIGTERM" in normal["stop_ended_note"], normal
    assert seat_pid(door, "med-b") == plain
