"""Fairness between clients through a real ``fitevict serve`` with real llama-server seats on loopback: an interactive
request overtakes a batch flood within its model's turn, and a key over its caps is refused 429 with Retry-After in
each API's own shape, through the official SDKs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from _frontdoor import FrontDoor, front_door, poll

pytestmark = pytest.mark.e2e

MODEL = "llama-gqa"
BATCH_KEY, CHAT_KEY, CAPPED_KEY = "sk-batch", "sk-chat", "sk-capped"
FLOOD_TOKENS = 100000  # to the context's end (ignore_eos): 400 tokens took 0.14 s on a fast seat, too short to queue


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> Iterator[FrontDoor]:
    tmp = tmp_path_factory.mktemp("fair")
    cfg = tmp / "fitevict.toml"
    cfg.write_text(f'''
[policy]
engine_queue_depth = 0
[models.{MODEL}]
parallel = 1
[fair]
classes = {{ interactive = 4, batch = 1 }}
[fair.keys.pipeline]
key = "{BATCH_KEY}"
class = "batch"
[fair.keys.chat]
key = "{CHAT_KEY}"
[fair.keys.capped]
key = "{CAPPED_KEY}"
max_in_flight = 1
max_queue = 0
''')
    with front_door(tmp, "--config", str(cfg), "--models-dir", str(models_dir)) as fd:
        yield fd


def chat(fd: FrontDoor, key: str, tokens: int, **headers: str) -> httpx.Response:
    return httpx.post(fd.base_url + "/v1/chat/completions", timeout=600,
                      headers={"Authorization": f"Bearer {key}", **headers},
                      json={"model": MODEL, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
                            "messages": [{"role": "user", "content": "Count from one to a hundred."}]})


def queued(fd: FrontDoor) -> list[dict]:
    r = httpx.get(fd.base_url + "/v1/models/residents", headers={"Authorization": f"Bearer {CHAT_KEY}"}, timeout=30)
    return r.json()["queued"]


def test_an_interactive_request_overtakes_a_batch_flood_within_its_models_turn(door: FrontDoor) -> None:
    assert chat(door, CHAT_KEY, 1).status_code == 200  # loaded: the flood and the chat share one turn
    with ThreadPoolExecutor(8) as pool:
        # each batch request generates to its context's end, so the flood queues on a fast seat too
        flood = [pool.submit(chat, door, BATCH_KEY, FLOOD_TOKENS) for _ in range(6)]
        waiting = poll(lambda: (lambda q: q if len(q) >= 4 else None)(queued(door)), "4 batch requests waiting", 120)
        assert all(q["class"] == "batch" and q["client"] == "pipeline" for q in waiting)
        assert all(q["estimate"]["seconds"] >= 0 for q in waiting)
        mine = chat(door, CHAT_KEY, 2)
        assert mine.status_code == 200 and float(mine.headers["x-fitevict-wait-estimate"]) >= 0
        batch_left = sum(1 for f in flood if not f.done())
        assert all(f.result().status_code == 200 for f in flood)
    assert batch_left >= 3  # it was served while at least 3 of the batch requests queued before it still waited
    log = door.await_requests(8, model=MODEL, status=200)
    lines = [line for line in log if line.get("client") in ("pipeline", "chat")][-7:]
    order = [line["client"] for line in lines]
    assert order.index("chat") <= 3, order  # ahead of it: at most the batch request in service and one per slot
    assert all(line.get("class") == ("interactive" if line["client"] == "chat" else "batch") for line in lines)


def test_a_key_over_its_caps_is_refused_429_in_each_apis_shape(door: FrontDoor) -> None:
    assert chat(door, CHAT_KEY, 1).status_code == 200  # loaded, so nothing waits for a load
    started, release = threading.Event(), threading.Event()
    held: list[int] = []

    def hold() -> None:  # one request of the capped key in flight: a long stream, not read past its first chunk
        with httpx.stream("POST", door.base_url + "/v1/chat/completions", timeout=600,
                          headers={"Authorization": f"Bearer {CAPPED_KEY}"},
                          json={"model": MODEL, "max_tokens": 100000, "ignore_eos": True, "stream": True,
                                "messages": [{"role": "user", "content": "Write a long story."}]}) as r:
            held.append(r.status_code)
            for _chunk in r.iter_raw():
                started.set()
                release.wait(600)  # until the refusals were seen: the seat generates to its context's end meanwhile

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert started.wait(120)
        oai = openai.OpenAI(base_url=door.base_url + "/v1", api_key=CAPPED_KEY, max_retries=0, timeout=120)
        with pytest.raises(openai.RateLimitError) as e:
            oai.chat.completions.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        assert int(e.value.response.headers["retry-after"]) >= 1
        assert "capped" in e.value.message and "max_queue" in e.value.message
        claude = anthropic.Anthropic(base_url=door.base_url, api_key=CAPPED_KEY, max_retries=0, timeout=120)
        with pytest.raises(anthropic.RateLimitError) as a:
            claude.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        assert a.value.status_code == 429 and a.value.body["error"]["type"] == "rate_limit_error"
        assert int(a.value.response.headers["retry-after"]) >= 1
        r = httpx.post(door.base_url + "/api/chat", headers={"Authorization": f"Bearer {CAPPED_KEY}"}, timeout=120,
                       json={"model": MODEL, "stream": False, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 429 and set(r.json()) == {"error"} and int(r.headers["retry-after"]) >= 1
        release.set()  # with one slot, the other key's request would wait behind the held stream
        other = chat(door, CHAT_KEY, 1)  # another key is not held back
        assert other.status_code == 200
    finally:
        release.set()
        t.join(600)
    assert held == [200]
