"""A seat `SIGKILL`ed while it drains, against one real front door (``fitevict serve``), real llama-server seats and a
RAM budget that fits one of two models.

A seat drains when its turn is over (another model's request waited ``policy.max_wait_seconds`` for its memory) or
when an unload waits for its requests in flight: it finishes what it has and takes nothing new, and its stop begins
once they end. Killed then, its end is that stop: one `evict` (or `unload`) event whose details say it was draining
and how its process ended (`stop_ended: exited`, exit code -9, `cause: killed`), no `crash` beside it; the stream it
was serving ends with the error event in its API's shape; its process is reaped; and the memory goes to whoever
waited for it. The door may see the seat's exit first (its watcher) or the stream's broken connection (the scheduler
then begins the stop as the drain ends): the end is the same either way.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest

from _frontdoor import FrontDoor, engine_pids_of, history, poll
from faultrows import FaultSeen
from test_evicted_seat_faults import ask, resident, swap_door
from test_seat_faults import LONG, ends, gone, kill_left, seat_pid

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
KILLED = "llama-server was killed (SIGKILL, exit code -9: the kernel's OOM killer, or another program)"


@pytest.fixture(scope="module")
def door(zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoor]:
    # another model's request ends a seat's turn after 1 s of waiting
    policy = "max_wait_seconds = 1\nmax_turn_seconds = 600\n"
    with swap_door(zoo, tmp_path_factory.mktemp("drainfaults"), policy) as fd:
        yield fd


class Stream(threading.Thread):
    """A long answer streamed from ``model`` through OpenAI's SDK, read as it comes: its chunks and how it ended."""

    def __init__(self, fd: FrontDoor, model: str) -> None:
        super().__init__(daemon=True)
        self.fd, self.model, self.chunks = fd, model, 0
        self.error: openai.APIError | None = None

    def run(self) -> None:
        client = openai.OpenAI(base_url=self.fd.base_url + "/v1", api_key="none", max_retries=0, timeout=120)
        try:
            for _ in client.chat.completions.create(model=self.model, stream=True, extra_body=LONG,
                                                    messages=[{"role": "user", "content": "hi"}]):
                self.chunks += 1
        except openai.APIError as e:
            self.error = e


def state(fd: FrontDoor, model: str) -> str | None:
    """``model``'s seat state as ``GET /v1/models/residents`` says it (None: not resident)."""
    views = httpx.get(fd.base_url + "/v1/models/residents", timeout=30).json()["data"]
    return next((v["state"] for v in views if v["key"] == model), None)


def kill_while_draining(fd: FrontDoor, model: str, drain: Callable[[], object]) -> tuple[int, Stream, list]:
    """``model`` streams a long answer; ``drain`` (run in a thread: it waits) makes its seat drain; once the door
    says it drains, the seat is SIGKILLed. Its pid, the stream (ended) and what ``drain`` returned."""
    pid = resident(fd, model)
    stream = Stream(fd, model)
    stream.start()
    poll(lambda: stream.chunks >= 3 or not stream.is_alive(), f"{model}'s stream under way")
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(drain()), daemon=True)
    waiter.start()
    try:
        poll(lambda: state(fd, model) == "draining", f"{model}'s seat draining", timeout=120)
        os.kill(pid, signal.SIGKILL)
        stream.join(120)
        waiter.join(180)
    finally:
        kill_left(pid)
    assert got, f"no answer to what drained {model}"
    poll(lambda: gone(pid), f"seat pid {pid} reaped (no zombie)")
    return pid, stream, got


def check_drained_end(fd: FrontDoor, model: str, event: str, pid: int, stream: Stream, seen: FaultSeen) -> dict:
    """The stream cut with its API's error; ``model``'s load ended by one ``event`` that says it was draining and
    how its process ended, and by no crash; every load of it has exactly one end. The event."""
    assert stream.error is not None and seen.client(type(stream.error), "the stream's SDK raised")
    chunks = seen.client(stream.chunks, "stream chunks before it")
    assert 3 <= chunks < LONG["max_tokens"], (stream.chunks, stream.error)
    assert seen.client(stream.error.body["code"], "code") == "engine_lost"
    assert stream.error.body["type"] == "engine_error"
    assert f"{model}: the engine broke off its answer" in stream.error.message
    poll(lambda: ends(fd, model)[-1:] == [event], f"{model}'s {event} in history")
    got = seen.history(ends(fd, model), "the drained model's events")
    assert "crash" not in got and got[-2:] == ["load", event], got
    assert got[::2] == ["load"] * len(got[::2]) and "load" not in got[1::2] and len(got) % 2 == 0, got
    ev = next(e for e in history(fd) if e["model"] == model and e["event"] == event)
    d = ev["details"]
    assert d["pid"] == pid and seen.history(d["draining"], "draining") is True, d
    assert seen.history(d["stop_ended"], "stop_ended") == "exited" and d["stop_exit_code"] == -signal.SIGKILL, d
    assert seen.history(d["cause"], "cause") == "killed" and d["exit_code"] == -signal.SIGKILL and d["oom"] is None, d
    assert KILLED in ev["reason"] and "while it drained" in seen.history(ev["reason"], "reason"), ev["reason"]
    assert isinstance(d["release_verified"], bool) and d["release_note"]
    assert seen.running(pid in engine_pids_of(fd.proc.pid), "the killed seat among the door's children") is False
    return ev


@pytest.mark.fault(
    fault="a seat `SIGKILL`ed while it drains at the end of its turn (another model's request waited "
          "`policy.max_wait_seconds` for its memory) with a long stream in flight",
    kind="real door")
def test_a_seat_killed_while_it_drains_for_another_model_ends_as_that_eviction(door: FrontDoor,
                                                                              fault_seen: FaultSeen) -> None:
    pid, stream, (answer,) = kill_while_draining(door, "med-a", lambda: ask(door, "med-b"))
    assert fault_seen.client(answer.status_code, "the other model's request") == 200, answer.text
    ev = check_drained_end(door, "med-a", "evict", pid, stream, fault_seen)
    assert "evicted for med-b" in ev["reason"], ev["reason"]
    running = fault_seen.running(len(engine_pids_of(door.proc.pid)), "seats running")
    assert running == 1 and engine_pids_of(door.proc.pid) == [seat_pid(door, "med-b")]
    assert fault_seen.history(ends(door, "med-b")[-1], "the other model's last event") == "load"


@pytest.mark.fault(
    fault="a seat `SIGKILL`ed while an unload waits for its requests in flight (a long stream)",
    kind="real door")
def test_a_seat_killed_while_an_unload_waits_for_it_ends_as_that_unload(door: FrontDoor, fault_seen: FaultSeen) -> None:
    def unload() -> httpx.Response:
        return httpx.post(door.base_url + "/v1/models/med-b/unload", timeout=120)

    pid, stream, (answer,) = kill_while_draining(door, "med-b", unload)
    assert fault_seen.client(answer.status_code, "the unload") == 200
    assert fault_seen.client(answer.json()["unloaded"], "unloaded") is True, answer.text
    ev = check_drained_end(door, "med-b", "unload", pid, stream, fault_seen)
    assert "unloaded on request" in ev["reason"], ev["reason"]
    assert fault_seen.running(engine_pids_of(door.proc.pid), "seats running") == [] and state(door, "med-b") is None
