"""The front door end to end: the official openai client against a real `fitevict serve` driving real
llama-server seats, under RAM budgets that force swaps."""

from __future__ import annotations

import json
import re
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from _frontdoor import engine_pids_of, front_door, history as history_of
from _models import medium_host_bytes, swap_models
from fitevict.pricing.gguf import load_structure

pytestmark = pytest.mark.e2e

USER, ADMIN = "user-key-1", "admin-key-1"


@pytest.fixture(scope="module")
def models(zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return swap_models(zoo, tmp_path_factory.mktemp("fd-models"))


@pytest.fixture(scope="module")
def door(models: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("door")
    cfg = tmp / "fitevict.toml"
    cfg.write_text(f"""
[server]
api_keys = ["{USER}"]
admin_keys = ["{ADMIN}"]
max_body_bytes = "64KiB"

[budget]
ram_reserve = 0

[models.embedder]
embeddings = true
extra_args = ["--pooling", "mean"]
ctx = 512

[models.llama-gqa]
aliases = ["tiny"]
request_defaults = {{ max_tokens = 3 }}
""")
    with front_door(tmp, "--config", str(cfg), "--models-dir", str(models),
                    "--ram-limit", str(int(2.5 * medium_host_bytes(models)))) as fd:
        yield fd


def client(fd, key: str = USER) -> openai.OpenAI:
    return openai.OpenAI(base_url=fd.base_url + "/v1", api_key=key, max_retries=0, timeout=120)


def admin(fd) -> httpx.Client:
    return httpx.Client(base_url=fd.base_url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=120)


def idle_resident(fd, key: str, *, within: float) -> dict:
    """The resident view of ``key`` once it has no request in flight, or the last view after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        with admin(fd) as a:
            view = next(r for r in a.get("/v1/models/residents").json()["data"] if r["key"] == key)
        if view["in_flight"] == 0 or time.monotonic() > deadline:
            return view
        time.sleep(0.05)  # polling another process's state over HTTP: there is no event to await


def history(fd, **params) -> list[dict]:
    return history_of(fd, key=ADMIN, **params)


def test_chat_plain_and_streamed(door) -> None:
    c = client(door)
    r = c.chat.completions.create(model="llama-q8_0", messages=[{"role": "user", "content": "hello"}], max_tokens=4)
    assert r.choices[0].message is not None and r.usage.completion_tokens >= 1
    # greedy, so that the random-weight model's tokens are the same every run: sampled ones can be byte tokens
    # that complete no character, which the engine holds back until its last event
    chunks = list(c.chat.completions.create(model="llama-q8_0", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4, stream=True, temperature=0))
    assert len(chunks) >= 2
    assert any(ch.choices and ch.choices[0].finish_reason for ch in chunks)
    lines = door.await_requests(2, model="llama-q8_0", endpoint="chat")  # the streamed one's is written last
    plain, streamed = lines[0], next(l for l in lines if l.get("stream"))
    for line in (plain, streamed):
        assert line["status"] == 200 and line["latency_s"] > 0 and line["tokens"] >= 1
        assert {"queue_wait_s", "load_wait_s", "request_id"} <= set(line)
    assert plain["load_wait_s"] > 0  # the first request loaded the model
    assert "hello" not in door.log()  # prompts are not logged unless debug logging is opted into


def test_completions_and_alias_routing(door) -> None:
    r = client(door).completions.create(model="tiny", prompt="once upon", max_tokens=5)
    assert r.choices[0].text is not None and r.usage.completion_tokens == 5


def test_request_defaults_only_fill_absent_fields(door) -> None:
    c = client(door)
    msgs = [{"role": "user", "content": "tell me"}]
    defaulted = c.chat.completions.create(model="llama-gqa", messages=msgs)
    explicit = c.chat.completions.create(model="llama-gqa", messages=msgs, max_tokens=6)
    # random weights practically never emit EOS within a few tokens
    assert defaulted.usage.completion_tokens == 3
    assert explicit.usage.completion_tokens == 6


def test_embeddings_on_a_model_configured_for_them(door, models: Path) -> None:
    r = client(door).embeddings.create(model="embedder", input=["alpha", "beta gamma"])
    n_embd = load_structure(models / "embedder.gguf").n_embd
    assert [len(d.embedding) for d in r.data] == [n_embd, n_embd]
    line = door.await_requests(endpoint="embeddings", status=200)[0]
    assert line["embeddings"] == {"count": 2, "shape": [2, n_embd]}
    assert "alpha" not in door.log()  # content is not logged without debug opt-in


def test_models_list_and_residents(door) -> None:
    client(door).chat.completions.create(model="llama-q8_0", messages=[{"role": "user", "content": "x"}], max_tokens=1)
    listed = {m.id: m for m in client(door).models.list().data}
    assert {"med-a", "llama-gqa", "embedder"} <= set(listed)
    q8 = listed["llama-q8_0"].model_extra["fitevict"]
    assert q8["resident"] is True and q8["file"]["source"] == "file-size"
    with admin(door) as c:
        res = {r["key"]: r for r in c.get("/v1/models/residents").json()["data"]}
    r = res["llama-q8_0"]
    assert r["state"] == "ready" and r["placement"] == "100% CPU" and r["in_flight"] == 0
    cpu = r["devices"]["CPU"]
    assert cpu["measured_bytes"] > 0 and cpu["predicted_bytes"] > 0 and cpu["predicted_source"]
    # four figures, each under its own name: measured is PSS as read, allocated the engine's buffers, planned the
    # larger of allocated + the process overhead and measured; none stands in for another
    assert cpu["measured_source"].startswith("measured: PSS") and cpu["measured_bytes"] == (
        r["host_pss"]["committed_bytes"] + r["host_pss"]["mapped_bytes"])
    assert cpu["allocated_source"].startswith("engine-reported") and cpu["allocated_bytes"] > 0
    # planned is what the planner counts: never below what the seat holds, and, summed over the residents, what a
    # plan finds held of the budget (read between two identical readings of the residents)
    assert cpu["planned_bytes"] >= max(cpu["measured_bytes"], cpu["allocated_bytes"])

    def held_and_planned() -> tuple[int, int] | None:
        with admin(door) as c:
            def held() -> int:
                rows = c.get("/v1/models/residents").json()["data"]
                return sum(x["devices"]["CPU"]["planned_bytes"] for x in rows if "CPU" in x["devices"])
            first = held()
            plan = c.post("/v1/models/med-c/plan", json={"ctx": 2048}).json()["plan"]
            return (first, plan["budget_bytes"]["CPU"] - plan["free_bytes_before"]["CPU"]) if held() == first else None

    deadline = time.monotonic() + 30
    while (got := held_and_planned()) is None and time.monotonic() < deadline:
        continue  # a reading changed a resident's figure between the two: read again
    assert got is not None and got[0] == got[1], got
    assert cpu["measured_peak_bytes"] >= cpu["measured_bytes"]
    assert r["last_used"] is not None and r["unload_at"] > r["last_used"]


def test_dashboard_shows_residents_and_history(door) -> None:
    client(door).chat.completions.create(model="llama-q8_0", messages=[{"role": "user", "content": "x"}], max_tokens=1)
    # the first page prices every model in the catalog (its dry-run column)
    html = httpx.get(door.base_url + "/dashboard/live", headers={"Authorization": f"Bearer {USER}"}, timeout=60).text
    resident = html.split("<h2>Resident</h2>")[1].split("<h2>Catalog</h2>")[0]
    assert 'data-model="llama-q8_0"' in resident and "100% CPU" in resident
    assert '<li class="ev load">' in html.split("<h2>Timeline</h2>")[1]


def test_plan_is_a_dry_run(door) -> None:
    before = len(history(door))
    with admin(door) as c:
        r = c.post("/v1/models/med-c/plan", json={"ctx": 2048})
    assert r.status_code == 200, r.text
    plan = r.json()["plan"]
    assert plan["action"] in ("load", "ram") and plan["config"]["n_ctx"] == 2048
    assert plan["needed_bytes"]["CPU"] > 0 and plan["budget_bytes"]["CPU"] > 0
    assert len(history(door)) == before


def test_admin_load_and_unload_verify_release(door) -> None:
    with admin(door) as c:
        r = c.post("/v1/models/llama-gqa/load")
        assert r.status_code == 200, r.text
        assert r.json()["resident"]["state"] == "ready"
        u = c.post("/v1/models/llama-gqa/unload")
        assert u.status_code == 200, u.text
    body = u.json()
    assert body["unloaded"] is True and body["release_verified"] is True and body["freed_bytes"] > 0
    ev = history(door, model="llama-gqa", event="unload")[0]
    assert ev["freed_gb"] is not None and ev["details"]["release_verified"] is True


def test_stream_disconnect_releases_the_seat(door) -> None:
    with httpx.Client(base_url=door.base_url, headers={"Authorization": f"Bearer {USER}"}, timeout=60) as c:
        with c.stream("POST", "/v1/completions",
                      json={"model": "llama-q8_0", "prompt": "go", "max_tokens": 100000, "stream": True}) as s:
            assert s.status_code == 200
            next(s.iter_raw())  # one chunk, then hang up
    assert idle_resident(door, "llama-q8_0", within=30)["in_flight"] == 0


BAD = [
    # (name, path, raw body, headers, status, error type)
    ("malformed json", "/v1/chat/completions", b"{not json", {}, 400, "invalid_request_error"),
    ("missing model", "/v1/chat/completions", json.dumps({"messages": []}).encode(), {}, 400, "invalid_request_error"),
    ("unknown model", "/v1/chat/completions", json.dumps({"model": "llama-gq", "messages": []}).encode(), {}, 404,
     "not_found_error"),
    ("bad contract value", "/v1/chat/completions",
     json.dumps({"model": "llama-gqa", "messages": [], "fitevict": {"alloc_mode": "all-in"}}).encode(), {}, 400,
     "invalid_request_error"),
    ("unknown contract key", "/v1/chat/completions",
     json.dumps({"model": "llama-gqa", "messages": [], "fitevict": {"ctxx": 5}}).encode(), {}, 400,
     "invalid_request_error"),
    ("quantized V without flash attention", "/v1/chat/completions",
     json.dumps({"model": "llama-gqa", "messages": [],
                 "fitevict": {"kv_cache_type": "q8_0", "flash_attn": False}}).encode(), {}, 400,
     "invalid_request_error"),
    ("path traversal", "/v1/chat/completions",
     json.dumps({"model": "llama-gqa", "messages": [], "fitevict": {"gguf_file": "../med-a.gguf"}}).encode(), {}, 400,
     "invalid_request_error"),
    ("absolute gguf_file", "/v1/completions",
     json.dumps({"model": "llama-gqa", "prompt": "x", "fitevict": {"gguf_file": "/etc/passwd"}}).encode(), {}, 400,
     "invalid_request_error"),
    ("oversized body", "/v1/chat/completions",
     json.dumps({"model": "llama-gqa", "messages": [{"role": "user", "content": "x" * 70000}]}).encode(), {}, 413,
     "invalid_request_error"),
    ("wrong api key", "/v1/chat/completions", json.dumps({"model": "llama-gqa", "messages": []}).encode(),
     {"Authorization": "Bearer nope"}, 401, "authentication_error"),
    ("user key on admin route", "/v1/models/llama-gqa/load", b"", {"Authorization": f"Bearer {USER}"}, 403,
     "permission_error"),
    ("embeddings request sets an internal contract key", "/v1/embeddings",
     json.dumps({"model": "llama-q8_0", "input": "x", "fitevict": {"embeddings": True}}).encode(), {}, 400,
     "invalid_request_error"),
]


@pytest.mark.parametrize("name,path,raw,headers,status,etype", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_4xx_in_openai_envelope_and_changes_nothing(door, name, path, raw, headers, status, etype):
    with admin(door) as a:
        before_res = sorted(r["key"] for r in a.get("/v1/models/residents").json()["data"])
    before_hist = len(history(door))
    hdrs = {"Authorization": f"Bearer {USER}", "Content-Type": "application/json", **headers}
    r = httpx.post(door.base_url + path, content=raw, headers=hdrs, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == etype and err["message"]
    if name == "unknown model":
        assert "llama-gqa" in err["message"] and "llama-gqa" in err["close_matches"]
    if name == "bad contract value":
        assert "max-gpu" in err["message"]  # lists the allowed values
    with admin(door) as a:
        after_res = sorted(r["key"] for r in a.get("/v1/models/residents").json()["data"])
    assert after_res == before_res and len(history(door)) == before_hist


def test_eight_clients_over_three_models_none_lost(door) -> None:
    keys = ["med-a", "med-b", "med-c"]
    results: list[tuple[str, int | str]] = []
    lock = threading.Lock()
    start = time.time()

    def worker(i: int) -> None:
        c = client(door)
        for j in range(3):
            key = keys[(i + j) % 3]
            try:
                r = c.chat.completions.create(model=key, messages=[{"role": "user", "content": f"{i}-{j}"}],
                                              max_tokens=2)
                out: int | str = 200 if r.choices else "empty"
            except openai.APIStatusError as e:
                out = e.status_code
            with lock:
                results.append((key, out))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(results) == 24 and all(out == 200 for _k, out in results), results
    events = [e for e in history(door) if e["time"] >= start - 1]
    loads = [e for e in events if e["event"] == "load" and e["model"] in keys]
    evicts = [e for e in events if e["event"] == "evict" and e["model"] in keys]
    assert loads, "every model had to be loaded"
    for e in evicts:
        assert e["reason"].startswith("evicted for ") and e["details"]["release_verified"] is True
    for e in loads:
        assert e["strategy"] and e["seconds"] > 0 and e["measured_gb"] is not None
    with admin(door) as a:
        resident = {r["key"] for r in a.get("/v1/models/residents").json()["data"]} & set(keys)
    # every model that is not resident now was evicted once for each time it was loaded
    for k in keys:
        n_load = sum(e["model"] == k for e in loads)
        n_evict = sum(e["model"] == k for e in evicts)
        assert n_load == n_evict + (k in resident), (k, n_load, n_evict, resident)
    assert len(resident) <= 2  # the budget holds two mediums


def test_swap_under_a_budget_that_fits_one(models: Path, tmp_path: Path) -> None:
    with front_door(tmp_path, "--models-dir", str(models), "--ram-limit", str(int(1.5 * medium_host_bytes(models)))) as fd:
        c = client(fd, key="unused")
        for key in ("med-a", "med-b", "med-a"):
            r = c.chat.completions.create(model=key, messages=[{"role": "user", "content": "x"}], max_tokens=2)
            assert r.choices
        events = [(e["event"], e["model"]) for e in reversed(history(fd))]
    assert events == [("load", "med-a"), ("evict", "med-a"), ("load", "med-b"), ("evict", "med-b"),
                      ("load", "med-a")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_no_engine_outlives_fitevict(models: Path, tmp_path: Path, sig: signal.Signals) -> None:
    with front_door(tmp_path, "--models-dir", str(models)) as fd:
        c = client(fd, key="unused")
        c.chat.completions.create(model="llama-gqa", messages=[{"role": "user", "content": "x"}], max_tokens=1)
        engines = engine_pids_of(fd.proc.pid)
        assert len(engines) == 1
        os.kill(fd.proc.pid, sig)
        fd.proc.wait(60)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in engines):
            time.sleep(0.05)  # the kernel reaps the engine; no event reaches this process
        assert not any(Path(f"/proc/{p}").exists() for p in engines)
    # The next fitevict on the same data finds what the last one left recorded, and says so.
    with front_door(tmp_path, "--models-dir", str(models)) as fd:
        orphans = history(fd, event="orphan")
        unloads = history(fd, event="unload")
    if sig == signal.SIGTERM:
        assert orphans == [] and unloads and "shutting down" in unloads[0]["reason"]
    else:
        assert len(orphans) == 1 and orphans[0]["details"]["was_alive"] is False
        assert orphans[0]["details"]["pid"] == engines[0] and "no longer running" in orphans[0]["reason"]


def test_a_larger_context_reloads_the_model_and_a_smaller_one_does_not(door) -> None:
    c = client(door)
    msgs = [{"role": "user", "content": "x"}]
    with admin(door) as a:  # whatever an earlier test left of it (a larger context serves these requests) goes
        a.post("/v1/models/llama-q8_0/unload")
    c.chat.completions.create(model="llama-q8_0", messages=msgs, max_tokens=1, extra_body={"fitevict": {"ctx": 1024}})
    c.chat.completions.create(model="llama-q8_0", messages=msgs, max_tokens=1, extra_body={"fitevict": {"ctx": 2048}})
    with admin(door) as a:
        res = {r["key"]: r for r in a.get("/v1/models/residents").json()["data"]}
    assert res["llama-q8_0"]["ctx"] == 2048
    ev = history(door, model="llama-q8_0", limit=2)
    assert [e["event"] for e in ev] == ["load", "unload"]
    assert "replaced" in ev[1]["reason"] and "reloaded for ctx: resident 1024 < asked 2048" in ev[1]["reason"]
    # a smaller context again is a hit on the larger seat: no new load
    c.chat.completions.create(model="llama-q8_0", messages=msgs, max_tokens=1, extra_body={"fitevict": {"ctx": 1024}})
    assert history(door, model="llama-q8_0", limit=1)[0]["id"] == ev[0]["id"]


def test_queue_bound_answers_503_with_retry_after(models: Path, tmp_path: Path) -> None:
    import asyncio

    cfg = tmp_path / "q.toml"
    cfg.write_text("[policy]\nmax_queue = 1\n")
    with front_door(tmp_path, "--config", str(cfg), "--models-dir", str(models)) as fd:
        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=fd.base_url, timeout=120) as c:
                body = {"model": "med-a", "prompt": "x", "max_tokens": 1}
                return list(await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(3))))

        rs = asyncio.run(burst())
    codes = sorted(r.status_code for r in rs)
    assert codes == [200, 503, 503], [r.text for r in rs]
    busy = next(r for r in rs if r.status_code == 503)
    assert int(busy.headers["retry-after"]) > 0 and "max_queue" in busy.json()["error"]["message"]


def test_resident_models_are_not_blocked_behind_a_load(models: Path, tmp_path: Path) -> None:
    import asyncio

    with front_door(tmp_path, "--models-dir", str(models)) as fd:
        async def race() -> tuple[float, float]:
            async with httpx.AsyncClient(base_url=fd.base_url, timeout=120) as c:
                (await c.post("/v1/completions", json={"model": "llama-gqa", "prompt": "x", "max_tokens": 1})
                 ).raise_for_status()
                t0 = time.monotonic()

                async def timed(coro) -> float:
                    r = await coro
                    r.raise_for_status()
                    return time.monotonic() - t0

                load = asyncio.create_task(timed(c.post("/v1/models/med-b/load")))
                while True:  # until med-b's seat runs its process and is still loading (it holds the placement)
                    res = (await c.get("/v1/models/residents")).json()["data"]
                    if any(r["key"] == "med-b" for r in res):
                        break
                    assert not load.done(), "the load finished before its seat was seen loading"
                assert next(r for r in res if r["key"] == "med-b")["state"] == "loading"
                small = await timed(c.post("/v1/completions", json={"model": "llama-gqa", "prompt": "y",
                                                                    "max_tokens": 1}))
                return small, await load

        small, load = asyncio.run(race())
    assert small < load  # served while med-b was still loading


def test_client_disconnect_cancels_a_plain_request(door) -> None:
    """A non-streamed completion that would run for thousands of tokens: the client hangs up, fitevict cancels the
    upstream request, the seat is free again and the engine itself cancels the task (its log says so) instead of
    generating to the end of its context."""
    n_ctx = 8192  # the medium model's training context: the engine does not cap the slot below it
    body = {"model": "med-c", "prompt": "go", "max_tokens": n_ctx - 16, "fitevict": {"ctx": n_ctx},
            "ignore_eos": True}
    hdrs = {"Authorization": f"Bearer {USER}"}
    with admin(door) as a:
        a.post("/v1/models/med-c/load", json={"ctx": n_ctx}).raise_for_status()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(door.base_url + "/v1/completions", json=body, headers=hdrs, timeout=1.0)
    view = idle_resident(door, "med-c", within=60)
    assert view["in_flight"] == 0, "fitevict still counts the hung-up request as in flight"
    # the engine cancels the task too: it notices the closed connection when a second passes with no result for
    # it. Nothing here may ask the engine anything meanwhile: any other result on the seat (a /slots query, another
    # request's tokens) wakes that wait early, and llama-server then does not look at the connection at all.
    listening = re.compile(rf"listening on http://127\.0\.0\.1:{view['port']}\b")
    [log] = [p for p in (door.data_dir / "seats").glob("med-c-*.log") if listening.search(p.read_text())]
    deadline = time.monotonic() + 120  # a hang guard only: the decision is read from the engine's own log
    cancelled = re.compile(r"cancel task.*?stop processing: n_tokens = (\d+)", re.S)
    while (m := cancelled.search(log.read_text())) is None:  # the cancel, then the slot's release
        assert time.monotonic() < deadline, "the engine generated on after the client hung up"
        time.sleep(0.05)  # reading the engine's log file: there is no event to await
    released = [int(m[1])]
    assert released and released[-1] < n_ctx - 16, released
