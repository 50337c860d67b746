"""A seat that dies or freezes while it serves, against one real front door (``fitevict serve``) and real seats.

For each fault: what the client receives (through the official SDKs: an error in its API's shape, never a stream
cut without a word), what history records (every load has an end, and the end says how), what remains running (no
orphan engine, no zombie), and that the next request loads the model again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest

from _frontdoor import FrontDoor, engine_pids_of, front_door, history, poll
from fitevict.seat.frozen import progress

pytestmark = pytest.mark.e2e
LONG = {"max_tokens": 4000, "ignore_eos": True}  # a stream that runs until it is cut
STALL_S = 2.0  # engine.stall_seconds: a seat stopped by a signal this long is killed


@pytest.fixture(scope="module")
def door(zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoor]:
    tmp = tmp_path_factory.mktemp("seatfaults")
    models = tmp / "models"
    models.mkdir()
    for name in ("killed", "frozen", "claude-killed", "ollama-killed", "whole-killed", "slow-client", "told-sigterm",
                 "told-sigint"):
        shutil.copyfile(zoo["llama-gqa"].path, models / f"{name}.gguf")
    cfg = tmp / "fitevict.toml"
    cfg.write_text(f"[policy]\nprompt_cache = false\n[engine]\nstall_seconds = {STALL_S}\n")
    with front_door(tmp, "--config", str(cfg), "--models-dir", str(models)) as fd:
        yield fd


def seat_pid(fd: FrontDoor, model: str) -> int:
    """The pid of the running seat of ``model`` (a child of the front door, its argv naming the file)."""
    pids = [p for p in engine_pids_of(fd.proc.pid)
            if f"/{model}.gguf" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
    assert len(pids) == 1, pids
    return pids[0]


def gone(pid: int) -> bool:
    """No process and no zombie: the front door reaped it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "X"
    except FileNotFoundError:
        return True


def kill_left(pid: int | None) -> None:
    """SIGKILL a seat a failed or cut-short test left running (nothing if it is gone)."""
    if pid is not None and not gone(pid):
        os.kill(pid, signal.SIGKILL)


def ends(fd: FrontDoor, model: str) -> list[str]:
    """The model's history oldest first: loads and what ended each."""
    return [e["event"] for e in reversed(history(fd)) if e["model"] == model
            and e["event"] in ("load", "crash", "unload", "evict", "idle-unload", "fail", "orphan")]


def check_crashed(fd: FrontDoor, model: str, pid: int) -> dict:
    """``model``'s seat ``pid`` is reaped and its load ended by a ``crash`` (returned); nothing else runs it."""
    poll(lambda: gone(pid), f"seat pid {pid} reaped")
    poll(lambda: ends(fd, model)[-1:] == ["crash"], "the crash in history")
    assert ends(fd, model) == ["load", "crash"]
    crash = next(e for e in history(fd) if e["model"] == model and e["event"] == "crash")
    assert crash["details"]["exit_code"] == -signal.SIGKILL and crash["details"]["pid"] == pid
    assert pid not in engine_pids_of(fd.proc.pid)
    return crash


def check_reloads(fd: FrontDoor, model: str, dead: int) -> None:
    """The next request for ``model`` loads it again, on a new process."""
    r = httpx.post(fd.base_url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert seat_pid(fd, model) != dead
    assert ends(fd, model)[-1] == "load"


def openai_stream_cut(fd: FrontDoor, model: str, sig: signal.Signals) -> tuple[openai.APIError, int]:
    """A long stream through the openai SDK whose seat gets ``sig`` after 3 chunks: the SDK's error and the seat's
    pid. A seat left stopped by a failed test is continued."""
    client = openai.OpenAI(base_url=fd.base_url + "/v1", api_key="none", max_retries=0, timeout=60)
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                            stream=True, extra_body=LONG)
    got, pid = 0, None
    try:
        with pytest.raises(openai.APIError) as e:
            for _ in stream:
                got += 1
                if got == 3:
                    pid = seat_pid(fd, model)
                    os.kill(pid, sig)
    finally:
        if pid is not None and not gone(pid):
            os.kill(pid, signal.SIGCONT)
    assert pid is not None and 3 <= got < 4000
    return e.value, pid


