"""A llama-server seat filled to its context, its host memory sampled through it: the peak a seat grows to.

``PeakSampler`` reads the process tree's PSS (``procmem.read_tree``: Pss_Anon + Pss_Shmem + Pss_File of the engine
and its children, from ``/proc/PID/smaps_rollup``) on a thread every ``SAMPLE_S`` seconds, and beside it the engine's
own file pages (Rss and Pss of its mappings of its executable and its own libraries, ``engine_file``, from
``/proc/PID/smaps``). PSS splits a file's pages among every process that maps it, so a seat reads less beside other
processes of the same binary, by as much as their number says (several MiB). Each reading keeps ``pss`` as read,
``alone`` (the engine's own file pages counted whole, as for the only seat of its binary: it does not depend on what
else runs) and ``without_own`` (none of them: a seat that does not carry its binary's pages, ``pricing.pages``).
The C and C++ runtimes are counted as read: every process on the machine shares them. Peaks are kept per phase.

``fill`` sends every slot at once a prompt of ``n_ctx_seq - max_tokens`` token ids (cut from the model's own
``/tokenize`` of a text) and asks for ``max_tokens`` more (``/completion``, ``ignore_eos``), so that every slot's
context is full when its answer ends.

Used by the engine overhead calibration (``llama_cpp/overhead.py``) and by ``bench/filled_context.py`` and its test.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from fitevict.engines import loopback
from fitevict.host import procmem

SAMPLE_S = 0.020  # the sampler's period
MAX_TOKENS = 32  # each slot's answer: n_predict, with ignore_eos
TEXT = ("The quick brown fox jumps over the lazy dog near the river bank, while seven wizards quietly pack "
        "twelve boxes of liquor jugs; meanwhile 0123456789 numbers, punctuation (like this!) and Mixed CASE words "
        "keep the tokenizer busy across many different pieces of the vocabulary. ")


OWN_LIBRARIES = ("libggml", "libllama", "libmtmd")  # a build with shared libraries: the engine's own files


def engine_file(path: str, exe: str) -> bool:
    """A file of the engine's own: its executable, or one of the libraries its build makes (``libggml*``,
    ``libllama*``, ``libmtmd*``). Not the C and C++ runtimes (every process on the machine shares those) and not
    the model."""
    return path == exe or os.path.basename(path).startswith(OWN_LIBRARIES)


def own_pages(pid: int) -> procmem.FilePages | None:
    """The engine's own file pages in ``pid`` (``engine_file``), Rss and Pss; None when it cannot be read."""
    return procmem.file_pages(pid, engine_file)


@dataclass(frozen=True, slots=True)
class Reading:
    """One reading of a seat's process tree, in bytes."""

    pss: int  # committed + mapped, as read
    committed: int  # Pss_Anon + Pss_Shmem
    mapped: int  # Pss_File
    own_rss: int  # the engine's own file pages (``engine_file``), whole
    own_pss: int  # the same, its share as read

    @property
    def alone(self) -> int:
        """PSS with the engine's own file pages counted whole (as for the only seat of its binary)."""
        return self.pss - self.own_pss + self.own_rss

    @property
    def without_own(self) -> int:
        """PSS without the engine's own file pages: what a seat that does not carry them holds."""
        return self.pss - self.own_pss


