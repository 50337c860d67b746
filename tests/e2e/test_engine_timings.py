"""The engine's own timings reach the history: a real `fitevict serve`, a real llama-server seat, a few answers, then
an unload; the unload's history row carries the sums of exactly the timings the answers carried, labelled measured."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from _frontdoor import front_door
from fitevict.zoo import write_zoo

pytestmark = pytest.mark.e2e


def test_history_sums_the_timings_the_answers_carried(tmp_path: Path, llama_server: Path) -> None:
    models = tmp_path / "models"
    write_zoo(models, only=["llama-gqa"])
    with front_door(tmp_path, "--models-dir", str(models)) as fd, httpx.Client(base_url=fd.base_url,
                                                                             timeout=120) as c:
        seen = []
        for i, n in enumerate((3, 5, 8)):
            r = c.post("/v1/chat/completions", json={"model": "llama-gqa", "max_tokens": n, "ignore_eos": True,
                                                     "messages": [{"role": "user", "content": f"count {i} " * (i + 1)}]})
            assert r.status_code == 200, r.text
            seen.append(r.json()["timings"])
        stream = c.post("/v1/completions", json={"model": "llama-gqa", "prompt": "once", "max_tokens": 4,
                                                 "stream": True, "ignore_eos": True})
        assert stream.status_code == 200
        last = [line for line in stream.text.splitlines() if '"timings"' in line][-1]
        seen.append(httpx.Response(200, content=last.removeprefix("data: ")).json()["timings"])
        # live: the resident view sums them already
        live = next(v for v in c.get("/v1/models/residents").json()["data"] if v["key"] == "llama-gqa")
        assert live["engine_timings"]["answers"] == 4
        assert c.post("/v1/models/llama-gqa/unload").json()["unloaded"] is True
        rows = c.get("/v1/models/history", params={"model": "llama-gqa", "event": "unload"}).json()["data"]
        dash = c.get("/dashboard/live")
    assert len(rows) == 1
    t = rows[0]["engine_timings"]
    assert t["answers"] == 4
    assert t["prompt_n"] == sum(s["prompt_n"] for s in seen)
    assert t["predicted_n"] == sum(s["predicted_n"] for s in seen) == 3 + 5 + 8 + 4
    assert t["prompt_ms"] == pytest.approx(sum(s["prompt_ms"] for s in seen), abs=1e-3)
    assert t["predicted_ms"] == pytest.approx(sum(s["predicted_ms"] for s in seen), abs=1e-3)
    assert t["predicted_per_second"] == pytest.approx(t["predicted_n"] / t["predicted_ms"] * 1000, abs=0.01)
    assert t["prompt_per_second"] == pytest.approx(t["prompt_n"] / t["prompt_ms"] * 1000, abs=0.01)
    assert all(src.startswith("measured") for src in t["sources"].values()), t["sources"]
    assert dash.status_code == 200 and f"{t['answers']} answers: gen {t['predicted_per_second']:g} tok/s" in dash.text
    # `fitevict history` says what the stopped seat served, from the same row
    from rich.console import Console

    from fitevict.cli.admin import history_table

    con = Console(record=True, width=200)
    con.print(history_table(rows))
    assert f"served 4, {t['predicted_per_second']:g} tok/s" in con.export_text()
