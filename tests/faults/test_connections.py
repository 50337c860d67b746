"""2,000 clients at once against a real front door (``fitevict serve``) started under ``ulimit -n 1024``.

Each client sends a request head with ``Expect: 100-continue`` and waits for the door's first word: ``100
Continue`` (its request was let in, and the door reads its body), a ``503`` (refused, in its API's shape, with a
``Retry-After``), or a connection closed before any byte (refused at accept). So every client's fate is seen as an
event, with no wait on a timer. Then the admitted clients send their bodies and get their answers.

What is asserted: every client got one of those, both refusals and admissions happened, the door never ran out of
descriptors (no "Too many open files", no traceback) and is alive, a request after the burst is served as usual,
and the door's open descriptors come back to their count before the burst.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from _frontdoor import FrontDoor, front_door, poll
from faultrows import FaultSeen

pytestmark = pytest.mark.e2e
CLIENTS = 2000
NOFILE = 1024


@pytest.fixture(scope="module")
def door(zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoor]:
    tmp = tmp_path_factory.mktemp("connections")
    models = tmp / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "m.gguf")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < CLIENTS + 100:
        pytest.skip(f"this process may open {hard} files at most: too few for {CLIENTS} clients")
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, hard))  # the door inherits `ulimit -n 1024`
    try:
        cm = front_door(tmp, "--models-dir", str(models), timeout=180)
        fd = cm.__enter__()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # the clients need more
    try:
        assert f"Max open files            {NOFILE}" in Path(f"/proc/{fd.proc.pid}/limits").read_text()
        yield fd
    finally:
        cm.__exit__(None, None, None)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Crowd:
    """The clients' first words, counted: once every client has one, the admitted ones may send their bodies."""

    def __init__(self) -> None:
        self.heard = 0
        self.all_heard = asyncio.Event()
        self.go = asyncio.Event()

    def heard_one(self) -> None:
        self.heard += 1
        if self.heard == CLIENTS:
            self.all_heard.set()


HI = [{"role": "user", "content": "hi"}]
# what the clients ask, in turn: a model that does not exist (a quick 404 once the body is read), or Ollama's /api/show
OPENAI_OLLAMA = (("/v1/chat/completions", {"model": "nope", "messages": HI}), ("/api/show", {"model": "m"}))
ANTHROPIC_RESPONSES = (("/v1/messages", {"model": "nope", "max_tokens": 4, "messages": HI}),
                       ("/v1/responses", {"model": "nope", "input": "hi"}))


async def client(port: int, i: int, crowd: Crowd, asks: tuple[tuple[str, dict], ...]) -> tuple[str, dict]:
    """One client: (its fate, what it got), asking the ``i``-th of ``asks`` in turn."""
    path, body = asks[i % len(asks)]
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nExpect: 100-continue\r\n\r\n").encode()
    writer = None
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head)
        await writer.drain()
        first = await reader.readuntil(b"\r\n\r\n")
    except (OSError, asyncio.IncompleteReadError) as e:
        crowd.heard_one()
        if writer is not None:
            writer.close()
        return "refused", {"error": repr(e), "path": path}
    crowd.heard_one()
    try:
        if not first.startswith(b"HTTP/1.1 100"):
            return "503", {**answer(first, await reader.read()), "path": path}
        await crowd.go.wait()  # every client has its first word: now the admitted ones send their bodies
        writer.write(data)
        await writer.drain()
        first = await reader.readuntil(b"\r\n\r\n")
        return "served", {**answer(first, await reader.read()), "path": path}
    finally:
        writer.close()


def answer(head: bytes, rest: bytes) -> dict:
    lines = head.decode().split("\r\n")
    headers = dict(x.lower().split(": ", 1) for x in lines[1:] if ": " in x)
    length = int(headers.get("content-length", len(rest)))
    return {"status": int(lines[0].split()[1]), "headers": headers, "body": json.loads(rest[:length] or b"null")}


async def burst(port: int, asks: tuple[tuple[str, dict], ...] = OPENAI_OLLAMA) -> list[tuple[str, dict]]:
    crowd = Crowd()
    tasks = [asyncio.create_task(client(port, i, crowd, asks)) for i in range(CLIENTS)]
    await asyncio.wait_for(crowd.all_heard.wait(), 60)
    crowd.go.set()
    return await asyncio.wait_for(asyncio.gather(*tasks), 60)


FATES = {"served": "let in", "503": "refused", "refused": "closed before a byte"}


