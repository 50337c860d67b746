"""The fast path in process: a real uvicorn serving ``create_app`` on loopback, real llama-server seats, the
supervisor's own queue read directly. Clients hang up with a raw socket close, so the disconnect is exact."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
import uvicorn

from _models import medium_host_bytes, swap_models
from _server import free_port
from fitevict.config import load_config
from fitevict.request.catalog import Catalog
from fitevict.server.app import create_app
from fitevict.store import Store

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def models(zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return swap_models(zoo, tmp_path_factory.mktemp("fp-models"))


class Lines(logging.Handler):
    """The request log lines, parsed."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))


@contextlib.asynccontextmanager
async def serving(tmp: Path, models: Path, llama_server: Path, *, ram_limit: int, **over) -> AsyncIterator[tuple]:
    cfg = load_config(None, env={}, overrides={"data_dir": str(tmp / "data"), "models_dirs": [str(models)],
                                               "budget.ram_limit": ram_limit, "budget.ram_reserve": 0, **over})
    store = Store.open(cfg.store_url)
    app = create_app(cfg, engine_binary=llama_server, catalog=Catalog.from_config(cfg), store=store, own_store=True)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    lines = Lines()
    logger = logging.getLogger("fitevict.request")
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    task = asyncio.create_task(server.serve())
    try:
        await until(lambda: server.started or task.done(), within=30)
        assert server.started, task.exception() if task.done() else "not started"
        yield f"http://127.0.0.1:{port}", app.state.supervisor, lines, store
    finally:
        logger.removeHandler(lines)
        server.should_exit = True
        await task


async def until(cond: Callable[[], bool], *, within: float) -> None:
    """Await ``cond`` over in-process state that has no event of its own (uvicorn's start, the queue)."""
    deadline = time.monotonic() + within
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def raw_post(base: str, path: str, body: dict) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    data = json.dumps(body).encode()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    return reader, writer


def test_hanging_up_while_queued_leaves_the_queue_and_loads_nothing(tmp_path: Path, models: Path,
                                                                    llama_server: Path) -> None:
    """The budget fits one medium. med-a is held in flight, so a request for med-b must queue; its client
    hangs up; the request leaves the queue at once, and no load of med-b happens once med-a is free."""

    async def scenario() -> None:
        async with serving(tmp_path, models, llama_server, ram_limit=int(1.5 * medium_host_bytes(models))) as (
                base, sup, lines, store):
            async with sup.acquire(sup.ask("med-a")):
                _, writer = await raw_post(base, "/v1/completions", {"model": "med-b", "prompt": "x", "max_tokens": 1})
                await until(lambda: sup.scheduler.waiting("med-b") == 1, within=30)
                writer.close()
                await until(lambda: sup.scheduler.waiting("med-b") == 0, within=5)
            async with httpx.AsyncClient(timeout=60) as c:  # med-a is free: a queued med-b would load now
                r = await c.post(base + "/v1/completions", json={"model": "med-a", "prompt": "x", "max_tokens": 1})
                assert r.status_code == 200, r.text
            assert "med-b" not in sup.seats
            await sup.settle()  # med-a's load record is written just after its first answer
            assert [e.model for e in store.events(event="load")] == ["med-a"]
            gone = next(line for line in lines.lines if line["model"] == "med-b")
            assert gone["status"] == 499 and gone["error"] == "client disconnected" and gone["latency_s"] is None

    asyncio.run(scenario())


