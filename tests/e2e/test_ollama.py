"""The Ollama-compatible API end to end: the official ``ollama`` client against a real ``fitevict serve`` driving
real llama-server seats, under a RAM budget that holds one of the two medium models."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from _frontdoor import front_door, history as history_of
from _models import medium_host_bytes, swap_models
from fitevict.pricing.gguf import load_structure

pytestmark = pytest.mark.e2e

USER = "user-key-1"


@pytest.fixture(scope="module")
def models(zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return swap_models(zoo, tmp_path_factory.mktemp("ol-models"))


@pytest.fixture(scope="module")
def door(models: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("ol-door")
    cfg = tmp / "fitevict.toml"
    cfg.write_text(f'[server]\napi_keys = ["{USER}"]\n\n[budget]\nram_reserve = 0\n')
    with front_door(tmp, "--config", str(cfg), "--models-dir", str(models),
                    "--ram-limit", str(int(1.5 * medium_host_bytes(models)))) as fd:
        yield fd


def client(fd) -> ollama.Client:
    return ollama.Client(host=fd.base_url, headers={"Authorization": f"Bearer {USER}"}, timeout=120)


def history(fd, **params) -> list[dict]:
    return history_of(fd, key=USER, **params)


def residents(fd) -> dict[str, dict]:
    r = httpx.get(fd.base_url + "/v1/models/residents", headers={"Authorization": f"Bearer {USER}"}, timeout=30)
    return {v["key"]: v for v in r.json()["data"]}


def event_after(fd, since: float, event: str, model: str, within: float) -> dict:
    """The first ``event`` for ``model`` recorded after ``since``, polled over HTTP until ``within`` s pass. A stop
    is recorded once its release is verified, which may take its grace and release bounds on a busy machine."""
    deadline = time.monotonic() + within
    while True:
        got = [e for e in history(fd, model=model, event=event) if e["time"] >= since]
        if got:
            return got[-1]
        assert time.monotonic() < deadline, f"no {event} of {model} within {within} s: {history(fd)[:5]}"
        time.sleep(0.1)  # another process's history: there is no event to await from here


def test_list_and_show(door, models: Path) -> None:
    listed = {m.model: m for m in client(door).list().models}
    assert {"med-a", "med-b", "llama-gqa", "llama-q8_0"} <= set(listed)
    gqa = listed["llama-gqa"]
    assert gqa.size == (models / "llama-gqa.gguf").stat().st_size
    assert gqa.details.format == "gguf" and gqa.details.family == "llama" and gqa.details.quantization_level
    q8 = listed["llama-q8_0"].details.quantization_level
    assert q8 == "Q8_0"
    shown = client(door).show("llama-gqa")
    s = load_structure(models / "llama-gqa.gguf")
    assert shown.modelinfo["llama.context_length"] == s.n_ctx_train
    assert shown.modelinfo["llama.embedding_length"] == s.n_embd
    assert "embedding" in shown.capabilities
    assert client(door).show("llama-gqa:latest").modelinfo == shown.modelinfo  # Ollama's default tag


def test_chat_generate_and_ps_with_swaps(door) -> None:
    c = client(door)
    start = time.time()
    r = c.chat(model="med-a", messages=[{"role": "user", "content": "hello"}], options={"num_predict": 3})
    assert r.done and r.done_reason == "length" and r.eval_count == 3 and r.message.role == "assistant"
    assert r.load_duration > 0 and r.total_duration >= r.load_duration  # this request loaded med-a
    parts = list(c.chat(model="med-b", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 4},
                        stream=True))
    assert parts[-1].done and parts[-1].eval_count == 4 and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content or "" for p in parts) == "".join(p.message.content or "" for p in parts[:-1])
    # the budget holds one medium: med-a had to go for med-b
    loaded = [m.model for m in c.ps().models]
    assert "med-b" in loaded and "med-a" not in loaded
    g = c.generate(model="med-a", prompt="once upon", options={"num_predict": 5, "seed": 1, "temperature": 0})
    assert g.done and g.eval_count == 5 and isinstance(g.response, str)
    streamed = list(c.generate(model="med-a", prompt="once upon", options={"num_predict": 5, "seed": 1,
                                                                            "temperature": 0}, stream=True))
    assert "".join(p.response for p in streamed) == g.response  # same seed, greedy: the same text
    events = [(e["event"], e["model"]) for e in reversed(history(door)) if e["time"] >= start - 1
              and e["model"] in ("med-a", "med-b")]
    assert events == [("load", "med-a"), ("evict", "med-a"), ("load", "med-b"), ("evict", "med-b"),
                      ("load", "med-a")]


def test_ps_reports_measured_bytes_and_expiry(door) -> None:
    c = client(door)
    c.chat(model="llama-gqa", messages=[{"role": "user", "content": "x"}], options={"num_predict": 1})
    deadline = time.monotonic() + 30  # a new seat is read just after its first answer: until then, not measured
    while residents(door)["llama-gqa"]["devices"]["CPU"]["measured_bytes"] is None:
        assert time.monotonic() < deadline, "llama-gqa was not measured within 30 s"
        time.sleep(0.05)  # another process's state: there is no event to await from here
    ps = {m.model: m for m in c.ps().models}
    view = residents(door)["llama-gqa"]
    cpu = view["devices"]["CPU"]
    assert cpu["measured_bytes"] and ps["llama-gqa"].size == cpu["measured_bytes"]
    assert ps["llama-gqa"].size_vram == 0  # no GPU on this machine: nothing in VRAM
    assert ps["llama-gqa"].context_length == view["ctx"]
    assert abs(ps["llama-gqa"].expires_at.timestamp() - view["unload_at"]) < 0.01
    raw = httpx.get(door.base_url + "/api/ps", headers={"Authorization": f"Bearer {USER}"}).json()
    source = next(m for m in raw["models"] if m["name"] == "llama-gqa")["fitevict"]["sources"]["CPU"]
    assert source == cpu["measured_source"] and source.startswith("measured: PSS")


def test_num_ctx_is_the_load_contract(door) -> None:
    client(door).chat(model="llama-q8_0", messages=[{"role": "user", "content": "x"}],
                      options={"num_predict": 1, "num_ctx": 1024})
    assert residents(door)["llama-q8_0"]["ctx"] == 1024


def test_embed_from_a_chat_model_loads_an_embeddings_seat(door, models: Path) -> None:
    c = client(door)
    c.chat(model="llama-gqa", messages=[{"role": "user", "content": "x"}], options={"num_predict": 1})
    assert residents(door)["llama-gqa"]["config"]["embeddings"] is False
    n_embd = load_structure(models / "llama-gqa.gguf").n_embd
    e = c.embed(model="llama-gqa", input=["alpha", "beta gamma"])
    assert [len(v) for v in e.embeddings] == [n_embd, n_embd] and e.embeddings[0] != e.embeddings[1]
    seat = residents(door)["llama-gqa"]
    assert seat["config"]["embeddings"] is True
    old = c.embeddings(model="llama-gqa", prompt="alpha")
    assert old.embedding == pytest.approx(e.embeddings[0], abs=1e-5)
    # the embeddings seat serves chat too (measured on the pinned build): no reload
    loads = len(history(door, model="llama-gqa", event="load"))
    c.chat(model="llama-gqa", messages=[{"role": "user", "content": "x"}], options={"num_predict": 1})
    assert len(history(door, model="llama-gqa", event="load")) == loads
    # the OpenAI route too: any model, no config needed
    o = openai.OpenAI(base_url=door.base_url + "/v1", api_key=USER, max_retries=0)
    assert len(o.embeddings.create(model="llama-gqa", input="alpha").data[0].embedding) == n_embd


def test_errors_in_ollamas_shape(door) -> None:
    c = client(door)
    with pytest.raises(ollama.ResponseError) as e:
        c.chat(model="llama-gq", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 404 and "llama-gq" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        c.generate(model="llama-gqa", prompt="x", keep_alive="5 parsecs")
    assert e.value.status_code == 400 and "keep_alive" in e.value.error
    r = httpx.post(door.base_url + "/api/chat", json={"model": "llama-gqa", "messages": []})
    assert r.status_code == 401 and set(r.json()) == {"error"}


def test_empty_generate_loads_and_keep_alive_0_unloads(door) -> None:
    c = client(door)
    loaded = c.generate(model="llama-q8_0", prompt="")
    assert loaded.done_reason == "load" and "llama-q8_0" in residents(door)
    gone = c.generate(model="llama-q8_0", prompt="", keep_alive=0)
    assert gone.done_reason == "unload" and "llama-q8_0" not in residents(door)
    assert history(door, model="llama-q8_0", limit=1)[0]["event"] == "unload"


@pytest.fixture(scope="module")
def idle_door(models: Path, tmp_path_factory: pytest.TempPathFactory):
    """A fitevict whose seats are unloaded after 2 s idle (policy.idle_unload_seconds)."""
    tmp = tmp_path_factory.mktemp("ol-idle")
    cfg = tmp / "fitevict.toml"
    cfg.write_text('[server]\napi_keys = ["user-key-1"]\n\n[policy]\nidle_unload_seconds = 2\n')
    with front_door(tmp, "--config", str(cfg), "--models-dir", str(models)) as fd:
        yield fd


def test_keep_alive_0_unloads_after_the_request(idle_door) -> None:
    t0 = time.time()
    r = client(idle_door).chat(model="llama-gqa", messages=[{"role": "user", "content": "x"}],
                               options={"num_predict": 1}, keep_alive=0)
    assert r.done
    ev = event_after(idle_door, t0, "idle-unload", "llama-gqa", within=60)
    # idle for 0 s under the request's keep-alive, not the policy's 2 s
    assert ev["reason"].startswith("idle for 0 s") and "keep-alive 0 s" in ev["reason"]
    assert ev["details"]["release_verified"] is True


def test_openai_keep_alive_0_unloads_after_the_request(idle_door) -> None:
    t0 = time.time()
    o = openai.OpenAI(base_url=idle_door.base_url + "/v1", api_key=USER, max_retries=0)
    o.chat.completions.create(model="llama-q8_0", messages=[{"role": "user", "content": "x"}], max_tokens=1,
                              extra_body={"fitevict": {"keep_alive": 0}})
    ev = event_after(idle_door, t0, "idle-unload", "llama-q8_0", within=60)
    assert "keep-alive 0 s" in ev["reason"]


def test_keep_alive_forever_survives_the_idle_unload(idle_door) -> None:
    c = client(idle_door)
    t0 = time.time()
    c.chat(model="med-a", messages=[{"role": "user", "content": "x"}], options={"num_predict": 1}, keep_alive=-1)
    c.chat(model="med-b", messages=[{"role": "user", "content": "x"}], options={"num_predict": 1})
    # med-b, used after med-a with the policy's keep-alive, goes at 2 s idle; med-a stays
    event_after(idle_door, t0, "idle-unload", "med-b", within=60)
    ps = {m.model: m for m in c.ps().models}
    assert "med-a" in ps and ps["med-a"].expires_at.year == 9999
    assert not [e for e in history(idle_door, model="med-a") if e["time"] >= t0 and e["event"] != "load"]
    c.generate(model="med-a", prompt="", keep_alive=0)  # leave the door as it was
