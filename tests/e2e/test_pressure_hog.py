"""Memory pressure from another program, with real processes: a hog that allocates and touches memory makes a real
``fitevict serve`` stop its idle seat (not the one serving a request), answer a load that would not fit with 503
and the reason, record a ``pressure`` event with the figures, and load normally again once the hog exits.

The request in use is a stream held open by the test: it stays in flight for as long as the pressure lasts, is seen
still in flight and still streaming once the hog has exited and loads have resumed, and then the client hangs up
(the door counts it 499), so the test does not wait for thousands of tokens to be generated."""

from __future__ import annotations

import json
import re
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


class HeldStream:
    """A streamed chat on ``model`` read in a thread as it comes, kept in flight until :meth:`let_go`: the client
    then reads one more token and hangs up. Its ``max_tokens`` fills the context, so the engine is still generating
    long after the test is done with it (``finished`` says it ran out first)."""

    def __init__(self, base: str, model: str) -> None:
        self.body = {"model": model, "max_tokens": 4000, "stream": True, "ignore_eos": True, "fitevict": {"ctx": 4096},
                     "messages": [{"role": "user", "content": "hi"}]}
        self.base, self.url = base, base + "/v1/chat/completions"
        self.status: int | None = None
        self.tokens = 0  # content chunks read
        self.errors: list[str] = []  # error events or exceptions: the stream was cut
        self.finished = False  # the engine's [DONE] came before the test let go
        self.serving, self.release, self.ended = threading.Event(), threading.Event(), threading.Event()
        self.after_release = 0  # tokens read after let_go
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            with httpx.stream("POST", self.url, json=self.body, timeout=300) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    if self._take(line):
                        return  # leaving the block closes the connection: the client hangs up
        except Exception as e:  # noqa: BLE001 (a cut stream is what the test reports)
            self.errors.append(repr(e))
        finally:
            self.serving.set()  # never leave a waiter hanging on a stream that failed to start
            self.ended.set()

    def _take(self, line: str) -> bool:
        """One SSE line; True when reading stops."""
        if not line.startswith("data: "):
            return False
        if line == "data: [DONE]":
            self.finished = True
            return True
        doc = json.loads(line[len("data: "):])
        if "error" in doc:
            self.errors.append(json.dumps(doc["error"]))
            return True
        self.tokens += 1
        self.serving.set()
        if self.release.is_set():
            self.after_release += 1
        return self.after_release >= 1

    def alive(self) -> str | None:
        """None while the stream still runs; else why it does not."""
        if self.errors:
            return f"the stream was cut after {self.tokens} tokens: {self.errors}"
        if self.finished:
            return (f"the stream ended by itself after {self.tokens} tokens, before the test let go: "
                    f"it must outlast the pressure (raise max_tokens with the ctx)")
        if self.ended.is_set():
            return f"the stream ended after {self.tokens} tokens (status {self.status})"
        return None

    def assert_on_its_seat(self) -> None:
        """The stream runs, and the door counts it in flight on its seat."""
        seat = _residents(self.base).get(self.body["model"])
        assert self.alive() is None and seat is not None and seat["in_flight"] == 1, \
            f"{self.body['model']} is not serving the stream: seat {seat}; stream: {self.alive() or 'running'}"

    def let_go(self, timeout: float = 300) -> None:
        self.release.set()
        assert self.ended.wait(timeout), f"no token came within {timeout} s after {self.tokens}"
        assert self.after_release >= 1 and not self.errors and not self.finished, self.alive()


def _assert_pressure_waits(base: str) -> None:
    """A load of the stopped seat's model is refused while the pressure lasts, in each API's shape: OpenAI's 503,
    Anthropic's 529 overloaded_error, the Responses API's and Ollama's 503, each with Retry-After and the reason."""
    during = _chat(base, "llama-gqa")
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


def _metric(base: str, name: str, key: str, **match: str) -> dict[str, float]:
    """The samples of metric ``name`` in /metrics whose labels include ``match``, summed by label ``key``."""
    text = httpx.get(base + "/metrics", timeout=30).text
    out: dict[str, float] = {}
    for labels, value in re.findall(r'^' + name + r'\{([^}]*)\} (\S+)$', text, re.M):
        got = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if all(got.get(k) == v for k, v in match.items()):
            out[got[key]] = out.get(got[key], 0) + float(value)
    return out


@pytest.mark.timeout(900)  # a minute alone; minutes on 2 cores shared with other work
def test_a_hog_makes_fitevict_give_back_its_idle_seat(zoo: dict, tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    models = swap_models(zoo, tmp_path / "models")
    reserve = read_meminfo().available_bytes - ROOM
    cfg = tmp_path / "f.toml"
    cfg.write_text(f"[budget]\nram_reserve = {reserve}\npressure_margin = \"128MiB\"\n[server]\nsample_seconds = 0.2\n"
                   "[policy]\nmin_residency_seconds = 0\nidle_unload_seconds = 0\n"
                   # one engine thread: the busy seat leaves a core to the door, the hog and this client; a stop's
                   # release hidden by the hog's growth is recorded "not released" after 5 s, not 30
                   "[engine]\nextra_args = [\"-t\", \"1\"]\nrelease_timeout_seconds = 5\n")
    with front_door(tmp_path, "--models-dir", str(models), env={"FITEVICT_CONFIG": str(cfg)}) as door:
        base = door.base_url
        assert _chat(base, "llama-gqa").status_code == 200
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
            assert "llama-gqa" not in _residents(base)
            busy.assert_on_its_seat()
            _assert_pressure_waits(base)
            assert _metric(base, "fitevict_under_pressure", "device") == {"CPU": 1.0}
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
        # calm at a tick after the hog exits (a load asked for before that may wait its turn behind med-a)
        poll(lambda: _metric(base, "fitevict_under_pressure", "device") == {"CPU": 0.0}, "calm after the hog", 60)
        poll(lambda: _chat(base, "llama-gqa").status_code == 200, "llama-gqa loading again after the hog", 60)
        # the request in flight was never cut: still on its seat and streaming after the pressure has passed
        busy.assert_on_its_seat()
        busy.let_go()  # one more token, then the client hangs up
        ended = poll(lambda: _metric(base, "fitevict_requests_total", "status", model="med-a"), "med-a's count", 60)
        assert ended == {"499": 1.0}, ended  # ended by the client's hang-up: not cut, not lost
        loads = [e["model"] for e in history(door, event="load")]
        assert loads.count("llama-gqa") == 2
        assert [e["event"] for e in history(door) if e.get("model") == "med-a"] == ["load"]  # never stopped
        metrics = httpx.get(base + "/metrics", timeout=30).text
        assert 'fitevict_pressure_events_total' in metrics