@pytest.mark.fault(
    fault="a seat `SIGKILL`ed mid-stream (chat, OpenAI's SDK)",
    client='the chunks before the kill, then an `APIError` from the SDK: a last `data:` event with `{"error": '
           '{"type": "engine_error", "code": "engine_lost", "message": "<model>: the engine broke off its answer: '
           '..."}}`, and the stream ended cleanly',
    history="the seat's `load`, then a `crash` with exit code -9 and its pid, its reason \"llama-server was killed "
            "(SIGKILL, exit code -9: the kernel's OOM killer, or another program)\"",
    running="nothing of that seat: its process reaped (no zombie), no other engine for the model; the next request "
            "loads it again (a new `load`, a new pid)",
    lost="the rest of that one answer")
def test_seat_sigkill_mid_stream_openai(door: FrontDoor) -> None:
    error, pid = openai_stream_cut(door, "killed", signal.SIGKILL)
    assert "killed: the engine broke off its answer" in error.message
    assert error.body["code"] == "engine_lost" and error.body["type"] == "engine_error"
    assert "llama-server was killed (SIGKILL, exit code -9: the kernel's OOM killer, or another program)" in \
        check_crashed(door, "killed", pid)["reason"]
    check_reloads(door, "killed", pid)


@pytest.mark.fault(
    fault="a seat `SIGKILL`ed mid-stream through Anthropic's Messages API (its SDK, streaming)",
    client='an `APIStatusError` from the SDK: an `event: error` with `{"type": "error", "error": {"type": '
           '"api_error", ...}}`',
    history="`load`, then a `crash` with exit code -9 and its pid",
    running="the seat reaped, no other engine for the model; the next request loads it again",
    lost="the rest of that one answer")
def test_seat_sigkill_mid_stream_anthropic(door: FrontDoor) -> None:
    client = anthropic.Anthropic(base_url=door.base_url, api_key="none", max_retries=0, timeout=60)
    got, pid = 0, None
    with pytest.raises(anthropic.APIStatusError) as e:
        with client.messages.stream(model="claude-killed", max_tokens=4000,
                                    messages=[{"role": "user", "content": "hi"}],
                                    extra_body={"ignore_eos": True}) as stream:
            for _ in stream.text_stream:
                got += 1
                if got == 3:
                    pid = seat_pid(door, "claude-killed")
                    os.kill(pid, signal.SIGKILL)
    assert pid is not None
    assert "the engine broke off its answer" in str(e.value)
    assert e.value.body["error"]["type"] == "api_error"
    check_crashed(door, "claude-killed", pid)
    check_reloads(door, "claude-killed", pid)


@pytest.mark.fault(
    fault="a seat `SIGSTOP`ped mid-stream (frozen, not dead)",
    client="at the stuck-seat watch's next look (not after `engine.stall_seconds`), the same `engine_lost` error "
           "through the OpenAI SDK, whose message says the seat was stopped by a signal with the request in flight",
    history="`load`, then a `crash` whose reason says the seat was stopped by a signal (state T) with 1 request in "
            "flight, which it cannot answer, and was killed",
    running="the frozen seat killed and reaped; the next request loads it again",
    lost="the rest of that one answer")
def test_seat_sigstop_mid_stream_is_detected_and_replaced(door: FrontDoor) -> None:
    error, pid = openai_stream_cut(door, "frozen", signal.SIGSTOP)
    # the door told the client (its error, not the SDK's timeout), and why: the seat's own state, seen at once
    assert error.body["code"] == "engine_lost" and "frozen: the engine broke off its answer" in error.message
    assert "stopped by a signal (state T) with 1 request(s) in flight on it" in error.message, error.message
    crash = check_crashed(door, "frozen", pid)
    assert "stopped by a signal (state T) with 1 request(s) in flight" in crash["reason"], crash["reason"]
    assert "stall_seconds" not in crash["reason"]  # killed at once, not after the stall period
    check_reloads(door, "frozen", pid)


