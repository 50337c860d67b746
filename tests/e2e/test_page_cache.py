"""The cached rung, measured through a real ``fitevict serve`` and llama-server: a model's file in the page cache is
read with mincore and shown, labelled measured and reclaimable, in the plan dry run and in the residents (``ps``):
none of it after its pages are dropped, all of it once a seat has read it, and still all of it once the seat is
stopped. The budget never counts it."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from _frontdoor import front_door
from fitevict.host.pagecache import COUNTED, SOURCE, drop

pytestmark = pytest.mark.e2e


def _cached(base: str) -> dict:
    r = httpx.post(base + "/v1/models/gqa/plan", json={}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["page_cache"]


def test_a_models_file_in_the_page_cache_is_measured_and_never_budgeted(zoo: dict, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    f = models / "gqa.gguf"
    shutil.copyfile(zoo["llama-gqa"].path, f)
    size = f.stat().st_size
    with front_door(tmp_path, "--models-dir", str(models)) as door:
        base = door.base_url
        _cached(base)  # its price read once (the dry run reads the file's header)
        drop(f)
        cold = _cached(base)
        assert (cold["file_bytes"], cold["source"], cold["counted"]) == (size, SOURCE, COUNTED)
        assert cold["resident_bytes"] < size // 4  # the header read for the plan, at most

        r = httpx.post(base + "/v1/chat/completions", timeout=300, json={
            "model": "gqa", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        assert r.status_code == 200, r.text
        (seat,) = httpx.get(base + "/v1/models/residents", timeout=30).json()["data"]
        assert seat["page_cache"]["resident_bytes"] == size and seat["page_cache"]["source"] == SOURCE

        assert httpx.post(base + "/v1/models/gqa/unload", timeout=120).json()["unloaded"] is True
        warm = _cached(base)  # stopped, its pages kept: the cached rung
        assert warm["resident_bytes"] == size and warm["fraction"] == 1.0
