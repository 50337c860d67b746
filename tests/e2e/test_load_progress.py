"""Load progress end to end: `fitevict load` against a real fitevict, the admin SSE stream, and progress comments
before the first chunk of a streamed OpenAI request, under a RAM budget that holds one medium model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import openai
import pytest

from _frontdoor import front_door, history
from _models import medium_host_bytes, swap_models
from fitevict.cli.progress import sse_events

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def door(zoo: dict, tmp_path_factory: pytest.TempPathFactory):
    models = swap_models(zoo, tmp_path_factory.mktemp("lp-models"))
    tmp = tmp_path_factory.mktemp("lp-door")
    with front_door(tmp, "--models-dir", str(models), "--ram-limit", str(int(1.5 * medium_host_bytes(models)))) as fd:
        yield fd


def fitevict(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "100", "FITEVICT_CONFIG": ""}
    return subprocess.run([sys.executable, "-m", "fitevict.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_cli_load_shows_the_phases_in_order(door) -> None:
    first = fitevict("load", "med-a", "--url", door.base_url)
    assert first.returncode == 0, first.stderr
    assert "plan: " in first.stdout and "engine started: llama-server pid" in first.stdout
    assert "ready: ready in" in first.stdout and "med-a: ready" in first.stdout
    second = fitevict("load", "med-b", "--url", door.base_url)
    assert second.returncode == 0, second.stderr
    out = second.stdout
    # med-a is within its minimum residency (1 s) if this comes quickly: the plan then waits for it, and evicts it
    # when that has passed; later the plan evicts it at once. Either way the phases come in this order:
    evicting = "will evict med-a" if "will evict med-a" in out else "it fits once med-a"
    order = [out.index(s) for s in ("plan: ", evicting, "evicted med-a: freed", "engine started:", "ready: ready in")]
    assert order == sorted(order), out
    freed = history(door, model="med-a", event="evict")[0]["bytes"]["freed"]
    from fitevict.units import format_size

    assert f"evicted med-a: freed {format_size(freed)}" in out  # the figure the history recorded
    again = fitevict("load", "med-b", "--url", door.base_url)
    assert again.returncode == 0 and "already resident" in again.stdout and "engine started" not in again.stdout


def test_cli_load_of_an_unknown_model_fails_with_the_servers_words(door) -> None:
    r = fitevict("load", "med-z", "--url", door.base_url)
    assert r.returncode == 1 and "404" in r.stderr and "med-a" in r.stderr  # close matches named


def test_admin_stream_reports_measured_weights_against_the_prediction(door) -> None:
    with httpx.stream("POST", door.base_url + "/v1/models/med-c/load", params={"stream": "true"}, timeout=300) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(r.iter_lines()))
    kinds = [d.get("phase", e) for e, d in events]
    assert kinds[0] == "plan" and kinds[-2:] == ["ready", "done"] and "start" in kinds
    assert kinds.index("evict") < kinds.index("start")  # the room is made before the engine starts
    weights = [d for _e, d in events if d.get("phase") == "weights"]
    assert weights and all(w["resident_source"].startswith("measured") and w["predicted_bytes"] > 0 for w in weights)
    ready = events[-2][1]
    assert ready["host_source"] == "planned" and ready["load_seconds"] > 0 and ready["hit"] is False
    assert events[-1][1]["resident"]["key"] == "med-c"


def test_streamed_openai_request_gets_progress_comments_only_when_asked(door) -> None:
    body = {"model": "med-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    with httpx.stream("POST", door.base_url + "/v1/chat/completions", json=body, timeout=300,
                      headers={"x-fitevict-progress": "1"}) as r:
        lines = [line for line in r.iter_lines() if line]
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data:"))
    comments = [json.loads(line.split(" ", 2)[2]) for line in lines[:first_data]]
    assert all(line.startswith(": fitevict-progress ") for line in lines[:first_data])
    phases = [c["phase"] for c in comments]
    assert phases[0] == "plan" and "start" in phases and phases[-1] == "ready"  # med-a was cold: a load
    assert lines[-1] == "data: [DONE]" and not any(line.startswith(":") for line in lines[first_data:])
    # the official client reads such a stream as usual
    c = openai.OpenAI(base_url=door.base_url + "/v1", api_key="unused", max_retries=0,
                      default_headers={"x-fitevict-progress": "1"})
    chunks = list(c.chat.completions.create(model="med-b", messages=[{"role": "user", "content": "x"}],
                                            max_tokens=2, stream=True))
    assert chunks and any(ch.choices and ch.choices[0].finish_reason for ch in chunks)
    with httpx.stream("POST", door.base_url + "/v1/chat/completions", json=body, timeout=300) as r:
        assert not any(line.startswith(":") for line in r.iter_lines())


def test_a_refused_load_under_progress_is_an_error_event(door) -> None:
    body = {"model": "med-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "stream": True,
            "fitevict": {"ctx": 0, "parallel": 64}}
    with httpx.stream("POST", door.base_url + "/v1/chat/completions", json=body, timeout=300,
                      headers={"x-fitevict-progress": "1"}) as r:
        data = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    assert data and data[-1]["error"]["status"] == 507 and data[-1]["error"]["code"] == "does_not_fit"
