"""The fast path without engines: its rejections in OpenAI's envelope with their log lines (real app), and the
relay against a stand-in engine on loopback that speaks HTTP/1.1 the way llama-server does (chunked SSE,
a kept-alive connection it drops after a stream)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import pytest

from fitevict.server.fastpath import engine_timings, relay, total_tokens
from fitevict.engines.upstream import Upstream, UpstreamError, health_status


@pytest.fixture()
def request_lines(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="fitevict.request")
    return lambda: [json.loads(r.getMessage()) for r in caplog.records if r.name == "fitevict.request"]


CHAT = "/v1/chat/completions"


@pytest.mark.parametrize("headers,status,etype,code", [
    ({}, 401, "authentication_error", "invalid_api_key"),
    ({"Authorization": "Bearer nope"}, 401, "authentication_error", "invalid_api_key"),
    ({"x-api-key": "u1"}, 404, "not_found_error", "model_not_found"),  # the key is good: the model is not
    ({"Authorization": "Bearer a1"}, 404, "not_found_error", "model_not_found"),  # admin keys serve too
], ids=["no key", "wrong key", "x-api-key", "admin key"])
def test_keys_gate_the_fast_path(make_client, request_lines, headers, status, etype, code) -> None:
    c = make_client(**{"server.api_keys": ["u1"], "server.admin_keys": ["a1"]})
    gap = 0.05

    def slow_body():  # the body's second half comes a known time after the first: a floor under the request's time
        yield b'{"model": "nope", '
        time.sleep(gap)
        yield b'"messages": []}'

    t0 = time.perf_counter()
    r = c.post(CHAT, content=slow_body(), headers={"x-request-id": "rid-1", "content-type": "application/json",
                                                   **headers})
    took = time.perf_counter() - t0
    assert r.status_code == status and r.json()["error"]["type"] == etype and r.json()["error"]["code"] == code
    line = request_lines()[-1]
    assert line["request_id"] == "rid-1" and line["status"] == status and line["error"] == code
    # the line's own time is the request's: inside the call the client saw, and at least the body's wait where the
    # key let the body be read
    floor = gap if status == 404 else 0.0
    assert line["endpoint"] == "chat" and line["latency_s"] is None and floor <= line["total_s"] < took, (line, took)


def test_bodies_are_checked_before_anything_changes(make_client, request_lines) -> None:
    c = make_client(**{"server.max_body_bytes": 1000})
    big = c.post(CHAT, content=b"x" * 2000, headers={"content-type": "application/json"})
    assert big.status_code == 413 and "2000 bytes; the limit is 1000" in big.json()["error"]["message"]

    def chunked():  # no Content-Length: the limit applies to the bytes as they arrive
        yield b'{"model": "llama-gqa", "messages": ["'
        yield b"x" * 1500
        yield b'"]}'

    streamed = c.post(CHAT, content=chunked(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413 and "exceeds 1000 bytes" in streamed.json()["error"]["message"]
    bad = c.post(CHAT, content=b"{nope")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    arr = c.post("/v1/completions", json=[1, 2])
    assert arr.status_code == 400 and arr.json()["error"]["code"] == "invalid_body"
    contract = c.post(CHAT, json={"model": "llama-gqa", "messages": [], "fitevict": {"ctxx": 1}})
    assert contract.status_code == 400 and contract.json()["error"]["param"]
    assert [line["status"] for line in request_lines()] == [413, 413, 400, 400, 400]
    assert c.get("/v1/models/residents").json()["data"] == []  # nothing was loaded


def test_inference_routes_answer_only_post(make_client) -> None:
    r = make_client().get("/v1/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST" and r.json()["error"]["message"]


def test_engine_timings_are_read_from_the_tail() -> None:
    end = (b'{"choices":[],"usage":{"total_tokens":19},"timings":{"cache_n":1,"prompt_n":16,"prompt_ms":12.5,'
           b'"prompt_per_second":1280.0,"predicted_n":3,"predicted_ms":30.25,"predicted_per_second":99.17}}')
    assert engine_timings(end) == {"prompt_n": 16, "prompt_ms": 12.5, "prompt_per_second": 1280.0, "predicted_n": 3,
                                   "predicted_ms": 30.25, "predicted_per_second": 99.17}
    assert engine_timings(b'{"choices":[]}') == {}


def test_total_tokens_is_read_from_the_tail() -> None:
    assert total_tokens(b'{"choices":[],"usage":{"completion_tokens":1,"prompt_tokens":9,"total_tokens": 10}}') == 10
    chat_stream_end = b'data: {"choices":[],"timings":{"cache_n":1,"prompt_n":16,"predicted_n":3}}\n\ndata: [DONE]'
    assert total_tokens(chat_stream_end) == 19
    assert total_tokens(b'{"choices":[]}') is None


# -- the relay against a stand-in engine ----------------------------------------------------------------

SSE = [b'data: {"n":1}\n\n', b'data: {"n":2}\n\n', b"data: [DONE]\n\n"]


class StandIn:
    """Answers POST /stream with chunked SSE (events released one by one through ``gate``) and anything else
    with a JSON body. The second request on a connection that carried a stream is dropped unanswered, as
    llama-server drops keep-alive after a stream."""

    def __init__(self, *, end_apart: bool = False) -> None:
        self.connections = 0
        self.gate: asyncio.Queue[None] = asyncio.Queue()
        self.end_apart = end_apart  # the chunked end in a write of its own, after one more gate

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        streamed = False
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return  # the client closed the connection
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            if streamed:
                writer.close()
                return
            if head.startswith(b"POST /stream"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                             b"Keep-Alive: timeout=5\r\n\r\n")
                for i, ev in enumerate(SSE):
                    await self.gate.get()
                    end = b"0\r\n\r\n" if i == len(SSE) - 1 and not self.end_apart else b""  # last event + end
                    writer.write(b"%x\r\n%s\r\n%s" % (len(ev), ev, end))
                    await writer.drain()
                if self.end_apart:
                    await self.gate.get()
                    writer.write(b"0\r\n\r\n")
                streamed = True
            else:
                body = b'{"usage":{"total_tokens":7}}'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(body), body))
            await writer.drain()


def test_relay_passes_events_as_they_come_and_retries_a_dropped_keep_alive() -> None:
    async def scenario() -> None:
        engine = StandIn()
        server = await asyncio.start_server(engine.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        up = Upstream()
        sent: list[dict] = []
        arrived = asyncio.Event()

        async def send(msg: dict) -> None:
            sent.append(msg)
            arrived.set()

        try:
            task = asyncio.create_task(relay(up, send, port, "/stream", b"{}", "r1"))
            for i in range(len(SSE)):  # each event reaches the client before the engine writes the next
                engine.gate.put_nowait(None)
                while len(sent) < i + 2:  # the head, then one message per event
                    arrived.clear()
                    await arrived.wait()
                assert sent[i + 1]["body"] == SSE[i] and sent[i + 1]["more_body"] is (i < len(SSE) - 1)
            out = await task
            assert out.streamed and out.events == 2 and out.status == 200 and out.body[1] == SSE[-1]
            assert sent[0]["status"] == 200 and (b"content-type", b"text/event-stream") in sent[0]["headers"]
            assert len(sent) == 1 + len(SSE)  # the head, and each event as it came: nothing joined or added
            sent.clear()
            plain = await relay(up, send, port, "/plain", b"{}", "r2")  # the pooled connection is dropped: retried
            assert plain.status == 200 and not plain.streamed and total_tokens(b"".join(plain.body)) == 7
            assert engine.connections == 2
            assert sent[-1]["more_body"] is False and sent[-1]["body"] == b'{"usage":{"total_tokens":7}}'
            assert (b"content-length", b"28") in sent[0]["headers"]
            await relay(up, send, port, "/plain", b"{}", "r3")  # a plain answer keeps its connection
            assert engine.connections == 2
        finally:
            up.close()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())


def test_the_done_event_goes_out_with_the_end_of_the_answer() -> None:
    """A client that has [DONE] may hang up at once: the relay sends it only with the answer's end (waiting for the
    engine's chunked end), so that no hang-up can come while the answer is still open."""
    async def scenario() -> None:
        engine = StandIn(end_apart=True)
        async with serving(engine) as (port, up):
            sent: list[dict] = []
            task = asyncio.create_task(relay(up, _record(sent), port, "/stream", b"{}", "r1"))
            for _ in SSE:
                engine.gate.put_nowait(None)
            while len(sent) < len(SSE):  # the head and the events before [DONE]
                await asyncio.sleep(0)
            for _ in range(50):  # [DONE] has arrived from the engine, its end has not: nothing more goes out
                await asyncio.sleep(0.001)
            assert len(sent) == len(SSE) and all(b"[DONE]" not in m.get("body", b"") for m in sent)
            engine.gate.put_nowait(None)  # the engine ends the answer
            out = await task
            assert sent[-1]["body"] == SSE[-1] and sent[-1]["more_body"] is False
            assert out.events == 2

    asyncio.run(scenario())


