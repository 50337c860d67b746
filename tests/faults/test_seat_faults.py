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
from faultrows import FaultSeen
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


def check_crashed(fd: FrontDoor, model: str, pid: int, seen: FaultSeen) -> dict:
    """``model``'s seat ``pid`` is reaped and its load ended by a ``crash`` (returned); nothing else runs it."""
    poll(lambda: gone(pid), f"seat pid {pid} reaped")
    poll(lambda: ends(fd, model)[-1:] == ["crash"], "the crash in history")
    assert seen.history(ends(fd, model), "the model's events") == ["load", "crash"]
    crash = next(e for e in history(fd) if e["model"] == model and e["event"] == "crash")
    assert seen.history(crash["details"]["exit_code"], "`crash` exit_code") == -signal.SIGKILL
    assert crash["details"]["pid"] == pid
    assert seen.running(pid in engine_pids_of(fd.proc.pid), "the seat among the door's children") is False
    assert seen.running(gone(pid), "the seat's process reaped") is True
    return crash


def check_reloads(fd: FrontDoor, model: str, dead: int, seen: FaultSeen) -> None:
    """The next request for ``model`` loads it again, on a new process."""
    r = httpx.post(fd.base_url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert seen.client(r.status_code, "the next request") == 200, r.text
    assert seen.running(seat_pid(fd, model) != dead, "the next request's seat a new process") is True
    assert seen.history(ends(fd, model)[-1], "then") == "load"


def openai_stream_cut(fd: FrontDoor, model: str, sig: signal.Signals, seen: FaultSeen) -> tuple[openai.APIError, int]:
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
    assert pid is not None and 3 <= seen.client(got, "stream chunks before the error") < 4000
    seen.client(type(e.value), "the SDK raised")
    return e.value, pid


@pytest.mark.fault(
    fault="a seat `SIGKILL`ed mid-stream (chat, OpenAI's SDK)",
    kind="real door")
def test_seat_sigkill_mid_stream_openai(door: FrontDoor, fault_seen: FaultSeen) -> None:
    error, pid = openai_stream_cut(door, "killed", signal.SIGKILL, fault_seen)
    assert "killed: the engine broke off its answer" in fault_seen.client(error.message, "its message")
    assert fault_seen.client(error.body["code"], "code") == "engine_lost" and error.body["type"] == "engine_error"
    reason = fault_seen.history(check_crashed(door, "killed", pid, fault_seen)["reason"], "`crash` reason")
    assert "llama-server was killed (SIGKILL, exit code -9: the kernel's OOM killer, or another program)" in reason
    check_reloads(door, "killed", pid, fault_seen)


@pytest.mark.fault(
    fault="a seat `SIGKILL`ed mid-stream through Anthropic's Messages API (its SDK, streaming)",
    kind="real door")
def test_seat_sigkill_mid_stream_anthropic(door: FrontDoor, fault_seen: FaultSeen) -> None:
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
    assert pid is not None and fault_seen.client(got, "stream chunks before the error") >= 3
    assert "the engine broke off its answer" in str(fault_seen.client(e.value, "the SDK raised"))
    assert fault_seen.client(e.value.body["error"]["type"], "error type") == "api_error"
    check_crashed(door, "claude-killed", pid, fault_seen)
    check_reloads(door, "claude-killed", pid, fault_seen)


@pytest.mark.fault(
    fault="a seat `SIGSTOP`ped mid-stream (frozen, not dead)",
    kind="real door")
def test_seat_sigstop_mid_stream_is_detected_and_replaced(door: FrontDoor, fault_seen: FaultSeen) -> None:
    error, pid = openai_stream_cut(door, "frozen", signal.SIGSTOP, fault_seen)
    # the door told the client (its error, not the SDK's timeout), and why: the seat's own state, seen at once
    assert fault_seen.client(error.body["code"], "code") == "engine_lost"
    message = fault_seen.client(error.message, "its message")
    assert "frozen: the engine broke off its answer" in message
    assert "stopped by a signal (state T) with 1 request(s) in flight on it" in message, message
    crash = check_crashed(door, "frozen", pid, fault_seen)
    reason = fault_seen.history(crash["reason"], "`crash` reason")
    assert "stopped by a signal (state T) with 1 request(s) in flight" in reason, reason
    assert "stall_seconds" not in reason  # killed at once, not after the stall period
    check_reloads(door, "frozen", pid, fault_seen)


@pytest.mark.fault(
    fault="a seat sent `SIGTERM` or `SIGINT` mid-stream by another program (llama-server's own shutdown: it ends "
          "its task loop, then exits 0 or hangs with the stream in flight; or its handler hangs on the task "
          "queue's lock before it logs)",
    kind="real door")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_seat_told_to_stop_mid_stream_says_so(door: FrontDoor, sig: signal.Signals, fault_seen: FaultSeen) -> None:
    model = f"told-{sig.name.lower()}"
    error, pid = openai_stream_cut(door, model, sig, fault_seen)
    # the door's error, not the SDK's timeout
    assert fault_seen.client(error.body["code"], "code") == "engine_lost", error.body
    poll(lambda: gone(pid), f"seat pid {pid} reaped")
    poll(lambda: ends(door, model)[-1:] == ["crash"], "the crash in history")
    assert fault_seen.history(ends(door, model), "the model's events") == ["load", "crash"]
    crash = next(e for e in history(door) if e["model"] == model and e["event"] == "crash")
    d = crash["details"]
    assert fault_seen.history(d["cause"], "`crash` cause") == "told-to-stop" and d["pid"] == pid
    assert fault_seen.history(d["exit_code"], "exit_code") in (0, -signal.SIGKILL), d
    assert "was told to stop by another program" in fault_seen.history(crash["reason"], "reason"), crash["reason"]
    # how it was seen: its log's shutdown line, or (when the signal's handler hung before it logged) the handler
    assert "cleaning up before exit" in crash["reason"] or f"inside its own {sig.name} handler" in crash["reason"]
    assert fault_seen.running(pid in engine_pids_of(door.proc.pid), "the seat among the door's children") is False
    check_reloads(door, model, pid, fault_seen)


@pytest.mark.fault(
    fault="a seat `SIGKILL`ed mid-stream on Ollama's `/api/chat` (the `ollama` client, streaming)",
    kind="real door")
def test_seat_sigkill_mid_stream_ollama(door: FrontDoor, fault_seen: FaultSeen) -> None:
    client = ollama.Client(host=door.base_url, timeout=60)
    got, pid = 0, None
    with pytest.raises(ollama.ResponseError) as e:
        for _ in client.chat(model="ollama-killed", messages=[{"role": "user", "content": "hi"}], stream=True,
                             options={"num_predict": 4000, "ignore_eos": True}):
            got += 1
            if got == 3:
                pid = seat_pid(door, "ollama-killed")
                os.kill(pid, signal.SIGKILL)
    assert pid is not None and fault_seen.client(got, "stream chunks before the error") >= 3
    assert "the engine broke off mid-stream" in fault_seen.client(e.value, "the client raised").error
    check_crashed(door, "ollama-killed", pid, fault_seen)
    check_reloads(door, "ollama-killed", pid, fault_seen)
    assert fault_seen.history(door.log().count("Traceback"), "tracebacks in the server log") == 0


@pytest.mark.fault(
    fault="a seat `SIGKILL`ed while it generates an answer that is not streamed",
    kind="real door")
def test_seat_sigkill_during_a_whole_answer(door: FrontDoor, fault_seen: FaultSeen) -> None:
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
    assert fault_seen.client(e.value.status_code, "status") == 502
    assert fault_seen.client(e.value.body["type"], "type") == "engine_error"
    assert "whole-killed" in fault_seen.client(e.value.message, "its message")
    check_crashed(door, "whole-killed", pid[0], fault_seen)
    check_reloads(door, "whole-killed", pid[0], fault_seen)


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
    kind="real door")
@pytest.mark.timeout(1200)
def test_a_slow_client_does_not_get_its_seat_killed(door: FrontDoor, fault_seen: FaultSeen) -> None:
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
        status_line = fault_seen.client(got[0].split(b"\r\n", 1)[0].decode(), "status line")
        assert status_line.startswith("HTTP/1.1 200"), got[0][:300]
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
    assert fault_seen.client(events[-2].decode(), "the last event") == "data: [DONE]" and events[-1] == b""
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
    assert fault_seen.client(chunks[-1]["timings"]["predicted_n"], "tokens") == tokens
    assert fault_seen.client(chunks[-1]["choices"][0]["finish_reason"], "finish_reason") == "length"
    assert fault_seen.lost(tokens - chunks[-1]["timings"]["predicted_n"], "tokens lost") == 0
    assert sum(len(c["choices"][0]["delta"].get("content") or "") for c in chunks) > 0
    assert fault_seen.running(seat_pid(door, "slow-client") == pid, "the same seat, still running") is True
    assert fault_seen.history(ends(door, "slow-client"), "the model's events") == ["load"]
    assert fault_seen.history(door.log().count("made no progress"), "'made no progress' in the log") == 0
