"""A seat's host memory against its price, through a filled context.

One llama-server is started as a seat starts (``LlamaServerEngine.launch_spec``: the seat's own argv, ``-cram 0``,
``--fit off``), and its process tree's PSS (``procmem.read_tree``: Pss_Anon + Pss_Shmem + Pss_File of the engine and
its children, from ``/proc/PID/smaps_rollup``) is sampled by a thread every ``SAMPLE_S`` seconds from the moment it
is spawned: through the load (until ``/health`` answers 200), then through the fill, where every slot is sent, at
once, a prompt of ``n_ctx_seq - max_tokens`` tokens and asked for ``max_tokens`` more (``/completion`` with
``ignore_eos``), so that each slot's context is full when its answer ends. The peaks of both phases are kept.

The prediction is the host price as the server makes it for a first load: the rules with this machine's host buffer
table, the compute buffer from the engine's own dry run, plus the engine process's calibrated overhead
(``supervisor.measure.with_engine_overhead``, the figure ``PriceBook.footprint`` adds).

Shared by ``bench/filled_context.py`` and ``tests/e2e/test_filled_context.py``.
"""

from __future__ import annotations

import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from _serve import up, wait_for

from fitevict.engines.base import Unavailable
from fitevict.engines.dryrun import dry_run
from fitevict.engines.llama_server import LlamaServerEngine
from fitevict.engines.process import free_port, stop_group
from fitevict.host import procmem
from fitevict.pricing.footprint import HOST
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.hostbufs import HostBuffers
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.logparse import parse_load_log
from fitevict.pricing.price import price
from fitevict.supervisor.measure import with_engine_overhead
from fitevict.units import MiB

SAMPLE_S = 0.020  # the sampler's period
MAX_TOKENS = 32  # each slot's answer: n_predict, with ignore_eos
FLOOR_BYTES = 4 * MiB  # the error allowed in bytes, whatever the percentage, for a model file under SMALL_FILE
SMALL_FILE = 200 * MiB
BELOW, ABOVE = 0.02, 0.10  # the allowed error under and over the peak, as fractions of it
TEXT = ("The quick brown fox jumps over the lazy dog near the river bank, while seven wizards quietly pack "
        "twelve boxes of liquor jugs; meanwhile 0123456789 numbers, punctuation (like this!) and Mixed CASE words "
        "keep the tokenizer busy across many different pieces of the vocabulary. ")


@dataclass(slots=True)
class PeakSampler:
    """PSS of a process tree, sampled every ``period`` seconds on a thread; the peak per phase."""

    pid: int
    period: float = SAMPLE_S
    phase: str = "load"
    peaks: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # phase -> (PSS, committed, mapped)
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

    def _run(self) -> None:
        last = nxt = time.monotonic()
        while not self._stop.is_set():
            m = procmem.read_tree(self.pid)
            now = time.monotonic()
            self.max_gap, last = max(self.max_gap, now - last), now
            if m.committed_bytes is None or m.mapped_bytes is None:
                self.unread, self.reason = self.unread + 1, m.reason
            else:
                self.samples += 1
                seen = (m.committed_bytes + m.mapped_bytes, m.committed_bytes, m.mapped_bytes)
                if seen > self.peaks.get(self.phase, (-1, 0, 0)):
                    self.peaks[self.phase] = seen
            nxt += self.period
            self._stop.wait(max(0.0, nxt - time.monotonic()))
        self.ended = time.monotonic()

    def peak(self, *phases: str) -> tuple[int, int, int] | None:
        """The highest reading (PSS, committed, mapped) over ``phases``; None when none was read."""
        got = [self.peaks[p] for p in phases if p in self.peaks]
        return max(got) if got else None

    @property
    def mean_period(self) -> float | None:
        return (self.ended - self.started) / self.samples if self.samples else None


@dataclass(frozen=True, slots=True)
class Predicted:
    buffers: int  # the priced host buffers (mapped + committed)
    overhead: int  # the engine process's calibrated overhead
    n_ctx_seq: int
    slots: int

    @property
    def host(self) -> int:
        return self.buffers + self.overhead


def predict(binary: Path, model: Path, cfg: LoadConfig, host: HostBuffers, overhead: int) -> Predicted:
    """The host price of a first load of ``model`` under ``cfg``, as the server makes it (dry-run compute)."""
    dry = dry_run(binary.parent, model, cfg)
    if isinstance(dry, Unavailable):
        raise RuntimeError(f"no dry run for {model.name}: {dry.reason}")
    p = price(load_structure(model), cfg, compute=dry.compute, context=dry.context, host=host)
    with_overhead = with_engine_overhead(p.footprint, {HOST: overhead}).bytes_on(HOST)
    return Predicted(p.footprint.bytes_on(HOST), with_overhead - p.footprint.bytes_on(HOST), p.n_ctx_seq,
                     p.n_parallel)


