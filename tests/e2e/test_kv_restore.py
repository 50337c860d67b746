"""A kept prompt's restore counts only when the next answer's own timings show the restored prefix was not processed
again, with a real ``fitevict serve`` and a real llama-server (the engine can report a restore done and still process
the whole prompt: llama.cpp #26676).

The seat is unloaded for idleness (its long prompt saved), then loaded again twice for requests sharing that prompt:
- a request the engine may answer from its cache: the ``kv-restore`` event says ``effective`` with the engine's
  ``cache_n`` covering the restored prefix;
- a request with ``cache_prompt: false`` (the engine is told not to reuse its cache): the restore reports success,
  the engine processes every prompt token again, and the event says "not effective" with the restored tokens against
  the prompt tokens the engine processed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from _frontdoor import front_door, history, poll

pytestmark = pytest.mark.e2e

SYSTEM = " ".join(f"Rule {i}: answer briefly and cite the rule number." for i in range(30))  # ~600 tokens
MIN_TOKENS = 256


def _chat(base: str, question: str, **extra) -> dict:
    r = httpx.post(base + "/v1/chat/completions", timeout=300, json={
        "model": "kept", "max_tokens": 2, "messages": [{"role": "system", "content": SYSTEM},
                                                      {"role": "user", "content": question}], **extra})
    assert r.status_code == 200, r.text
    return r.json()


def _unloaded(door, n: int) -> dict:
    """The ``n``-th idle-unload of the seat, its prompt saved."""
    got = poll(lambda: (lambda e: e if len(e) >= n else None)(history(door, event="idle-unload")),
               f"idle-unload {n}", 60)
    assert got[0]["details"]["kv_saved"], got[0]["details"]
    return got[0]


def test_a_restore_counts_only_when_the_engine_kept_the_prefix(zoo: dict, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "kept.gguf")
    cfg = tmp_path / "f.toml"
    cfg.write_text(f"[policy]\nidle_unload_seconds = 1\nmin_residency_seconds = 0\n"
                   f"prompt_cache_min_tokens = {MIN_TOKENS}\n")
    with front_door(tmp_path, "--models-dir", str(models), env={"FITEVICT_CONFIG": str(cfg)}) as door:
        base = door.base_url
        cold = _chat(base, "What is rule 3?")["timings"]
        assert cold["prompt_n"] > MIN_TOKENS
        _unloaded(door, 1)

        warm = _chat(base, "What is rule 7?")["timings"]  # loads again, restores the kept prompt
        (kept,) = poll(lambda: history(door, event="kv-restore"), "the first kv-restore", 60)
        d = kept["details"]
        print(f"kept: {kept['reason']}; timings {warm}")
        assert d["effective"] is True and "not effective" not in kept["reason"]
        assert d["engine_prompt_n"] == warm["prompt_n"] and d["engine_cache_n"] == warm["cache_n"]
        assert warm["cache_n"] >= d["shared_tokens"] - 1 > MIN_TOKENS // 2
        assert d["reprocessed_tokens"] <= 1
        _unloaded(door, 2)

        again = _chat(base, "What is rule 9?", cache_prompt=False)["timings"]  # restored, then not used
        lost = poll(lambda: (lambda e: e if len(e) == 2 else None)(history(door, event="kv-restore")),
                    "the second kv-restore", 60)[0]
        d = lost["details"]
        print(f"lost: {lost['reason']}; timings {again}")
        assert d["kv_restored_tokens"] > MIN_TOKENS and d["shared_tokens"] > MIN_TOKENS // 2
        assert again["prompt_n"] == d["prompt_tokens"]  # the engine processed the whole prompt again
        assert d["effective"] is False and "not effective" in lost["reason"] and "not effective" in d["effect"]
        assert d["engine_prompt_n"] == again["prompt_n"] and d["reprocessed_tokens"] >= d["shared_tokens"] - 1
