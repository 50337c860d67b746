"""Fairness between clients through a real ``fitevict serve`` with real llama-server seats on loopback: an interactive
request overtakes a batch flood within its model's turn, waits within its stated bound under a batch flood on another
model, and a key over its caps is refused 429 with Retry-After in each API's own shape, through the official SDKs."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from _frontdoor import FrontDoor, front_door, history, poll

pytestmark = pytest.mark.e2e

MODEL = "llama-gqa"
BATCH_KEY, CHAT_KEY, CAPPED_KEY = "sk-batch", "sk-chat", "sk-capped"
FLOOD_TOKENS = 100000  # to the context's end (ignore_eos): 400 tokens took 0.14 s on a fast seat, too short to queue
FAIR = f'''[fair]
classes = {{ interactive = 4, batch = 1 }}
[fair.keys.pipeline]
key = "{BATCH_KEY}"
class = "batch"
[fair.keys.chat]
key = "{CHAT_KEY}"
'''  # the classes, and the keys of the batch pipeline and the chat client


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> Iterator[FrontDoor]:
    tmp = tmp_path_factory.mktemp("fair")
    cfg = tmp / "fitevict.toml"
    cfg.write_text(f'''
[policy]
engine_queue_depth = 0
[models.{MODEL}]
parallel = 1
{FAIR}[fair.keys.capped]
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


@contextlib.contextmanager
def held_stream(fd: FrontDoor, key: str) -> Iterator[None]:
    """A request of ``key`` in flight on its seat until the block ends: a stream to its context's end, not read past
    its first chunk, so that the door's relay waits on this client (the seat's one slot stays taken: a slow client
    holds its slot, not the engine's fault); hung up when the block ends (read to its end, it would generate to the
    context's end first: minutes on a busy machine)."""
    started, release = threading.Event(), threading.Event()
    status: list[int] = []

    def hold() -> None:
        with httpx.stream("POST", fd.base_url + "/v1/chat/completions", timeout=600,
                          headers={"Authorization": f"Bearer {key}"},
                          json={"model": MODEL, "max_tokens": FLOOD_TOKENS, "ignore_eos": True, "stream": True,
                                "messages": [{"role": "user", "content": "Write a long story."}]}) as r:
            status.append(r.status_code)
            for _chunk in r.iter_raw():
                started.set()
                release.wait(600)
                break  # the client hangs up: the door ends its request, and the slot is free

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert started.wait(120), "the held stream never sent its first chunk"
        yield
    finally:
        release.set()
        t.join(600)
    assert status == [200]


def test_an_interactive_request_overtakes_a_batch_flood_within_its_models_turn(door: FrontDoor) -> None:
    """One slot held by a batch request while 4 more batch requests and then a chat request queue (each seen queued
    in the door's residents, so nothing drains meanwhile, however slow the machine): once the slot frees, the chat
    request, queued last, is handed it before every batch request queued before it."""
    assert chat(door, CHAT_KEY, 1).status_code == 200  # loaded: the flood and the chat share one turn
    with ThreadPoolExecutor(8) as pool:
        with held_stream(door, BATCH_KEY):
            flood = [pool.submit(chat, door, BATCH_KEY, 8) for _ in range(4)]
            waiting = poll(lambda: (lambda q: q if len(q) >= 4 else None)(queued(door)), "4 batch requests waiting", 120)
            assert all(q["class"] == "batch" and q["client"] == "pipeline" for q in waiting)
            assert all(q["estimate"]["seconds"] >= 0 for q in waiting)
            mine = pool.submit(chat, door, CHAT_KEY, 2)
            poll(lambda: any(q["client"] == "chat" for q in queued(door)), "the chat request queued", 120)
            assert len(queued(door)) == 5  # the held slot let nothing through: the chat request queued last
        got = mine.result()
        assert got.status_code == 200 and float(got.headers["x-fitevict-wait-estimate"]) >= 0
        assert all(f.result().status_code == 200 for f in flood)
    log = door.await_requests(6, model=MODEL, status=200)  # the warm-up, the chat and the 4 queued batch requests
    order = [line["client"] for line in log if line.get("client") in ("pipeline", "chat")][-5:]
    # one slot, nothing in the engine's queue: a request's answer ends before the next one is handed the slot
    assert order == ["chat", "pipeline", "pipeline", "pipeline", "pipeline"], order
    assert all(line.get("class") == ("interactive" if line["client"] == "chat" else "batch")
               for line in log if line.get("client") in ("pipeline", "chat"))


def test_a_key_over_its_caps_is_refused_429_in_each_apis_shape(door: FrontDoor) -> None:
    assert chat(door, CHAT_KEY, 1).status_code == 200  # loaded, so nothing waits for a load
    with held_stream(door, CAPPED_KEY):  # one request of the capped key in flight
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
    other = chat(door, CHAT_KEY, 1)  # another key is not held back (with one slot, it waited for the held stream)
    assert other.status_code == 200


FLOOD_MODEL, CHAT_MODEL = "llama-gqa", "llama-q8_0"  # two small models, one at a time in the flood door's budget
CTX = 2048
BATCH_OUT = 96  # tokens each flood request generates (ignore_eos): one request holds a slot for a while