@dataclass(frozen=True, slots=True)
class Filled:
    """One seat, measured from spawn through a filled context."""

    peak_load: int  # peak PSS from spawn until /health answered
    peak_fill: int  # peak PSS from spawn through the fill
    peak_fill_committed: int
    peak_fill_mapped: int
    logged_buffers: int | None  # the host buffers the load log reports (0.01 MiB per line)
    logged_mapped: int | None  # the part of them mapped from the model file
    tokens: tuple[tuple[int, int], ...]  # per slot: (prompt tokens evaluated, tokens predicted)
    samples: int
    mean_period_s: float
    max_gap_s: float
    load_s: float
    fill_s: float
    neighbours: int  # other processes running the same engine binary meanwhile (they split its pages' PSS)


def neighbours(binary: Path, own: int) -> set[int]:
    """Other processes running ``binary``: PSS splits its pages among them, so a seat alone reads more."""
    target = str(Path(binary).resolve())
    out = set()
    for p in psutil.process_iter(["exe"]):
        if p.pid != own and p.info.get("exe") == target:
            out.add(p.pid)
    return out


def prompts(base: str, slots: int, n_tokens: int) -> list[list[int]]:
    """One prompt of exactly ``n_tokens`` token ids per slot, cut from the model's own tokenization of a text
    (``/tokenize``), each slot's from another offset so no two share a prefix."""
    r = httpx.post(base + "/tokenize", json={"content": TEXT * 8}, timeout=60)
    r.raise_for_status()
    ids = [t for t in r.json()["tokens"] if isinstance(t, int)]
    if not ids:
        raise RuntimeError("/tokenize returned no tokens")
    return [[ids[(i + 7 * s) % len(ids)] for i in range(n_tokens)] for s in range(slots)]


def _complete(base: str, prompt: list[int], slot: int, max_tokens: int) -> tuple[int, int]:
    body = {"prompt": prompt, "n_predict": max_tokens, "ignore_eos": True, "id_slot": slot, "temperature": 0.0,
            "cache_prompt": False}
    r = httpx.post(base + "/completion", json=body, timeout=900)
    r.raise_for_status()
    d = r.json()
    return int(d["tokens_evaluated"]), int(d["tokens_predicted"])


def run_filled(binary: Path, model: Path, cfg: LoadConfig, pred: Predicted, log_path: Path, *,
               max_tokens: int = MAX_TOKENS, timeout: float = 180.0) -> Filled:
    """Start ``model`` as a seat, sample its PSS through the load and through every slot filled to
    ``n_ctx_seq`` tokens (prompt ``n_ctx_seq - max_tokens``, then ``max_tokens`` generated); then stop it."""
    spec = LlamaServerEngine(binary).launch_spec(model, cfg, free_port())
    base = f"http://127.0.0.1:{spec.port}"
    with log_path.open("wb") as log:
        t0 = time.monotonic()
        proc = subprocess.Popen(list(spec.argv), env=dict(spec.env), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    sampler = PeakSampler(proc.pid).start()
    try:
        wait_for(lambda: up(proc, base, log_path, "llama-server"), f"llama-server on {model.name} healthy", timeout)
        others = neighbours(binary, proc.pid)
        load_s = time.monotonic() - t0
        sampler.phase = "fill"
        t1 = time.monotonic()
        todo = prompts(base, pred.slots, pred.n_ctx_seq - max_tokens)
        with ThreadPoolExecutor(pred.slots) as pool:
            tokens = tuple(pool.map(lambda sp: _complete(base, sp[1], sp[0], max_tokens), enumerate(todo)))
        fill_s = time.monotonic() - t1
        time.sleep(5 * SAMPLE_S)  # a few readings after the last answer
        others |= neighbours(binary, proc.pid)
    finally:
        sampler.stop()
        stop_group(proc)
    logged = parse_load_log(log_path.read_text(errors="replace")).to_footprint()
    load, top = sampler.peak("load"), sampler.peak("load", "fill")
    if load is None or top is None:
        raise RuntimeError(f"no PSS reading of the seat: {sampler.reason or 'no sample'}")
    return Filled(load[0], top[0], top[1], top[2], logged.bytes_on(HOST) if logged is not None else None,
                  logged.host_mapped_bytes if logged is not None else None, tokens, sampler.samples,
                  (sampler.ended - sampler.started) / sampler.samples, sampler.max_gap, load_s, fill_s, len(others))


def allowed(peak: int, file_bytes: int) -> tuple[int, int]:
    """(bytes the prediction may fall under the peak, bytes it may exceed it): 2% under and 10% over, or 4 MiB
    either way for a model file under 200 MiB when that is larger."""
    floor = FLOOR_BYTES if file_bytes < SMALL_FILE else 0
    return max(int(BELOW * peak), floor), max(int(ABOVE * peak), floor)


def within(predicted: int, peak: int, file_bytes: int) -> bool:
    under, over = allowed(peak, file_bytes)
    return -under <= predicted - peak <= over