@dataclass(slots=True)
class PeakSampler:
    """A process tree's PSS every ``period`` seconds on a thread; per phase, the reading with the highest ``alone``
    figure (``peaks``) and the highest PSS as read (``raw``)."""

    pid: int
    period: float = SAMPLE_S
    phase: str = "load"
    peaks: dict[str, Reading] = field(default_factory=dict)
    raw: dict[str, int] = field(default_factory=dict)
    bare: dict[str, int] = field(default_factory=dict)  # per phase, the highest ``without_own``
    samples: int = 0
    unread: int = 0  # readings without bytes (the tree could not be read: the reason is kept)
    reason: str = ""
    max_gap: float = 0.0  # the longest time between two readings, seconds
    started: float = 0.0
    ended: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> "PeakSampler":
        self._thread = threading.Thread(target=self._run, name=f"pss-{self.pid}", daemon=True)
        self.started = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def read(self) -> Reading | None:
        """One reading now, or None (the reason kept) when the tree has no bytes to read."""
        m = procmem.read_tree(self.pid)
        if m.committed_bytes is None or m.mapped_bytes is None:
            self.unread, self.reason = self.unread + 1, m.reason
            return None
        pss = m.committed_bytes + m.mapped_bytes
        own = own_pages(self.pid)  # the engine has no children: its own mappings
        return Reading(pss, m.committed_bytes, m.mapped_bytes, own.rss if own else 0, own.pss if own else 0)

    def _run(self) -> None:
        last = nxt = time.monotonic()
        while not self._stop.is_set():
            got = self.read()
            now = time.monotonic()
            self.max_gap, last = max(self.max_gap, now - last), now
            if got is not None:
                self.samples += 1
                top = self.peaks.get(self.phase)
                if top is None or got.alone > top.alone:
                    self.peaks[self.phase] = got
                self.raw[self.phase] = max(self.raw.get(self.phase, 0), got.pss)
                self.bare[self.phase] = max(self.bare.get(self.phase, 0), got.without_own)
            nxt += self.period
            self._stop.wait(max(0.0, nxt - time.monotonic()))
        self.ended = time.monotonic()

    def peak(self, *phases: str) -> Reading | None:
        """The reading with the highest ``alone`` figure over ``phases``; None when none was read."""
        got = [self.peaks[p] for p in phases if p in self.peaks]
        return max(got, key=lambda r: r.alone) if got else None

    def peak_raw(self, *phases: str) -> int | None:
        """The highest PSS as read over ``phases``; None when none was read."""
        got = [self.raw[p] for p in phases if p in self.raw]
        return max(got) if got else None

    def peak_bare(self, *phases: str) -> int | None:
        """The highest PSS without the engine's own file pages over ``phases``; None when none was read."""
        got = [self.bare[p] for p in phases if p in self.bare]
        return max(got) if got else None



def healthy(proc: subprocess.Popen, base: str, timeout_s: float) -> str:
    """Wait until ``base/health`` answers 200: "" then, else why not (the process exited, or the time ran out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"llama-server exited with {proc.returncode} before it answered /health"
        try:
            if loopback.get(base + "/health", 1.0).status_code == 200:
                return ""
        except httpx.TransportError:
            pass  # not listening yet
        time.sleep(0.05)
    return f"llama-server did not answer /health within {timeout_s:.0f} s"


def prompts(base: str, slots: int, n_tokens: int) -> list[list[int]]:
    """One prompt of exactly ``n_tokens`` token ids per slot, cut from the model's own tokenization of a text
    (``/tokenize``), each slot's from another offset so no two share a prefix."""
    r = loopback.post(base + "/tokenize", 60, json={"content": TEXT * 8})
    r.raise_for_status()
    ids = [t for t in r.json()["tokens"] if isinstance(t, int)]
    if not ids:
        raise RuntimeError("/tokenize returned no tokens")
    return [[ids[(i + 7 * s) % len(ids)] for i in range(n_tokens)] for s in range(slots)]


def complete(base: str, prompt: list[int], slot: int, max_tokens: int, timeout_s: float = 900.0) -> tuple[int, int]:
    """One answer on ``slot``: (prompt tokens evaluated, tokens predicted)."""
    body = {"prompt": prompt, "n_predict": max_tokens, "ignore_eos": True, "id_slot": slot, "temperature": 0.0,
            "cache_prompt": False}
    r = loopback.post(base + "/completion", timeout_s, json=body)
    r.raise_for_status()
    d = r.json()
    return int(d["tokens_evaluated"]), int(d["tokens_predicted"])


def fill(base: str, slots: int, n_ctx_seq: int, max_tokens: int = MAX_TOKENS,
         timeout_s: float = 900.0) -> tuple[tuple[int, int], ...]:
    """Fill every slot's context at once: a prompt of ``n_ctx_seq - max_tokens`` tokens, ``max_tokens`` generated.
    Returns per slot (prompt tokens evaluated, tokens predicted)."""
    todo = prompts(base, slots, n_ctx_seq - max_tokens)
    with ThreadPoolExecutor(slots) as pool:
        return tuple(pool.map(lambda sp: complete(base, sp[1], sp[0], max_tokens, timeout_s), enumerate(todo)))
