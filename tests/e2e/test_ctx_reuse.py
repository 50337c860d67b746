"""No reload for a smaller context, through a real ``fitevict serve`` and llama-server: a seat loaded at ctx 2048
serves a request for 1024 (the OpenAI contract's ``ctx`` or Ollama's ``num_ctx``) as it is, with the same process;
a request for 4096 reloads it, and its load report, in the answer's header and in the history, says why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from _frontdoor import front_door, history

pytestmark = pytest.mark.e2e

RELOADED = "reloaded for ctx: resident 2048 < asked 4096"


def _openai(base: str, ctx: int, request_id: str) -> httpx.Response:
    r = httpx.post(base + "/v1/chat/completions", timeout=300, headers={"x-request-id": request_id}, json={
        "model": "gqa", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "fitevict": {"ctx": ctx}})
    assert r.status_code == 200, r.text
    return r


def _resident(base: str) -> dict:
    (seat,) = httpx.get(base + "/v1/models/residents", timeout=30).json()["data"]
    return seat


def test_a_smaller_context_is_served_by_the_seat_and_a_larger_one_reloads_saying_why(zoo: dict,
                                                                                     tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "gqa.gguf")
    with front_door(tmp_path, "--models-dir", str(models)) as door:
        base = door.base_url
        first = _openai(base, 2048, "r-2048")
        assert json.loads(first.headers["x-fitevict-load-report"])["base_hit"] is False
        seat = _resident(base)
        assert seat["ctx"] == 2048

        small = httpx.post(base + "/api/chat", timeout=300, json={  # Ollama's num_ctx: the same contract
            "model": "gqa", "messages": [{"role": "user", "content": "hi"}], "stream": False,
            "options": {"num_ctx": 1024, "num_predict": 1}})
        assert small.status_code == 200, small.text
        smaller = _openai(base, 1024, "r-1024")
        report = json.loads(smaller.headers["x-fitevict-load-report"])
        assert report["base_hit"] is True and report["reloaded_for"] is None
        again = _resident(base)
        assert (again["pid"], again["ctx"]) == (seat["pid"], 2048)
        assert len(history(door, model="gqa", event="load")) == 1

        larger = _openai(base, 4096, "r-4096")
        report = json.loads(larger.headers["x-fitevict-load-report"])
        assert report["base_hit"] is False and report["reloaded_for"] == RELOADED
        assert any(n.startswith(RELOADED) for n in report["notes"])
        now = _resident(base)
        assert now["ctx"] == 4096 and now["pid"] != seat["pid"]
        stop = history(door, model="gqa", event="unload")[0]
        assert stop["request_id"] == "r-4096" and f"({RELOADED})" in stop["reason"]
        load = history(door, model="gqa", event="load")[0]  # newest first
        assert load["request_id"] == "r-4096" and load["details"]["load_report"]["reloaded_for"] == RELOADED