def told(fates: list[tuple[str, dict]], with_path: bool) -> dict[str, int]:
    """How many clients got what: let in or refused (with the status), or their connection closed before a byte."""
    return dict(sorted(Counter(" ".join(x for x in (g["path"] if with_path else "", FATES[f], str(g.get("status", "")))
                                        if x) for f, g in fates).items()))


@pytest.mark.fault(
    fault="2,000 clients at once against a door under `ulimit -n 1024` (RLIMIT_NOFILE)",
    kind="real door")
def test_a_burst_beyond_the_descriptor_limit_is_refused_cleanly(door: FrontDoor, fault_seen: FaultSeen) -> None:
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(door.base_url + "/v1/chat/completions", json=ask, timeout=120).status_code == 200
    before = open_fds(door.proc.pid)
    fates = asyncio.run(burst(door.port))
    kinds = Counter(f for f, _ in fates)
    assert fault_seen.lost(CLIENTS - sum(kinds.values()), f"clients of {CLIENTS} with no fate") == 0
    fault_seen.client(told(fates, with_path=False), "the clients, by what they got")
    assert kinds["served"] > 0 and kinds["503"] + kinds["refused"] > 0, kinds
    for fate, got in fates:
        if fate == "served":
            assert got["status"] in (200, 404), got
        elif fate == "503":
            assert got["status"] == 503 and fault_seen.client(got["headers"]["retry-after"], "Retry-After") == "1", got
            body = got["body"]
            assert fault_seen.client(body["error"]["code"], "the OpenAI refusal's code") == "too_many_requests" \
                if isinstance(body["error"], dict) else "retry in" in body["error"], got
    assert fault_seen.running(door.proc.poll(), "the door's exit code (none: running)") is None
    after = httpx.post(door.base_url + "/v1/chat/completions", json=ask, timeout=120).status_code
    assert fault_seen.client(after, "a request after the burst") == 200
    poll(lambda: open_fds(door.proc.pid) <= before, f"the door's descriptors back to {before}")
    fault_seen.running(open_fds(door.proc.pid) <= before, "the door's descriptors back to where they were")
    log = door.log()
    assert fault_seen.history(log.count("Too many open files"), "'Too many open files' in the log") == 0
    assert fault_seen.history(log.count("Traceback"), "tracebacks in the log") == 0


@pytest.mark.fault(
    fault="2,000 clients at once on Anthropic's Messages API and OpenAI's Responses API against a door under "
          "`ulimit -n 1024`",
    kind="real door")
def test_a_burst_on_anthropics_and_the_responses_api_is_refused_in_each_apis_shape(door: FrontDoor,
                                                                                  fault_seen: FaultSeen) -> None:
    before = open_fds(door.proc.pid)
    fates = asyncio.run(burst(door.port, ANTHROPIC_RESPONSES))
    kinds = Counter((f, got.get("path")) for f, got in fates)
    assert fault_seen.lost(CLIENTS - sum(kinds.values()), f"clients of {CLIENTS} with no fate") == 0
    fault_seen.client(told(fates, with_path=True), "the clients, by path and what they got")
    assert kinds[("served", "/v1/messages")] and kinds[("served", "/v1/responses")], kinds
    assert kinds[("503", "/v1/messages")] + kinds[("503", "/v1/responses")], kinds
    for fate, got in fates:
        if fate == "refused":
            continue
        body, status = got["body"], got["status"]
        if got["path"] == "/v1/messages":
            kind = "overloaded_error" if fate == "503" else "not_found_error"
            assert status == (529 if fate == "503" else 404) and body["type"] == "error", got
            assert fault_seen.client(body["error"]["type"], "/v1/messages error.type") == kind
            assert body["error"]["message"], got
        else:
            assert status == (503 if fate == "503" else 404), got
            code = fault_seen.client(body["error"]["code"], "/v1/responses error.code")
            assert code == ("too_many_requests" if fate == "503" else "model_not_found"), got
        assert fate == "served" or fault_seen.client(got["headers"]["retry-after"], "Retry-After") == "1", got
    assert fault_seen.running(door.proc.poll(), "the door's exit code (none: running)") is None
    poll(lambda: open_fds(door.proc.pid) <= before, f"the door's descriptors back to {before}")
    fault_seen.running(open_fds(door.proc.pid) <= before, "the door's descriptors back to where they were")
    assert fault_seen.history(door.log().count("Too many open files"), "'Too many open files' in the log") == 0
    assert fault_seen.history(door.log().count("Traceback"), "tracebacks in the log") == 0