@pytest.mark.fault(
    fault="a seat sent `SIGTERM` or `SIGINT` mid-stream by another program (llama-server's own shutdown: it ends "
          "its task loop, then exits 0 or hangs with the stream in flight; or its handler hangs on the task "
          "queue's lock before it logs)",
    client="the chunks before the signal, then the `engine_lost` error event (`openai.APIError`): at once when it "
           "exits, after `engine.stall_seconds` (2 s in the test) when it hangs",
    history="`load`, then a `crash` with `cause: told-to-stop` whose reason says the seat \"was told to stop by "
            "another program, not by fitevict (its log: '... cleaning up before exit...')\", or, when its handler "
            "hung before it logged, \"(its main thread was inside its own SIGTERM handler ...)\", then how it ended "
            "(exit code 0, or killed by the stuck-seat watch); before, an exit 0 was \"exited unexpectedly\" and "
            "a hang was called a frozen seat",
    running="nothing of that seat (reaped); the next request loads it again",
    lost="the rest of that one answer")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_seat_told_to_stop_mid_stream_says_so(door: FrontDoor, sig: signal.Signals) -> None:
    model = f"told-{sig.name.lower()}"
    error, pid = openai_stream_cut(door, model, sig)
    assert error.body["code"] == "engine_lost", error.body  # the door's error, not the SDK's timeout
    poll(lambda: gone(pid), f"seat pid {pid} reaped")
    poll(lambda: ends(door, model)[-1:] == ["crash"], "the crash in history")
    assert ends(door, model) == ["load", "crash"]
    crash = next(e for e in history(door) if e["model"] == model and e["event"] == "crash")
    d = crash["details"]
    assert d["cause"] == "told-to-stop" and d["pid"] == pid and d["exit_code"] in (0, -signal.SIGKILL), d
    assert "was told to stop by another program" in crash["reason"], crash["reason"]
    # how it was seen: its log's shutdown line, or (when the signal's handler hung before it logged) the handler
    assert "cleaning up before exit" in crash["reason"] or f"inside its own {sig.name} handler" in crash["reason"]
    assert pid not in engine_pids_of(door.proc.pid)
    check_reloads(door, model, pid)


@pytest.mark.fault(
    fault="a seat `SIGKILL`ed mid-stream on Ollama's `/api/chat` (the `ollama` client, streaming)",
    client='a `ResponseError` from the client: a last NDJSON line `{"error": "the engine broke off mid-stream: '
           '..."}`; no traceback in the server log',
    history="`load`, then a `crash` with exit code -9 and its pid",
    running="the seat reaped, no other engine for the model; the next request loads it again",
    lost="the rest of that one answer")
def test_seat_sigkill_mid_stream_ollama(door: FrontDoor) -> None:
    client = ollama.Client(host=door.base_url, timeout=60)
    got, pid = 0, None
    with pytest.raises(ollama.ResponseError) as e:
        for _ in client.chat(model="ollama-killed", messages=[{"role": "user", "content": "hi"}], stream=True,
                             options={"num_predict": 4000, "ignore_eos": True}):
            got += 1
            if got == 3:
                pid = seat_pid(door, "ollama-killed")
                os.kill(pid, signal.SIGKILL)
    assert pid is not None
    assert "the engine broke off mid-stream" in e.value.error
    check_crashed(door, "ollama-killed", pid)
    check_reloads(door, "ollama-killed", pid)
    assert "Traceback" not in door.log()


@pytest.mark.fault(
    fault="a seat `SIGKILL`ed while it generates an answer that is not streamed",
    client="a `502` `engine_error` naming the model (`openai.APIStatusError`)",
    history="`load`, then a `crash` with exit code -9 and its pid",
    running="the seat reaped, no other engine for the model; the next request loads it again",
    lost="that one answer")
def test_seat_sigkill_during_a_whole_answer(door: FrontDoor) -> None:
    """A request not streamed: the seat dies while it generates, before a byte of the answer."""
    client = openai.OpenAI(base_url=door.base_url + "/v1", api_key="none", max_retries=0, timeout=60)
    pid: list[int] = []

    def kill_when_generating() -> bool:
        rows = httpx.get(door.base_url + "/v1/models/residents", timeout=30).json()["data"]
        if any(r["key"] == "whole-killed" and r["in_flight"] == 1 for r in rows):
            pid.append(seat_pid(door, "whole-killed"))
            os.kill(pid[0], signal.SIGKILL)
            return True
        return False

    t = threading.Thread(target=lambda: poll(kill_when_generating, "the request in flight"))
    t.start()
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="whole-killed", messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"max_tokens": 100000, "ignore_eos": True})
    t.join(60)
    assert e.value.status_code == 502 and e.value.body["type"] == "engine_error"
    assert "whole-killed" in e.value.message
    check_crashed(door, "whole-killed", pid[0])
    check_reloads(door, "whole-killed", pid[0])


