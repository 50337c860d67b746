"""The prompt cache kept across a swap, with real llama-server seats: a long prompt is saved when its seat is
evicted, restored when the model loads again for a request that shares it, and never restored into a seat of
another configuration."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from _frontdoor import front_door, history, poll
from _models import medium_host_bytes, swap_models

pytestmark = pytest.mark.e2e

SYSTEM = " ".join(f"Rule {i}: answer briefly and cite the rule number." for i in range(85))  # ~2,000 tokens


def _chat(base: str, model: str, question: str, **contract) -> httpx.Response:
    r = httpx.post(base + "/v1/chat/completions", timeout=600, json={
        "model": model, "max_tokens": 4, "messages": [{"role": "system", "content": SYSTEM},
                                                      {"role": "user", "content": question}],
        **({"fitevict": contract} if contract else {})})
    assert r.status_code == 200, r.text
    return r


def test_a_long_prompt_survives_an_eviction(zoo: dict, tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    models = swap_models(zoo, tmp_path / "models")
    limit = str(int(1.5 * medium_host_bytes(models)))  # one medium at a time: the second evicts the first
    with front_door(tmp_path, "--models-dir", str(models), "--ram-limit", limit) as door:
        base = door.base_url
        cold = _chat(base, "med-a", "What is rule 3?").json()["timings"]
        assert cold["prompt_n"] > 1024
        swap = _chat(base, "med-b", "What is rule 4?")  # evicts med-a: its slot is saved first
        evict = next(e for e in history(door, event="evict") if e["model"] == "med-a")
        saved = evict["details"]["kv_saved"]
        assert len(saved) == 1 and saved[0]["tokens"] >= cold["prompt_n"]
        # the save's seconds in the stop hold the engine's own write, and lie within the request that caused them
        assert 0 < saved[0]["save_seconds"] <= evict["details"]["kv_save_seconds"] < swap.elapsed.total_seconds()
        files = sorted(p.name for p in (door.data_dir / "kv").iterdir())
        assert files == sorted([saved[0]["file"], saved[0]["file"] + ".json"])

        warm = _chat(base, "med-a", "What is rule 7?")  # loads med-a again (evicting med-b) and restores
        report = json.loads(warm.headers["x-fitevict-load-report"])
        kv = report["kv_restore"]
        assert kv["kv_restored_tokens"] == saved[0]["tokens"]
        assert kv["shared_tokens"] > 1024 and 0 < kv["kv_restore_seconds"] < warm.elapsed.total_seconds()
        assert kv["prefill_seconds_saved"] is not None and "estimate" in kv["sources"]["prefill_seconds_saved"]
        timings = warm.json()["timings"]
        assert timings["cache_n"] >= kv["shared_tokens"] - 1  # the engine reused what was restored
        assert timings["prompt_n"] < cold["prompt_n"] - 1000
        # the first swap restores med-a only; its event follows the answer (judged by the answer's timings)
        (restore,) = poll(lambda: history(door, event="kv-restore"), "the kv-restore event", 60)
        assert restore["details"]["effective"] is True
        assert restore["model"] == "med-a" and restore["details"]["kv_restored_tokens"] == kv["kv_restored_tokens"]
        print(f"prompt keep: cold prefill {cold['prompt_n']} tokens in {cold['prompt_ms']:.0f} ms; after the swap "
              f"{timings['prompt_n']} tokens in {timings['prompt_ms']:.0f} ms, {kv['kv_restored_tokens']} restored "
              f"in {kv['kv_restore_seconds'] * 1000:.0f} ms; the save added {evict['details']['kv_save_seconds']:.3f} s "
              f"to the stop")

        _chat(base, "med-b", "What is rule 5?")  # med-a evicted again: its prompt is saved again (the newer one)
        other = _chat(base, "med-a", "What is rule 9?", ctx=3072)  # another configuration: never restored
        assert json.loads(other.headers["x-fitevict-load-report"])["kv_restore"] is None
        assert other.json()["timings"]["prompt_n"] > 1024
        assert [e["model"] for e in history(door, event="kv-restore")] == ["med-b", "med-a"]  # med-b shares it too
