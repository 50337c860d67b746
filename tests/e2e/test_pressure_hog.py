"""Memory pressure from another program, with real processes: a hog that allocates and touches memory makes a real
``fitevict serve`` stop its idle seat (not the one serving a request), answer a load that would not fit with 503
and the reason, record a ``pressure`` event with the figures, and load normally again once the hog exits.

The request in use is a stream held open by the test: it stays in flight for as long as the pressure lasts, is seen
still in flight and still streaming once the hog has exited and loads have resumed, and then the client hangs up
(the door counts it 499), so the test does not wait for thousands of tokens to be generated."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from _frontdoor import history, poll
from _pressure import HOG_CODE, HeldStream, chat, metric, pressure_door, residents

from fitevict.units import GiB

pytestmark = pytest.mark.e2e

ROOM = 1 * GiB  # what fitevict may fill when the test starts: free memory above the reserve
HOG = 2 * GiB  # more than the room: free memory falls below the reserve

def _assert_pressure_waits(base: str) -> None:
    """A load of the stopped seat's model is refused while the pressure lasts, in each API's shape: OpenAI's 503,
    Anthropic's 529 overloaded_error, the Responses API's and Ollama's 503, each with Retry-After and the reason."""
    during = chat(base, "llama-gqa")
    assert during.status_code == 503 and during.headers.get("retry-after"), during.text
    assert "memory pressure" in during.json()["error"]["message"]
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


@pytest.mark.timeout(900)  # a minute alone; minutes on 2 cores shared with other work
def test_a_hog_makes_fitevict_give_back_its_idle_seat(zoo: dict, tmp_path: Path) -> None:
    # a stop's release hidden by the hog's growth is recorded "not released" after 5 s, not 30
    with pressure_door(zoo, tmp_path, ROOM, budget="pressure_margin = \"128MiB\"\n",
                       engine="release_timeout_seconds = 5\n") as (door, _):
        base = door.base_url
        assert chat(base, "llama-gqa").status_code == 200
        busy = HeldStream(base, "med-a")
        assert busy.serving.wait(300) and busy.alive() is None, busy.alive()
        assert busy.status == 200
        busy.assert_on_its_seat()
        hog = subprocess.Popen([sys.executable, "-c", HOG_CODE, str(HOG)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
        try:
            started = float(hog.stdout.readline())
            grown = float(hog.stdout.readline())
            ev = poll(lambda: history(door, event="pressure"), "a pressure event", 120)[0]
            assert [s["model"] for s in ev["details"]["stopped"]] == ["llama-gqa"]  # the idle seat, not the one in use
            assert "llama-gqa" not in residents(base)
            busy.assert_on_its_seat()
            _assert_pressure_waits(base)
            assert metric(base, "fitevict_under_pressure", "device") == {"CPU": 1.0}
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
        # calm at a tick after the hog exits (a load asked for before that waits for that tick, which places it)
        poll(lambda: metric(base, "fitevict_under_pressure", "device") == {"CPU": 0.0}, "calm after the hog", 60)
        poll(lambda: chat(base, "llama-gqa").status_code == 200, "llama-gqa loading again after the hog", 60)
        # the request in flight was never cut: still on its seat and streaming after the pressure has passed
        busy.assert_on_its_seat()
        busy.let_go()  # one more token, then the client hangs up
        ended = poll(lambda: metric(base, "fitevict_requests_total", "status", model="med-a"), "med-a's count", 60)
        assert ended == {"499": 1.0}, ended  # ended by the client's hang-up: not cut, not lost
        loads = [e["model"] for e in history(door, event="load")]
        assert loads.count("llama-gqa") == 2
        assert [e["event"] for e in history(door) if e.get("model") == "med-a"] == ["load"]  # never stopped
        metrics = httpx.get(base + "/metrics", timeout=30).text
        assert 'fitevict_pressure_events_total' in metrics