def send_queue(port: int) -> int:
    """Bytes the seat listening on ``port`` has written to its sockets that the other side has not taken yet (its
    connections' ``tx_queue`` in /proc/net/tcp)."""
    total = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if int(f[1].split(":")[1], 16) == port:
            total += int(f[4].split(":")[0], 16)
    return total


def unchunked(body: bytes) -> bytes:
    """An HTTP/1.1 chunked body, joined."""
    out, at = [], 0
    while (size := int(body[at:body.index(b"\r\n", at)], 16)) > 0:
        start = body.index(b"\r\n", at) + 2
        out.append(body[start:start + size])
        at = start + size + 2
    return b"".join(out)


class Idle:
    """A seat blocked on its socket: bytes wait in its send queue, and between two looks none of its threads ran and
    its CPU time did not move (its generation over, its writer asleep on the full socket)."""

    def __init__(self, pid: int, port: int) -> None:
        self.pid, self.port, self.ticks = pid, port, None

    def __call__(self) -> bool:
        seen = progress(self.pid)
        assert seen is not None, f"seat pid {self.pid} ended while its client read slowly"
        ticks, busy = seen
        still = ticks == self.ticks and not busy
        self.ticks = ticks
        if still:
            return send_queue(self.port) > 0
        time.sleep(0.2)  # a look at /proc: the next one compares against this one
        return False


@pytest.mark.fault(
    fault="a streaming client that reads slowly (a 4 KiB receive buffer, then nothing for longer than "
          "`engine.stall_seconds`, twice) until the seat blocks on its full socket, alive and idle",
    client="its whole answer, every token, ending `[DONE]`: the stuck-seat watch counts only the door's waits for the "
           "seat's next byte, and here the door waits on its client (a watch that counted the time since the seat's "
           "last byte killed the idle seat in the first pause)",
    history="`load` alone: no `crash`",
    running="the same seat, same process, untouched by the stuck-seat watch",
    lost="nothing")
@pytest.mark.timeout(1200)
def test_a_slow_client_does_not_get_its_seat_killed(door: FrontDoor) -> None:
    # with 200 alternatives each, about 14 KiB per chunk: ~48 MiB, more than the door and the sockets hold (the door's
    # socket from the seat alone may grow to net.ipv4.tcp_rmem's largest, 32 MiB here: 500 tokens, 7 MiB, all fitted
    # in it on a fast CPU, and the seat finished without ever blocking)
    tokens = 3500
    body = json.dumps({"model": "slow-client", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                       "max_tokens": tokens, "ignore_eos": True, "logprobs": True, "top_logprobs": 200}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(120)
    sock.connect(("127.0.0.1", door.port))
    try:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        got = [sock.recv(4096)]
        assert got[0].startswith(b"HTTP/1.1 200"), got[0][:300]
        pid = seat_pid(door, "slow-client")
        port = int(re.search(rb"--port\x00(\d+)", Path(f"/proc/{pid}/cmdline").read_bytes()).group(1))
        for _ in range(2):  # the client reads nothing while the seat sits blocked, longer than the stall period
            # it blocks within seconds on a quiet machine, minutes on 2 cores shared with other work
            poll(Idle(pid, port), "the seat blocked on its full socket", timeout=420)
            time.sleep(2 * STALL_S)  # the fault: a client that does not read
            assert Path(f"/proc/{pid}").exists() and ends(door, "slow-client") == ["load"]
            got.append(sock.recv(4096))
        while not got[-1].endswith(b"\r\n0\r\n\r\n") and (chunk := sock.recv(1 << 16)):
            got.append(chunk)
    finally:
        sock.close()
    events = unchunked(b"".join(got).split(b"\r\n\r\n", 1)[1]).split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
    assert chunks[-1]["timings"]["predicted_n"] == tokens and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(len(c["choices"][0]["delta"].get("content") or "") for c in chunks) > 0
    assert seat_pid(door, "slow-client") == pid and ends(door, "slow-client") == ["load"]
    assert "made no progress" not in door.log()
