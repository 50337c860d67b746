"""A door at its most requests in flight, met by each API's own client library: the Anthropic SDK, the OpenAI SDK
and Ollama's client read the refusal as their own overload error, and the two SDKs that retry get through on their
own once the door has room again.

The door holds at most 2 connections and so 1 request in progress (``server.max_connections = 2``). A raw client
holds that one: its request head is sent with ``Expect: 100-continue``, and the door's ``100 Continue`` says it was
let in (it waits for the body). Its body, sent when the test says, asks for a model that does not exist: a quick
``404`` that frees the slot. The SDKs' retries are released by the refusal itself (a response hook of the SDK's HTTP client), never by
a timer.
"""

from __future__ import annotations

import socket
import shutil
from collections.abc import Iterator

import anthropic
import httpx
import httpx2
import ollama
import openai
import pytest

from _frontdoor import FrontDoor, front_door
from faultrows import FaultSeen

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def door(zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoor]:
    tmp = tmp_path_factory.mktemp("overload")
    models = tmp / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "m.gguf")
    with front_door(tmp, "--models-dir", str(models), env={"FITEVICT_MAX_CONNECTIONS": "2"}, timeout=180) as fd:
        assert httpx.post(fd.base_url + "/v1/chat/completions", timeout=120, json={  # loaded once, before
            "model": "m", "messages": HI, "max_tokens": 1}).status_code == 200
        yield fd


class Held:
    """One request let in and left waiting for its body: the door's one request slot taken."""

    def __init__(self, port: int) -> None:
        self.body = b'{"model": "nope", "messages": [{"role": "user", "content": "hi"}]}'
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                           f"application/json\r\nContent-Length: {len(self.body)}\r\nExpect: 100-continue\r\n\r\n"
                           ).encode())
        first = self.sock.recv(4096)
        assert first.startswith(b"HTTP/1.1 100"), first  # let in: it counts as a request in progress
        self.released = False

    def release(self) -> int:
        """Send the body, read the door's answer (a 404 for a model that does not exist) and close: the slot free."""
        if self.released:
            return 0
        self.released = True
        self.sock.sendall(self.body)
        head = self.sock.recv(4096)
        self.sock.close()
        return int(head.split()[1])


def refusals(seen: list[int], held: Held | None = None):  # type: ignore[no-untyped-def]
    """A response hook of the SDKs' HTTP client (httpx2): records each status the SDK got, and frees the slot at the first refusal."""
    def hook(response: httpx2.Response) -> None:
        seen.append(response.status_code)
        if held is not None and response.status_code in (503, 529):
            assert held.release() in (0, 404)
    return hook


@pytest.mark.fault(
    fault="a door at its most requests in flight (`server.max_connections = 2`: 1 request), met by each API's own "
          "client library",
    kind="real door")
def test_each_apis_sdk_reads_the_refusal_as_its_own_overload_and_retries(door: FrontDoor,
                                                                        fault_seen: FaultSeen) -> None:
    held = Held(door.port)
    try:
        claude = anthropic.Anthropic(base_url=door.base_url, api_key="k", max_retries=0, timeout=60)
        with pytest.raises(anthropic.OverloadedError) as over:
            claude.messages.create(model="m", max_tokens=1, messages=HI)
        fault_seen.client(type(over.value), "Anthropic's SDK raised")
        assert fault_seen.client(over.value.status_code, "status") == 529
        assert fault_seen.client(over.value.response.headers["retry-after"], "Retry-After") == "1"
        assert fault_seen.client(over.value.body["error"]["type"], "error.type") == "overloaded_error"

        gpt = openai.OpenAI(base_url=door.base_url + "/v1", api_key="k", max_retries=0, timeout=60)
        with pytest.raises(openai.InternalServerError) as busy:
            gpt.responses.create(model="m", input="hi", max_output_tokens=1)
        fault_seen.client(type(busy.value), "OpenAI's SDK raised")
        assert fault_seen.client(busy.value.status_code, "status") == 503
        assert fault_seen.client(busy.value.code, "code") == "too_many_requests"
        assert busy.value.response.headers["retry-after"] == "1"

        with pytest.raises(ollama.ResponseError) as refused:
            ollama.Client(host=door.base_url, timeout=60).chat(model="m", messages=HI)
        fault_seen.client(type(refused.value), "Ollama's client raised")
        assert fault_seen.client(refused.value.status_code, "status") == 503
        assert "retry in 1 s" in fault_seen.client(refused.value.error, "error")

        seen: list[int] = []  # the SDK's own retry, released by its first refusal
        retrying = anthropic.Anthropic(base_url=door.base_url, api_key="k", max_retries=4, http_client=httpx2.Client(
            timeout=60, event_hooks={"response": [refusals(seen, held)]}))
        answer = retrying.messages.create(model="m", max_tokens=1, messages=HI)
        assert fault_seen.client(seen, "Anthropic's SDK retrying: the statuses it got")[0] == 529
        assert seen[-1] == 200 and answer.type == "message", seen
        retrying.close()  # its kept-alive connection would hold the door's second connection
    finally:
        held.release()

    held = Held(door.port)
    try:
        seen = []
        retrying_gpt = openai.OpenAI(base_url=door.base_url + "/v1", api_key="k", max_retries=4,
                                     http_client=httpx2.Client(timeout=60, event_hooks={
                                         "response": [refusals(seen, held)]}))
        answer = retrying_gpt.responses.create(model="m", input="hi", max_output_tokens=1)
        retrying_gpt.close()
        assert fault_seen.client(seen, "OpenAI's SDK retrying: the statuses it got")[0] == 503
        assert seen[-1] == 200 and answer.status == "completed", seen
    finally:
        held.release()
    clients = httpx.get(door.base_url + "/health", timeout=30).json()["clients"]
    assert clients["max_connections"] == 2 and clients["max_requests"] == 1
    assert fault_seen.history(clients["refused"]["requests"], "`/health` clients.refused.requests") >= 5
    assert "server.max_connections = 2" in clients["limits"]
    assert fault_seen.history(door.log().count("Traceback"), "tracebacks in the log") == 0