@contextlib.asynccontextmanager
async def serving(engine: StandIn):
    """The stand-in engine listening on loopback, and a pool to reach it: (port, pool), closed after."""
    server = await asyncio.start_server(engine.handle, "127.0.0.1", 0)
    up = Upstream()
    try:
        yield server.sockets[0].getsockname()[1], up
    finally:
        up.close()
        server.close()
        await server.wait_closed()


def _record(sent: list[dict]):
    async def send(msg: dict) -> None:
        sent.append(msg)
    return send


def test_relay_hooks_rewrite_what_the_client_gets() -> None:
    """What another API's routes need: each streamed chunk mapped, a last line added, a whole answer replaced."""

    async def scenario() -> None:
        engine = StandIn()
        server = await asyncio.start_server(engine.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        up = Upstream()
        sent: list[dict] = []

        async def send(msg: dict) -> None:
            sent.append(msg)

        try:
            for _ in SSE:
                engine.gate.put_nowait(None)
            out = await relay(up, send, port, "/stream", b"{}", "r1", on_chunk=lambda c: c.upper(),
                              on_finish=lambda: b"END", content_type=b"application/x-ndjson")
            assert out.events == 2 and (b"content-type", b"application/x-ndjson") in sent[0]["headers"]
            assert b"".join(m.get("body", b"") for m in sent[1:]) == b"".join(SSE).upper() + b"END"
            assert sent[-1]["more_body"] is False
            sent.clear()
            whole = await relay(up, send, port, "/plain", b"{}", "r2", on_body=lambda b: b"[" + b + b"]")
            assert total_tokens(b"".join(whole.body)) == 7  # what the engine said, for the log line
            body = b'[{"usage":{"total_tokens":7}}]'
            assert (b"content-length", str(len(body)).encode()) in sent[0]["headers"]
            assert sent[1] == {"type": "http.response.body", "body": body, "more_body": False}
        finally:
            up.close()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())


