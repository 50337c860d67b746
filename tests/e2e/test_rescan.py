"""The catalog rescanned while serving: SIGHUP (and the admin route) publish new and removed models."""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest

from _frontdoor import front_door

pytestmark = pytest.mark.e2e


def _ids(url: str) -> set[str]:
    return {m["id"] for m in httpx.get(url + "/v1/models", timeout=30).json()["data"]}


def test_sighup_and_the_admin_route_rescan_the_models_directory(tmp_path: Path, zoo: dict) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "llama-gqa.gguf")
    with front_door(tmp_path, "--models-dir", str(models)) as door:
        assert _ids(door.base_url) >= {"llama-gqa"} and "newcomer" not in _ids(door.base_url)
        shutil.copyfile(zoo["llama-q8_0"].path, models / "newcomer.gguf")
        door.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while "newcomer" not in _ids(door.base_url):  # the rescan runs off the event loop; its result is observable
            assert time.monotonic() < deadline, "SIGHUP did not publish the new model"
            time.sleep(0.05)
        r = httpx.post(door.base_url + "/v1/chat/completions", timeout=300, json={
            "model": "newcomer", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200  # servable at once
        (models / "llama-gqa.gguf").unlink()
        got = httpx.post(door.base_url + "/v1/models/rescan", timeout=60).json()
        assert got["removed"] == ["llama-gqa"] and got["added"] == []
        assert "llama-gqa" not in _ids(door.base_url)
        assert door.proc.poll() is None  # SIGHUP did not stop the server
        log = door.log()
    assert "catalog rescanned" in log and "added newcomer" in log
