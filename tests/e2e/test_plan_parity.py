"""The offline ``fitevict plan`` and a running server's plan are one computation: after a seat of the model was
filled to its context and unloaded (so the server has stored what it measured), both plans of the same model and
configuration, read from the same data directory, carry the same verdict, the same figures and the same sources."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from _frontdoor import front_door

pytestmark = pytest.mark.e2e

MODEL = "llama-gqa"
CTX = 512
MAX_TOKENS = 32
COMPARED = ("action", "needed_bytes", "placement", "evict", "reason", "host_mapped_bytes", "host_committed_bytes",
            "footprint", "config")


def offline_plan(models_dir: Path, data_dir: Path) -> dict:
    env = {**os.environ, "FITEVICT_CONFIG": "", "FITEVICT_DATA_DIR": str(data_dir)}
    out = subprocess.run([sys.executable, "-m", "fitevict.cli", "plan", MODEL, "--models-dir", str(models_dir),
                          "--ctx", str(CTX), "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def fill(base: str) -> None:
    """One request whose prompt and answer fill the seat's one slot to the end of its context."""
    words = httpx.post(base + "/tokenize", json={"model": MODEL, "content": "The quick brown fox jumps. " * 400,
                                                  "fitevict": {"ctx": CTX}}, timeout=300)
    words.raise_for_status()
    prompt = words.json()["tokens"][: CTX - MAX_TOKENS - 1]
    r = httpx.post(base + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS,
                                                   "ignore_eos": True, "fitevict": {"ctx": CTX}}, timeout=600)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] + r.json()["usage"]["completion_tokens"] >= CTX - 1


def test_the_offline_plan_is_the_servers_plan_after_a_filled_seat(models_dir: Path, tmp_path: Path) -> None:
    with front_door(tmp_path, "--models-dir", str(models_dir)) as door:
        fill(door.base_url)
        r = httpx.post(f"{door.base_url}/v1/models/{MODEL}/unload", timeout=120)
        assert r.status_code == 200, r.text
        r = httpx.post(f"{door.base_url}/v1/models/{MODEL}/plan", json={"ctx": CTX}, timeout=300)
        assert r.status_code == 200, r.text
        server = r.json()["plan"]
    offline = offline_plan(models_dir, door.data_dir)
    # what the filled seat taught the server reached the offline plan: its buffers priced by the stored measurement
    sources = {s for d in offline["footprint"]["devices"] for s in d["sources"].values()}
    assert "stored-measurement" in sources, offline["footprint"]
    for k in COMPARED:
        assert offline[k] == server[k], (k, offline[k], server[k])