def test_an_engine_that_is_not_listening_is_an_upstream_error() -> None:
    async def scenario() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(UpstreamError, match=f"127.0.0.1:{port}"):
            await Upstream().open(port, "/v1/completions", b"{}", "r")

    asyncio.run(scenario())


def test_health_status_reads_the_code_or_none_when_nothing_listens() -> None:
    async def scenario() -> None:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            code = b"200 OK" if head.startswith(b"GET /health ") else b"503 Service Unavailable"
            writer.write(b"HTTP/1.1 " + code + b"\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        assert await health_status(port) == 200
        assert await health_status(port, "/loading") == 503
        server.close()
        await server.wait_closed()
        assert await health_status(port) is None

    asyncio.run(scenario())


def test_a_stream_without_usage_logs_no_token_count() -> None:
    # a stream whose tail carries neither usage nor timings: its tokens are unknown (None), never the number of SSE
    # events relayed (which counts chunks, not tokens); the events are logged under their own name
    from types import SimpleNamespace

    from fitevict.server.fastpath import FastPath, Record, Relayed

    door = SimpleNamespace(config=SimpleNamespace(server=SimpleNamespace(debug_log_prompts=False)))
    rec, extra = Record("r1", "chat", 0.0), {}
    out = Relayed(200, True, 7, (b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n', b"data: [DONE]\n\n"))
    FastPath._account(SimpleNamespace(door=door), rec, out, {}, extra, SimpleNamespace())
    assert rec.tokens is None and extra["events"] == 7 and extra["stream"] is True
    with_usage = Relayed(200, True, 7, (b'data: {"usage":{"total_tokens":12}}\n\n', b"data: [DONE]\n\n"))
    FastPath._account(SimpleNamespace(door=door), rec, with_usage, {}, extra, SimpleNamespace())
    assert rec.tokens == 12


def test_connections_an_engine_closed_leave_the_pool_with_their_port() -> None:
    """Seats come and go on fresh ports: a kept connection the engine closes (its seat stopped) leaves the idle pool
    when it closes, and the port with it, so a door that swaps seats for days keeps no dead connection."""
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        await reader.read()  # until the door or the "seat" closes it

    async def scenario() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        up = Upstream()
        try:
            conn = await up.open(port, "/plain", b"{}", "r1")
            while await conn.read():
                pass
            up.release(conn)
            assert up.idle == {port: [conn]}  # kept alive for the next request
            closed = asyncio.Event()
            pooled = getattr(conn, "on_lost", None)
            conn.on_lost = lambda c: (pooled(c) if pooled else None, closed.set())
            server.close()
            for w in writers:  # the seat stops: its connections close
                w.close()
            await asyncio.wait_for(closed.wait(), 10)
            assert up.idle == {} and up.busy == {}
        finally:
            up.close()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())
