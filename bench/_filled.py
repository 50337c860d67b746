"""A seat's host memory against its price, through a filled context.

One llama-server is started as a seat starts (``LlamaServerEngine.launch_spec``: the seat's own argv, ``-cram 0``,
``--fit off``), and its process tree's PSS is sampled by a thread every ``SAMPLE_S`` seconds from the moment it is
spawned (``engines.llama_cpp.fill.PeakSampler``: PSS as read, and beside it the same with the engine's own file pages
counted whole, as for the only seat of its binary, and without them, as for a seat that does not carry them): through
the load (until ``/health`` answers 200), then through the fill (``engines.llama_cpp.fill.fill``), where every slot is
sent, at once, a prompt of ``n_ctx_seq - max_tokens`` tokens and asked for ``max_tokens`` more (``/completion`` with
``ignore_eos``), so that each slot's context is full when its answer ends. The peaks of both phases are kept.
``run_door`` runs several seats side by side, as one door's: the first carries the binary's shared pages
(``pricing.pages``), and ``attributed`` counts each seat as the planner does.

The prediction is the host price as the server makes it for a first load: the rules with this machine's host buffer
table, the compute buffer from the engine's own dry run, plus the engine process's overhead: the calibrated part and
the parts that scale with the model (``prices.overhead.with_engine_overhead`` with
``engines.llama_cpp.overhead.model_terms``, as ``PriceBook.footprint`` adds them). The binary's shared pages are not
in it: the seat that carries them adds them.

Shared by ``bench/filled_context.py`` and ``tests/e2e/test_filled_context.py``.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from fitevict.engines.base import Unavailable
from fitevict.engines.llama_cpp.buftrace import buftrace_library, preload_env
from fitevict.engines.llama_cpp.dryrun import dry_run
from fitevict.engines.llama_cpp.fill import MAX_TOKENS, SAMPLE_S, PeakSampler, fill, healthy
from fitevict.engines.llama_cpp.server import LlamaServerEngine
from fitevict.engines.llama_cpp.overhead import model_terms
from fitevict.engines.process import free_port, stop_group
from fitevict.host import procmem
from fitevict.pricing.footprint import HOST
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.hostbufs import HostBuffers
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.buftrace import parse_exact_log
from fitevict.pricing.logparse import parse_load_log
from fitevict.pricing.price import price
from fitevict.prices.overhead import with_engine_overhead
from fitevict.units import MiB

FLOOR_BYTES = 4 * MiB  # the error allowed in bytes, whatever the percentage, for a model file under SMALL_FILE
SMALL_FILE = 200 * MiB
BELOW, ABOVE = 0.02, 0.10  # the allowed error under and over the peak, as fractions of it


@dataclass(frozen=True, slots=True)
class Predicted:
    buffers: int  # the priced host buffers (mapped + committed)
    calibrated: int  # the engine process's calibrated overhead (the part that does not scale with the model)
    terms: tuple[tuple[str, int], ...]  # the parts that do: (name, bytes), from pricing.process's rules
    n_ctx_seq: int
    slots: int

    @property
    def overhead(self) -> int:
        return self.calibrated + sum(n for _, n in self.terms)

    @property
    def host(self) -> int:
        return self.buffers + self.overhead


def predict(binary: Path, model: Path, cfg: LoadConfig, host: HostBuffers, calibrated: int) -> Predicted:
    """The host price of a first load of ``model`` under ``cfg``, as the server makes it (dry-run compute)."""
    dry = dry_run(binary.parent, model, cfg)
    if isinstance(dry, Unavailable):
        raise RuntimeError(f"no dry run for {model.name}: {dry.reason}")
    s = load_structure(model)
    p = price(s, cfg, compute=dry.compute, context=dry.context, host=host)
    terms = model_terms(s, cfg, host)
    priced = with_engine_overhead(p.footprint, {HOST: calibrated}, terms=terms)
    assert priced.bytes_on(HOST) == p.footprint.bytes_on(HOST) + calibrated + sum(t.bytes for t in terms)
    return Predicted(p.footprint.bytes_on(HOST), calibrated, tuple((t.name, t.bytes) for t in terms), p.n_ctx_seq,
                     p.n_parallel)


@dataclass(frozen=True, slots=True)
class Filled:
    """One seat, measured from spawn through a filled context. Peaks count the engine's own file pages whole (the
    binary and its own libraries, as for the only seat of its binary); ``*_pss`` are the peaks of PSS as read."""

    peak_load: int  # from spawn until /health answered
    peak_fill: int  # from spawn through the fill
    peak_load_pss: int
    peak_fill_pss: int
    peak_fill_committed: int  # of the reading at the filled peak
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
    exact_buffers: int | None = None  # the host buffers the allocator trace saw, to the byte (None: not traced)
    exact_notes: tuple[str, ...] = ()  # why a traced figure is not exact
    peak_fill_only_pss: int | None = None  # the peak PSS as read during the fill alone, after the load ended
    peak_fill_only: int | None = None  # the same with the engine's own file pages counted whole
    peak_fill_own: int | None = None  # the engine's own file pages (Rss, whole) at the filled peak
    peak_fill_bare: int | None = None  # the peak of PSS without the engine's own file pages (a seat not carrying them)


def neighbours(binary: Path, own: int) -> set[int]:
    """Other processes running ``binary``: PSS splits its pages among them, so a seat alone reads more."""
    target = str(Path(binary).resolve())
    out = set()
    for p in psutil.process_iter(["exe"]):
        if p.pid != own and p.info.get("exe") == target:
            out.add(p.pid)
    return out


def private_binary(binary: Path, into: Path) -> Path:
    """A copy of the engine's folder (llama-server, llama-fit-params, ...) under ``into``: a door whose seats run it
    shares its pages with no process outside the door (other programs on the machine running the same build would
    take a share of them from the door's PSS as read). Its calibration is its own (keyed by path)."""
    into.mkdir(parents=True, exist_ok=True)
    for f in Path(binary).resolve().parent.iterdir():
        if f.is_file():
            shutil.copy2(f, into / f.name)
    return into / Path(binary).name


@dataclass
class Running:
    """One seat started and sampled, not stopped yet."""

    model: Path
    pred: Predicted
    proc: subprocess.Popen
    sampler: PeakSampler
    base: str
    log_path: Path
    t0: float
    load_s: float = 0.0
    fill_s: float = 0.0
    tokens: tuple[tuple[int, int], ...] = ()


def start_seat(binary: Path, model: Path, cfg: LoadConfig, pred: Predicted, log_path: Path, *,
               trace: bool = False) -> Running:
    """Start ``model`` as a seat starts (its own argv), its PSS sampled from spawn."""
    spec = LlamaServerEngine(binary).launch_spec(model, cfg, free_port())
    env = dict(spec.env)
    if trace:
        lib = buftrace_library()
        if isinstance(lib, Unavailable):
            raise RuntimeError(lib.reason)
        env = preload_env(lib, env)
    with log_path.open("wb") as log:
        t0 = time.monotonic()
        proc = subprocess.Popen(list(spec.argv), env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    return Running(model, pred, proc, PeakSampler(proc.pid).start(), f"http://127.0.0.1:{spec.port}", log_path, t0)


class SeatCrashed(RuntimeError):
    """The engine died by a signal before it answered /health (``seat.crash``: a seat is then loaded again with
    ``-nr``)."""


def serve_and_fill(r: Running, max_tokens: int, timeout: float) -> None:
    """Wait for ``r`` to answer /health, then fill every slot's context."""
    why = healthy(r.proc, r.base, timeout)
    if why:
        crashed = r.proc.returncode is not None and r.proc.returncode < 0
        raise (SeatCrashed if crashed else RuntimeError)(f"{r.model.name}: {why}; its log: {r.log_path}")
    r.load_s = time.monotonic() - r.t0
    r.sampler.phase = "fill"
    t1 = time.monotonic()
    r.tokens = fill(r.base, r.pred.slots, r.pred.n_ctx_seq, max_tokens)
    r.fill_s = time.monotonic() - t1


def finish_seat(r: Running, binary: Path, others: set[int], trace: bool = False) -> Filled:
    """Stop ``r`` and what its sampler and its log say."""
    try:
        time.sleep(5 * SAMPLE_S)  # a few readings after the last answer
    finally:
        r.sampler.stop()
        served = r.log_path.stat().st_size  # the trace after this is the stop freeing every buffer
        stop_group(r.proc)
    sampler = r.sampler
    text = r.log_path.read_text(errors="replace")
    logged = parse_load_log(text).to_footprint()
    exact = parse_exact_log(text[:served]) if trace else None
    exact_fp = exact.to_footprint() if exact is not None else None
    load, top = sampler.peak("load"), sampler.peak("load", "fill")
    load_pss, top_pss = sampler.peak_raw("load"), sampler.peak_raw("load", "fill")
    bare = sampler.peak_bare("load", "fill")
    if load is None or top is None or load_pss is None or top_pss is None or bare is None:
        raise RuntimeError(f"no PSS reading of the seat: {sampler.reason or 'no sample'}")
    return Filled(load.alone, top.alone, load_pss, top_pss, top.committed, top.mapped,
                  logged.bytes_on(HOST) if logged is not None else None,
                  logged.host_mapped_bytes if logged is not None else None, r.tokens, sampler.samples,
                  (sampler.ended - sampler.started) / sampler.samples, sampler.max_gap, r.load_s, r.fill_s,
                  len(others), exact_fp.bytes_on(HOST) if exact_fp is not None else None,
                  tuple(n for n in exact.notes if n.startswith("not exact")) if exact is not None else (),
                  sampler.peak_raw("fill"), fill_only.alone if (fill_only := sampler.peak("fill")) else None,
                  top.own_rss, bare)


def run_filled(binary: Path, model: Path, cfg: LoadConfig, pred: Predicted, log_path: Path, *,
               max_tokens: int = MAX_TOKENS, timeout: float = 180.0, trace: bool = False) -> Filled:
    """Start ``model`` as a seat, sample its PSS through the load and through every slot filled to
    ``n_ctx_seq`` tokens (prompt ``n_ctx_seq - max_tokens``, then ``max_tokens`` generated); then stop it.
    ``trace``: preload the allocator trace (``engines.llama_cpp.buftrace``) for the exact bytes of the host buffers."""
    r = start_seat(binary, model, cfg, pred, log_path, trace=trace)
    others: set[int] = set()
    try:
        serve_and_fill(r, max_tokens, timeout)
        others = neighbours(binary, r.proc.pid)
    except BaseException:
        r.sampler.stop()
        stop_group(r.proc)
        raise
    return finish_seat(r, binary, others, trace)


@dataclass
class DoorSampler:
    """The door as read: every ``period`` seconds the PSS of every seat's process tree, read one after another, and
    their sum; the highest sum is kept (``peak``), with its parts (``parts``)."""

    pids: list[int] = field(default_factory=list)
    period: float = 0.05
    peak: int = 0
    parts: tuple[int, ...] = ()
    done: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        """Read until ``done`` is set (on a thread of its own)."""
        while not self.done.wait(self.period):
            got = [procmem.read_tree(p).host_bytes for p in list(self.pids)]
            if got and all(n is not None for n in got) and sum(got) > self.peak:  # type: ignore[arg-type]
                self.peak, self.parts = sum(got), tuple(got)  # type: ignore[arg-type]


def run_door(binary: Path, seats: list[tuple[Path, LoadConfig, Predicted]], logs: Path, *,
             max_tokens: int = MAX_TOKENS, timeout: float = 300.0) -> tuple[list[Filled], DoorSampler]:
    """A door's seats side by side: every seat started (in the order given: the first carries the binary's shared
    pages, ``pricing.pages``), then each filled in turn while all run, then all stopped. Per seat as
    ``run_filled``; their ``neighbours`` are the processes of the same binary beside each. The door sampler reads
    all of them at once: the door's PSS as read, whole."""
    running: list[Running] = []
    door = DoorSampler()
    reader = threading.Thread(target=door.run, name="door-pss", daemon=True)
    reader.start()
    try:
        for model, cfg, pred in seats:
            running.append(start_seat(binary, model, cfg, pred, logs / f"door-{model.stem}-np{cfg.n_parallel}.log"))
            door.pids.append(running[-1].proc.pid)
            if healthy(running[-1].proc, running[-1].base, timeout):  # placed one after another, as a door does
                raise RuntimeError(f"{model.name} did not start; its log: {running[-1].log_path}")
        for r in running:
            serve_and_fill(r, max_tokens, timeout)
        others = {r.proc.pid: neighbours(binary, r.proc.pid) for r in running}
        time.sleep(10 * door.period)  # a few door readings with every seat filled
    except BaseException:
        door.done.set()
        for r in running:
            r.sampler.stop()
            stop_group(r.proc)
        raise
    door.done.set()
    reader.join()
    return [finish_seat(r, binary, others[r.proc.pid]) for r in running], door


@dataclass(frozen=True, slots=True)
class Attributed:
    """A door's seats as the planner counts them: per seat its price, plus the binary's shared pages on the seat
    that carries them (the first); and what was read of each, the pages counted as the planner counts them (whole
    on the carrier: ``peak_fill``; none on the others: ``peak_fill_bare``)."""

    planned: tuple[int, ...]
    measured: tuple[int, ...]  # attributed as planned
    read: tuple[int, ...]  # PSS as read, each seat's at the door's peak
    door_read: int  # the door's peak PSS as read: the highest sum of its seats' PSS read at once

    @property
    def door_planned(self) -> int:
        return sum(self.planned)


def attributed(preds: list[Predicted], got: list[Filled], pages: int, door: DoorSampler) -> Attributed:
    """The first seat carries ``pages`` (its planned figure and its measurement count them whole), the others
    none (their measurement leaves them out)."""
    planned = tuple(p.host + (pages if i == 0 else 0) for i, p in enumerate(preds))
    measured = tuple(g.peak_fill if i == 0 else g.peak_fill_bare for i, g in enumerate(got))
    return Attributed(planned, measured, door.parts, door.peak)


def allowed(peak: int, file_bytes: int) -> tuple[int, int]:
    """(bytes the prediction may fall under the peak, bytes it may exceed it): 2% under and 10% over, or 4 MiB
    either way for a model file under 200 MiB when that is larger."""
    floor = FLOOR_BYTES if file_bytes < SMALL_FILE else 0
    return max(int(BELOW * peak), floor), max(int(ABOVE * peak), floor)


def within_bare(predicted: int, peak: int) -> bool:
    """Within -2%/+10% of the peak, with no floor: the bounds the headline states."""
    return -BELOW * peak <= predicted - peak <= ABOVE * peak


def within(predicted: int, peak: int, file_bytes: int) -> bool:
    under, over = allowed(peak, file_bytes)
    return -under <= predicted - peak <= over