def planned_bytes(fd: FrontDoor, model: str) -> int:
    """The bytes the door's planner needs for ``model`` (its dry run)."""
    r = httpx.post(f"{fd.base_url}/v1/models/{model}/plan", json={}, timeout=300)
    r.raise_for_status()
    return sum(r.json()["plan"]["needed_bytes"].values())


@pytest.fixture(scope="module")
def flood_door(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> Iterator[FrontDoor]:
    """A door whose budget holds one of the two models at a time (as its planner prices them), with the default
    engine queue (one more batch), the default policy and the classes of ``door``."""
    tmp = tmp_path_factory.mktemp("flood")
    models = "".join(f"[models.{m}]\nparallel = 1\nctx = {CTX}\n" for m in (FLOOD_MODEL, CHAT_MODEL))
    (tmp / "priced.toml").write_text(models)
    with front_door(tmp, "--config", str(tmp / "priced.toml"), "--models-dir", str(models_dir)) as fd:
        sizes = [planned_bytes(fd, m) for m in (FLOOD_MODEL, CHAT_MODEL)]
    limit = int(max(sizes) + min(sizes) / 2)  # either one, never both
    (tmp / "fitevict.toml").write_text(models + f'''
[budget]
ram_limit = {limit}
ram_reserve = 0
{FAIR}''')
    with front_door(tmp, "--config", str(tmp / "fitevict.toml"), "--models-dir", str(models_dir)) as fd:
        yield fd


def ask(fd: FrontDoor, key: str, model: str, tokens: int) -> httpx.Response:
    return httpx.post(fd.base_url + "/v1/chat/completions", timeout=600, headers={"Authorization": f"Bearer {key}"},
                      json={"model": model, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
                            "messages": [{"role": "user", "content": "Count."}]})


def residents(fd: FrontDoor) -> list[dict]:
    r = httpx.get(fd.base_url + "/v1/models/residents", headers={"Authorization": f"Bearer {CHAT_KEY}"}, timeout=30)
    return r.json()["data"]


def released(e: dict) -> float:
    """A stop's seconds from its start until its memory was back (the history's ``evict`` event)."""
    details = e.get("details") or {}
    return (e.get("seconds") or 0.0) + (e.get("release_seconds") or details.get("release_seconds") or 0.0)


def test_an_interactive_request_waits_for_one_batch_request_per_slot_under_a_flood(flood_door: FrontDoor) -> None:
    """Three batch clients flood one medium model while a chat client asks, one request at a time, for another that
    cannot be resident with it: each chat request's wait is within the bound docs/scheduling.md states ("A higher
    class under a lower class's flood"), computed from this door's own measured loads, releases and services, plus
    0.5 s for fitevict's own steps on a shared machine. The flood's requests in flight bound it, one per slot; the
    one the engine's queue would hold beside it, and the flood's queue, do not."""
    stop = threading.Event()
    codes: list[int] = []

    def flooder() -> None:
        while not stop.is_set():
            codes.append(ask(flood_door, BATCH_KEY, FLOOD_MODEL, BATCH_OUT).status_code)

    with ThreadPoolExecutor(3) as pool:
        floods = [pool.submit(flooder) for _ in range(3)]
        poll(lambda: codes, "the flood's first answer", 300)  # its turn is on, its service measured
        mine, on_seat = [], []
        for _ in range(3):
            on_seat += [x["in_flight"] for x in residents(flood_door) if x["key"] == FLOOD_MODEL]
            mine.append(ask(flood_door, CHAT_KEY, CHAT_MODEL, 4))
        stop.set()
        for f in floods:
            f.result()
    assert [r.status_code for r in mine] == [200] * 3 and set(codes) == {200}
    assert on_seat and max(on_seat) <= 1, on_seat  # one slot: no batch request waited in the engine's queue
    log = flood_door.await_requests(len(codes) + 3, status=200)
    events = history(flood_door, key=CHAT_KEY, limit=10000)
    loads = {m: max(e["seconds"] for e in events if e["event"] == "load" and e["model"] == m)
             for m in (FLOOD_MODEL, CHAT_MODEL)}
    evicts = [e for e in events if e["event"] == "evict"]
    rel = {m: max((released(e) for e in evicts if e["model"] == m), default=0.0) for m in (FLOOD_MODEL, CHAT_MODEL)}
    service = {m: max(line["latency_s"] for line in log if line["model"] == m) for m in (FLOOD_MODEL, CHAT_MODEL)}
    lo, hi, residency = FLOOD_MODEL, CHAT_MODEL, 1.0  # policy.min_residency_seconds, the default
    bound = (service[hi] + rel[hi] + loads[lo] + max(min(residency, loads[lo]), service[lo]) + rel[lo] + loads[hi]
             + 0.5)  # 0.5 s for fitevict's own steps on this shared machine
    chats = [line for line in log if line.get("client") == "chat"]
    waits = [line["queue_wait_s"] + line["load_wait_s"] for line in chats]
    assert len(waits) == 3 and max(waits) <= bound, (waits, bound, loads, rel, service)
    assert any(line["load_wait_s"] > 0 for line in chats), chats  # the flood's turn was ended for a chat request
