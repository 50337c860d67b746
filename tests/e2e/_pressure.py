"""What the memory-pressure tests share: a hog (another program that allocates and touches memory), a streamed
request held in flight for as long as a test needs it, and the door's views they read."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from _frontdoor import FrontDoor, front_door
from _models import swap_models

from fitevict.host.procmem import read_meminfo

@contextmanager
def pressure_door(zoo: dict, tmp_path: Path, room: int, *, budget: str = "", policy: str = "",
                  engine: str = "") -> Iterator[tuple[FrontDoor, int]]:
    """``fitevict serve`` over the swap models (``_models.swap_models``) with a host reserve that leaves ``room`` of
    the memory free now to its seats, a reading every 0.2 s, no minimum residency or idle unload, and one engine
    thread (a busy seat leaves a core to the door, the hog and the client); ``budget``, ``policy`` and ``engine`` are
    lines added to those sections. Yields the door and its reserve."""
    (tmp_path / "models").mkdir()
    models = swap_models(zoo, tmp_path / "models")
    reserve = read_meminfo().available_bytes - room
    cfg = tmp_path / "f.toml"
    cfg.write_text(f"[budget]\nram_reserve = {reserve}\n{budget}[server]\nsample_seconds = 0.2\n"
                   f"[policy]\nmin_residency_seconds = 0\nidle_unload_seconds = 0\n{policy}"
                   f"[engine]\nextra_args = [\"-t\", \"1\"]\n{engine}")
    with front_door(tmp_path, "--models-dir", str(models), env={"FITEVICT_CONFIG": str(cfg)}) as door:
        yield door, reserve


HOG_CODE = """
import mmap, sys, time
n = int(sys.argv[1])
print(time.time(), flush=True)
m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)  # every page touched now
print(time.time(), flush=True)
sys.stdin.read()
"""


def residents(base: str) -> dict[str, dict]:
    return {r["key"]: r for r in httpx.get(base + "/v1/models/residents", timeout=30).json()["data"]}


def chat(base: str, model: str, max_tokens: int = 2, timeout: float = 300, **extra) -> httpx.Response:
    return httpx.post(base + "/v1/chat/completions", timeout=timeout, json={
        "model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}], **extra})


class HeldStream:
    """A streamed chat on ``model`` read in a thread as it comes, kept in flight until :meth:`let_go`: the client
    then reads one more token and hangs up. Its ``max_tokens`` fills the context, so the engine is still generating
    long after the test is done with it (``finished`` says it ran out first). A larger ``ctx`` makes the seat hold
    more memory of its own (its KV cache)."""

    def __init__(self, base: str, model: str, ctx: int = 4096) -> None:
        self.body = {"model": model, "max_tokens": ctx - 96, "stream": True, "ignore_eos": True, "fitevict": {"ctx": ctx},
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
        seat = residents(self.base).get(self.body["model"])
        assert self.alive() is None and seat is not None and seat["in_flight"] == 1, \
            f"{self.body['model']} is not serving the stream: seat {seat}; stream: {self.alive() or 'running'}"

    def let_go(self, timeout: float = 300) -> None:
        self.release.set()
        assert self.ended.wait(timeout), f"no token came within {timeout} s after {self.tokens}"
        assert self.after_release >= 1 and not self.errors and not self.finished, self.alive()


def metric(base: str, name: str, key: str, **match: str) -> dict[str, float]:
    """The samples of metric ``name`` in /metrics whose labels include ``match``, summed by label ``key``."""
    text = httpx.get(base + "/metrics", timeout=30).text
    out: dict[str, float] = {}
    for labels, value in re.findall(r'^' + name + r'\{([^}]*)\} (\S+)$', text, re.M):
        got = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if all(got.get(k) == v for k, v in match.items()):
            out[got[key]] = out.get(got[key], 0) + float(value)
    return out
