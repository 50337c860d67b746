"""policy.shrink_ctx through a real ``fitevict serve`` and llama-server: a contract whose context does not fit the
budget loads at the largest context that does when the request fits it, says so in a header, the load report and
the dry run; a request that may need more, or one with the policy off, is refused as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from _frontdoor import front_door

pytestmark = pytest.mark.e2e

FULL, HALF = 8192, 4096  # the medium model's training context, and a context that fits


def _plan(base: str, ctx: int) -> dict:
    r = httpx.post(base + "/v1/models/medium/plan", json={"fitevict": {"ctx": ctx, "parallel": 1}}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _chat(base: str, **extra) -> httpx.Response:
    return httpx.post(base + "/v1/chat/completions", timeout=300, json={
        "model": "medium", "messages": [{"role": "user", "content": "hi"}],
        "fitevict": {"ctx": FULL, "parallel": 1}, **extra})


def test_a_context_that_fits(zoo: dict, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-medium"].path, models / "medium.gguf")
    for sub in "abc":
        (tmp_path / sub).mkdir()
    with front_door(tmp_path / "a", "--models-dir", str(models)) as door:  # what each context needs, as priced here
        need = {ctx: sum(_plan(door.base_url, ctx)["plan"]["needed_bytes"].values()) for ctx in (FULL, HALF)}
    assert need[FULL] > need[HALF]
    limit = str((need[FULL] + need[HALF]) // 2)  # the full context does not fit, half of it does
    env = {"FITEVICT_SHRINK_CTX": "true"}
    with front_door(tmp_path / "b", "--models-dir", str(models), "--ram-limit", limit, env=env) as door:
        base = door.base_url
        dry = _plan(base, FULL)
        assert dry["plan"]["action"] == "refuse" and dry["shrink_ctx"]["loaded_ctx"] >= HALF
        loaded = dry["shrink_ctx"]["loaded_ctx"]
        assert "policy.shrink_ctx" in dry["shrink_ctx"]["note"]

        unbounded = _chat(base)  # no max_tokens, no default: the answer may need the whole context
        assert unbounded.status_code == 507

        too_long = _chat(base, max_tokens=loaded)  # prompt + max_tokens beyond the context that fits
        assert too_long.status_code == 507

        r = _chat(base, max_tokens=8)
        assert r.status_code == 200, r.text
        assert r.headers["x-fitevict-ctx-shrunk"] == f"{FULL}->{loaded}"
        report = json.loads(r.headers["x-fitevict-load-report"])
        assert any(n.startswith("ctx shrunk") for n in report["notes"])
        (resident,) = httpx.get(base + "/v1/models/residents", timeout=30).json()["data"]
        assert resident["ctx"] == loaded

        again = _chat(base, max_tokens=8)  # the same request again: served by the shrunk seat, nothing loaded
        assert again.status_code == 200 and again.headers["x-fitevict-ctx-shrunk"] == f"{FULL}->{loaded}"

    with front_door(tmp_path / "c", "--models-dir", str(models), "--ram-limit", limit) as door:  # policy off
        assert _chat(door.base_url, max_tokens=8).status_code == 507
        assert "shrink_ctx" not in _plan(door.base_url, FULL)
