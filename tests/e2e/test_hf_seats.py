"""Transformers seats through the supervisor and ``fitevict serve``, side by side with llama-server seats under one
budget: chats with the openai SDK, swaps in both directions explained by the history, and a load without weights
refused and recorded."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from safetensors.numpy import save_file

from _frontdoor import front_door, history

pytestmark = pytest.mark.e2e

HF = "hf-llama-gqa"


@pytest.fixture(scope="module")
def mixed_dir(hf_zoo: dict, zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("mixed")
    shutil.copytree(hf_zoo[HF].path, d / HF)
    shutil.copyfile(zoo["llama-medium"].path, d / "med.gguf")
    # a folder whose safetensors hold nothing the model needs: the seat's walk finds no weights
    empty = d / "hf-empty"
    empty.mkdir()
    (empty / "config.json").write_text((hf_zoo[HF].path / "config.json").read_text())
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(hf_zoo[HF].path / f, empty / f)
    save_file({"unrelated.weight": np.ones(4, np.float32)}, str(empty / "model.safetensors"))
    return d


def _host(door, key: str) -> int:
    views = httpx.get(door.base_url + "/v1/models/residents", timeout=30).json()["data"]
    v = next(v for v in views if v["key"] == key)
    return v["devices"]["CPU"]["planned_bytes"]  # what the planner counts: the budget is sized in it


def _history(door, **q) -> list[dict]:
    return list(reversed(history(door, **q)))


def _recorded(door, event: str, model: str, timeout: float = 60.0) -> dict:
    """The first ``event`` of ``model`` in the history: a load is recorded just after its first request is served,
    so it is awaited here (the server's state, read over HTTP)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in _history(door, event=event) if e["model"] == model]
        if found or time.monotonic() > deadline:
            assert found, f"no {event} of {model} in the history within {timeout} s"
            return found[0]
        time.sleep(0.05)


def test_openai_sdk_chats_with_an_hf_model_and_a_walkless_load_is_refused(tmp_path: Path, mixed_dir: Path) -> None:
    from openai import OpenAI

    with front_door(tmp_path, "--models-dir", str(mixed_dir)) as door:
        client = OpenAI(base_url=door.base_url + "/v1", api_key="none", max_retries=0, timeout=300)
        msgs = [{"role": "user", "content": "tell me a story"}]
        r = client.chat.completions.create(model=HF, messages=msgs, max_tokens=5)  # type: ignore[arg-type]
        assert r.choices[0].message.content and r.usage is not None and r.usage.completion_tokens == 5
        pieces = [c.choices[0].delta.content for c in client.chat.completions.create(
            model=HF, messages=msgs, max_tokens=5, stream=True) if c.choices and c.choices[0].delta.content]  # type: ignore
        assert "".join(pieces) == r.choices[0].message.content  # greedy: the stream spells the same answer
        load = _recorded(door, "load", HF)
        assert load["engine"] == "transformers"

        bad = httpx.post(door.base_url + "/v1/chat/completions", timeout=300,
                         json={"model": "hf-empty", "messages": msgs, "max_tokens": 2})
        assert bad.status_code == 502 and "no-weights" in bad.json()["error"]["message"]
        fail = _recorded(door, "fail", "hf-empty")
        assert "no-weights" in fail["reason"]
        assert "hf-empty" not in {v["key"] for v in httpx.get(door.base_url + "/v1/models/residents").json()["data"]}


def test_hf_and_gguf_seats_swap_each_other_under_one_budget(tmp_path: Path, mixed_dir: Path) -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    # first, each seat's measured size (and the transformers seat's own overhead, learned once)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with front_door(tmp_path / "a", "--models-dir", str(mixed_dir)) as door:
        sizes = {}
        for key in (HF, "med"):
            assert httpx.post(door.base_url + "/v1/chat/completions", json={"model": key, **chat},
                              timeout=300).status_code == 200
            _recorded(door, "load", key)
            sizes[key] = _host(door, key)
    limit = int(max(sizes.values()) * 1.25)
    assert limit < sum(sizes.values()), sizes  # one at a time
    with front_door(tmp_path / "b", "--models-dir", str(mixed_dir), "--ram-limit", str(limit),
                    "--data-dir", str(tmp_path / "a" / "data")) as door:
        for key in (HF, "med", HF):
            assert httpx.post(door.base_url + "/v1/chat/completions", json={"model": key, **chat},
                              timeout=300).status_code == 200
        _recorded(door, "evict", "med")
        evicts = _history(door, event="evict")
        leaks = _history(door, event="leak")
        told = [(e["event"], e["model"], e["reason"]) for e in _history(door)]  # what happened, should it fail
    assert [(e["model"], e["engine"]) for e in evicts[-2:]] == [(HF, "transformers"), ("med", "llama-server")], told
    assert "evicted for med" in evicts[-2]["reason"] and f"evicted for {HF}" in evicts[-1]["reason"]
    assert all(e["freed_gb"] is not None and e["freed_gb"] > 0 for e in evicts[-2:])
    assert leaks == []  # clean teardowns: nothing named ...
    assert evicts[-2]["details"]["leak_check"] == "clean"  # ... because the leak breaker ran and found nothing
    assert "leak_check" not in evicts[-1]["details"]  # llama-server has no leak breaker
    print(f"hf/gguf swap: sizes {json.dumps(sizes)}, limit {limit}")