def test_hanging_up_mid_stream_frees_the_seat_and_stops_the_engine(tmp_path: Path, models: Path,
                                                                   llama_server: Path) -> None:
    async def scenario() -> None:
        async with serving(tmp_path, models, llama_server, ram_limit=4 * 1024**3) as (base, sup, lines, _):
            body = {"model": "llama-gqa", "prompt": "go", "max_tokens": 100000, "stream": True, "ignore_eos": True}
            reader, writer = await raw_post(base, "/v1/completions", body)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
            assert b"data: " in await reader.readuntil(b"data: ")
            writer.close()
            await until(lambda: any(line["status"] == 499 for line in lines.lines), within=10)
            view = next(v for v in sup.resident_views() if v["key"] == "llama-gqa")
            assert view["in_flight"] == 0
            async with httpx.AsyncClient(timeout=30) as c:  # the engine stops generating: its slot goes idle
                slots = (await c.get(f"http://127.0.0.1:{view['port']}/slots")).json()
                deadline = time.monotonic() + 8
                while any(s.get("is_processing") for s in slots):
                    assert time.monotonic() < deadline, "the engine kept generating after the client hung up"
                    await asyncio.sleep(0.02)  # the engine's state, over HTTP: no event to await
                    slots = (await c.get(f"http://127.0.0.1:{view['port']}/slots")).json()

    asyncio.run(scenario())


def test_streams_are_relayed_as_they_come_and_keep_alive_survives_them(tmp_path: Path, models: Path,
                                                                       llama_server: Path) -> None:
    """Events reach the client spread over the generation (not buffered to the end); a plain request after
    each stream succeeds though llama-server dropped the kept-alive connection the stream used; the log
    line carries the fields for both."""

    async def scenario() -> None:
        async with serving(tmp_path, models, llama_server, ram_limit=4 * 1024**3) as (base, sup, lines, _):
            sbody = {"model": "llama-gqa", "prompt": "once", "max_tokens": 200, "stream": True, "ignore_eos": True,
                     "temperature": 0}
            async with httpx.AsyncClient(timeout=120) as c:
                for _ in range(3):
                    arrivals: list[float] = []
                    got = bytearray()
                    async with c.stream("POST", base + "/v1/completions", json=sbody) as r:
                        assert r.status_code == 200
                        async for chunk in r.aiter_raw():
                            arrivals.append(time.perf_counter())  # one per read: not buffered to the end
                            got += chunk
                    port = next(v["port"] for v in sup.resident_views() if v["key"] == "llama-gqa")
                    direct = await c.post(f"http://127.0.0.1:{port}/v1/completions", json=sbody)
                    # every event the engine sent (byte tokens merge, so fewer than 200), over many reads
                    assert got.count(b"data: ") == direct.content.count(b"data: ") > 50 and len(arrivals) >= 10
                    plain = await c.post(base + "/v1/chat/completions", headers={"x-request-id": "plain-after"},
                                         json={"model": "llama-gqa", "messages": [{"role": "user", "content": "x"}],
                                               "max_tokens": 2})
                    assert plain.status_code == 200, plain.text
                    assert plain.headers["x-request-id"] == "plain-after"
                    assert plain.json()["usage"]["completion_tokens"] == 2
            streamed = [line for line in lines.lines if line.get("stream")]
            plains = [line for line in lines.lines if line["request_id"] == "plain-after"]
            assert len(streamed) == 3 and len(plains) == 3
            for line in streamed + plains:
                assert line["status"] == 200 and line["latency_s"] > 0 and line["total_s"] >= line["latency_s"]
                assert {"queue_wait_s", "load_wait_s"} <= set(line)
            # usage from the stream's last event: the prompt's tokens plus the 200 generated, the same each time
            assert streamed[0]["tokens"] > 200 and len({line["tokens"] for line in streamed}) == 1
            assert streamed[0]["load_wait_s"] > 0  # the first stream loaded the model
            assert all(line["tokens"] > 2 for line in plains)  # usage.total_tokens: prompt + 2 generated
            for line in plains:  # the engine's own timings: prompt and generation apart, with tokens/s
                t = line["engine_timings"]
                assert t["predicted_n"] == 2 and t["prompt_n"] >= 1 and t["predicted_ms"] > 0
                assert t["predicted_per_second"] > 0

    asyncio.run(scenario())

