"""Memory pressure from another program, with real processes: a hog that allocates and touches memory makes a real
``fitevict serve`` stop its idle seat (not the one serving a request), answer a load that would not fit with 503
and the reason, record a ``pressure`` event with the figures, and load normally again once the hog exits."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from _frontdoor import poll, front_door, history
from _models import swap_models

from fitevict.host.procmem import read_meminfo
from fitevict.units import GiB

pytestmark = pytest.mark.e2e

ROOM = 1 * GiB  # what fitevict may fill when the test starts: free memory above the reserve
HOG = 2 * GiB  # more than the room: free memory falls below the reserve

HOG_CODE = """
import mmap, sys, time
n = int(sys.argv[1])
print(time.time(), flush=True)
m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)  # every page touched now
print(time.time(), flush=True)
sys.stdin.read()
"""


def _residents(base: str) -> dict[str, dict]:
    return {r["key"]: r for r in httpx.get(base + "/v1/models/residents", timeout=30).json()["data"]}


def _chat(base: str, model: str, max_tokens: int = 2, timeout: float = 300, **extra) -> httpx.Response:
    return httpx.post(base + "/v1/chat/completions", timeout=timeout, json={
        "model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}], **extra})


@pytest.mark.timeout(1500)  # its long request runs for minutes on 2 shared cores (see long_request)
def test_a_hog_makes_fitevict_give_back_its_idle_seat(zoo: dict, tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    models = swap_models(zoo, tmp_path / "models")
    reserve = read_meminfo().available_bytes - ROOM
    cfg = tmp_path / "f.toml"
    cfg.write_text(f"[budget]\nram_reserve = {reserve}\npressure_margin = \"128MiB\"\n[server]\nsample_seconds = 0.2\n"
                   "[policy]\nmin_residency_seconds = 0\nidle_unload_seconds = 0\n")
    with front_door(tmp_path, "--models-dir", str(models), env={"FITEVICT_CONFIG": str(cfg)}) as door:
        base = door.base_url
        assert _chat(base, "llama-gqa").status_code == 200
        busy: dict = {}

        def long_request() -> None:  # in flight for many seconds: about 20 s of generation on this medium model, on
            # a quiet machine; minutes on 2 cores shared with other work, so its client waits long (it must not be cut)
            busy["response"] = _chat(base, "med-a", 3000, timeout=1200, ignore_eos=True, fitevict={"ctx": 4096})

        t = threading.Thread(target=long_request)
        t.start()
        poll(lambda: _residents(base).get("med-a", {}).get("in_flight") == 1, "a request in flight on med-a", 300)
        hog = subprocess.Popen([sys.executable, "-c", HOG_CODE, str(HOG)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
        try:
            started = float(hog.stdout.readline())
            grown = float(hog.stdout.readline())
            ev = poll(lambda: history(door, event="pressure"), "a pressure event", 120)[0]
            assert [s["model"] for s in ev["details"]["stopped"]] == ["llama-gqa"]  # the idle seat, not the one in use
            assert "llama-gqa" not in _residents(base) and _residents(base)["med-a"]["in_flight"] == 1
            during = _chat(base, "llama-gqa")
            assert during.status_code == 503 and during.headers.get("retry-after")
            assert "memory pressure" in during.json()["error"]["message"]
            # the same wait in each API's shape: Anthropic's 529 overloaded_error, the Responses API's and Ollama's 503
            claude = httpx.post(base + "/v1/messages", timeout=300, json={
                "model": "llama-gqa", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
            assert claude.status_code == 529 and claude.headers.get("retry-after"), claude.text
            assert claude.json()["type"] == "error" and claude.json()["error"]["type"] == "overloaded_error"
            assert "memory pressure" in claude.json()["error"]["message"]
            responses = httpx.post(base + "/v1/responses", timeout=300, json={"model": "llama-gqa", "input": "hi"})
            assert responses.status_code == 503 and responses.headers.get("retry-after"), responses.text
            assert responses.json()["error"]["type"] == "server_busy"
            olla = httpx.post(base + "/api/chat", timeout=300, json={
                "model": "llama-gqa", "stream": False, "messages": [{"role": "user", "content": "hi"}]})
            assert olla.status_code == 503 and olla.headers.get("retry-after"), olla.text
            assert "memory pressure" in olla.json()["error"]
            host = next(d for d in ev["details"]["devices"] if d["device"] == "CPU")
            assert host["under"] and host["free_bytes"] < host["reserve_bytes"]
            assert host["others_grew_bytes"] is not None and host["others_grew_bytes"] > ROOM // 2
            assert "med-a" in ev["details"]["kept_in_use"]
            assert any(p["pid"] == hog.pid for p in ev["details"]["largest_others"])
            # the stop's release is verified (or not, with why) in its own evict event, which may come later
            evicts = poll(lambda: history(door, event="evict"), "the evict event", 120)
            assert [e["model"] for e in evicts] == ["llama-gqa"] and "memory pressure" in evicts[0]["reason"]
            print(f"pressure: the hog grew {HOG} B in {grown - started:.2f} s; the decision came "
                  f"{ev['details']['detected_at'] - grown:+.2f} s after it had grown; "
                  f"{ev['time'] - grown:.2f} s to the stop's end; freed {ev['bytes']['freed']} B; {ev['reason']}; "
                  f"release: {evicts[0]['details'].get('release_note')}; stopped {ev['details']['stopped']}; {ev['details']['stopped_note']}")
        finally:
            hog.stdin.close()
            hog.wait(30)
        t.join(1200)
        assert busy["response"].status_code == 200  # the request in flight was never cut
        poll(lambda: _chat(base, "llama-gqa").status_code == 200, "llama-gqa loading again after the hog", 60)
        loads = [e["model"] for e in history(door, event="load")]
        assert loads.count("llama-gqa") == 2
        metrics = httpx.get(base + "/metrics", timeout=30).text
        assert 'fitevict_pressure_events_total' in metrics
