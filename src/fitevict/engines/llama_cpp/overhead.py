"""The engine process's own memory, calibrated once per binary at the peak of a filled context, so that a model's
first load is priced with it.

A llama-server process holds more than its buffers. Part of it does not depend on the model: the binary's and its
libraries' pages (touched by the kernels a request runs), thread stacks, the allocator's arenas. Part of it does:
the vocabulary's heap, ggml's CPU work buffer and the heap a filled context grows (``pricing.process``, each a rule
from the model's dimensions). fitevict measures the first part once per engine binary: it starts the binary as a
seat starts (the same argv builder) on the calibration model (a zoo model written for the purpose unless one is
given) with the allocator trace preloaded, fills its context as ``engines/llama_cpp/fill.py`` does (a prompt of
``n_ctx_seq - 32`` tokens, 32 generated), reads the process tree's PSS every 20 ms from spawn to the end of the
fill, with the engine's own file pages (its executable and its own libraries, ``fill.engine_file``) counted whole,
as for the only seat of its binary (PSS would split them with whatever else maps them), and takes the peak. Of the
peak, the engine's own file pages are kept apart (``shared_pages``: seats of one binary share them, and the planner
counts them once, ``pricing.pages``); the rest, less the exact bytes of every host buffer the allocator trace saw and
less the calibration model's own scaling parts, is the overhead. It does this ``RUNS`` times and keeps the largest.
The record is stored as JSON under ``cache_dir()/overhead``, keyed by the binary's path, size and mtime and this CPU:
a rebuilt binary is calibrated again.

``calibrated_overhead(binary)`` is what a supervisor reads at start: ``{"CPU": bytes}`` (the part that does not
depend on the model) or None when this binary was never calibrated. ``shared_pages(binary)`` is the binary's own
file pages: measured by its calibration, else a labelled rule (the files' sizes). ``model_terms`` prices the other
part for a model on this machine.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from fitevict.engines.base import Unavailable
from fitevict.engines.llama_cpp.buftrace import buftrace_library, preload_env
from fitevict.engines.llama_cpp.fill import SAMPLE_S, PeakSampler, fill, healthy
from fitevict.engines.llama_cpp.fill import engine_file as fill_engine_file
from fitevict.engines.llama_cpp.server import LlamaServerEngine
from fitevict.engines.process import free_port, stop_group
from fitevict.engines.llama_cpp.machine import this_cpu
from fitevict.paths import cache_dir
from fitevict.pricing.buftrace import STOP_MARK, parse_exact_log
from fitevict.pricing.footprint import HOST
from fitevict.pricing.gguf import GgufStructure, load_structure
from fitevict.pricing.hostbufs import HostBuffers
from fitevict.pricing.kv import resolve_context
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.pages import SharedPages

from fitevict.pricing.process import ProcessTerm
from fitevict.pricing.process import model_terms as pure_model_terms

CALIBRATION_CONFIG = LoadConfig(n_ctx=2048, n_parallel=1)  # one slot: 2,016 prompt tokens, 32 generated
CALIBRATION_MODEL = "llama-gqa"  # the zoo's smallest dense model
RUNS = 2  # calibration runs; the largest figure is kept
# v4: the engine's own file pages kept apart (v3: every library's pages counted whole in the overhead; v2: once it
# listened)
RECORD_VERSION = 4


def calibratable(binary: Path) -> bool:
    """A real llama-server build to calibrate: an executable file named llama-server."""
    return binary.name == "llama-server" and binary.is_file() and os.access(binary, os.X_OK)


def _record_path(binary: Path) -> Path:
    st = binary.stat()
    ident = hashlib.sha256(str(binary.resolve()).encode()).hexdigest()[:12]
    cpu = this_cpu().fingerprint  # the same binary on another CPU holds other pages
    return (cache_dir() / "overhead"
            / f"{binary.name}-{ident}-{st.st_size}-{st.st_mtime_ns}-{cpu}-v{RECORD_VERSION}.json")


def calibrated_overhead(binary: str | Path) -> dict[str, int] | None:
    """The stored calibration of ``binary`` (device -> bytes of the process beyond its buffers that do not depend on
    the model), or None when this build (path, size, mtime) was never calibrated."""
    try:
        data = json.loads(_record_path(Path(binary)).read_text())
        return {str(d): int(n) for d, n in data["overhead"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def shared_pages(binary: str | Path) -> SharedPages:
    """The file pages every seat of ``binary`` shares (``pricing.pages``): as its calibration measured them, else
    the rule: the sizes of its own files on disk (no mapping of a file holds more than the file)."""
    path = Path(binary)
    group = pages_group(path)
    try:
        data = json.loads(_record_path(path).read_text())
        got = SharedPages.from_json({"group": group, **data["shared_pages"]})
    except (OSError, ValueError, KeyError, TypeError):
        got = None
    if got is not None:
        return got
    files = own_files(path)
    names = tuple(f.name for f in files)
    return SharedPages(group, sum(f.stat().st_size for f in files),
                       f"rule: the size on disk of {', '.join(names) or 'no file'} (not calibrated here yet; no "
                       "mapping of a file holds more than the file)", names)


def pages_group(binary: Path) -> str:
    """The name seats of one binary share their pages under: the engine's (``llama-server``, the name of every
    binary that is calibrated), as its catalog entries name it; a door runs one binary per engine."""
    return binary.name


def own_files(binary: Path) -> list[Path]:
    """The engine's own files: ``binary`` and the libraries its build makes in its folder (``fill.engine_file``)."""
    try:
        exe = binary.resolve()
        beside = [p for p in exe.parent.iterdir() if p != exe and p.is_file() and fill_engine_file(str(p), str(exe))]
    except OSError:
        return []
    return [exe, *sorted(beside)]


@functools.cache
def engine_threads() -> int:
    """The threads llama-server computes with by default (common_cpu_get_num_math: the physical cores)."""
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def model_terms(s: GgufStructure, cfg: LoadConfig, host: HostBuffers) -> tuple[ProcessTerm, ...]:
    """The parts of a seat's process memory that scale with ``s`` under ``cfg`` on this machine (its threads, and
    whether ggml's tiled K-quant path runs here: x86 with AVX)."""
    return pure_model_terms(s, cfg, host, n_threads=engine_threads(), tiled=tiled_here())


def tiled_here() -> bool:
    """Whether ggml's tiled K-quant path runs on this CPU (x86 with AVX)."""
    return "avx" in this_cpu().flags


@dataclass(frozen=True, slots=True)
class FilledSeat:
    """A seat's host memory filled to its context: peak PSS from spawn through the fill, its host buffers to the
    byte, the time it took."""

    peak_bytes: int  # the engine's own file pages counted whole, as for the only seat of its binary
    peak_pss_bytes: int  # as read
    own_bytes: int  # the engine's own file pages at that peak, whole (Rss)
    listen_bytes: int  # the peak from spawn until /health answered (own file pages counted whole)
    buffer_bytes: int
    tokens: tuple[tuple[int, int], ...]  # per slot: (prompt tokens evaluated, tokens predicted)
    seconds: float


def measure_filled(binary: Path, model: Path, cfg: LoadConfig, *, timeout_s: float = 120.0) -> FilledSeat | Unavailable:
    """Start ``model`` as a seat starts (the seat argv builder) with the allocator trace preloaded, sample its PSS
    from spawn, fill every slot's context, then stop it."""
    lib = buftrace_library()
    if isinstance(lib, Unavailable):
        return Unavailable(f"exact buffer bytes unavailable: {lib.reason}")
    rc = resolve_context(load_structure(model), cfg)
    spec = LlamaServerEngine(binary).launch_spec(model, cfg, free_port())
    base = f"http://127.0.0.1:{spec.port}"
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(list(spec.argv), env=preload_env(lib, dict(spec.env)), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        sampler = PeakSampler(proc.pid).start()
        try:
            why = healthy(proc, base, timeout_s)
            if not why:
                sampler.phase = "fill"
                try:
                    tokens = fill(base, rc.n_parallel, rc.n_ctx_seq, timeout_s=timeout_s)
                except (httpx.HTTPError, RuntimeError, ValueError, KeyError) as e:
                    why = f"the fill failed: {e}"
                time.sleep(3 * SAMPLE_S)  # a few readings after the last answer
        finally:
            sampler.stop()
            log.write(f"\n{STOP_MARK}\n".encode())  # the allocator trace's frees from here on are the shutdown's
            log.flush()
            stop_group(proc)
        log.seek(0)
        text = log.read().decode("utf-8", "replace")
    if why:
        return Unavailable(f"the seat on {model.name}: {why}")
    exact = parse_exact_log(text)
    if exact.precision_bytes:
        return Unavailable(f"buffers not exact: {'; '.join(exact.notes)}")
    top, listen = sampler.peak("load", "fill"), sampler.peak("load")
    if top is None or listen is None:
        return Unavailable(f"no PSS for the seat ({sampler.reason or 'not sampled'})")
    return FilledSeat(top.alone, top.pss, top.own_rss, listen.alone, exact.to_footprint().bytes_on(HOST), tokens,
                      time.monotonic() - t0)


def calibrate_overhead(binary: str | Path, model: str | Path | None = None, *, host: HostBuffers | None = None,
                       timeout_s: float = 120.0) -> dict | Unavailable:
    """Measure ``binary``'s process overhead on ``model`` (default: a freshly written zoo model) and store it.
    Returns the stored record: ``overhead`` (device -> bytes that do not depend on the model), the runs' peaks
    and buffers, the calibration model's own scaling ``terms`` and the ``seconds`` it took."""
    from fitevict.engines.llama_cpp.machine import host_buffers

    binary = Path(binary)
    host = host or host_buffers(binary)
    t0 = time.monotonic()
    runs: list[FilledSeat] = []
    with tempfile.TemporaryDirectory(prefix="fitevict-calibrate-") as tmp:
        if model is None:
            from fitevict.zoo import write_zoo

            model = write_zoo(Path(tmp), only=[CALIBRATION_MODEL])[0].path
        terms = model_terms(load_structure(model), CALIBRATION_CONFIG, host)
        for _ in range(RUNS):
            got = measure_filled(binary, Path(model), CALIBRATION_CONFIG, timeout_s=timeout_s)
            if isinstance(got, Unavailable):
                return Unavailable(f"cannot calibrate {binary}: {got.reason}")
            runs.append(got)
    scaling = sum(t.bytes for t in terms)
    best = max(runs, key=lambda r: r.peak_bytes - r.own_bytes - r.buffer_bytes)
    record = {"binary": str(binary.resolve()), "model": str(model), "config": CALIBRATION_CONFIG.to_json(),
              "pss_bytes": best.peak_bytes, "buffer_bytes": best.buffer_bytes,
              "overhead": {HOST: best.peak_bytes - best.own_bytes - best.buffer_bytes - scaling},
              "shared_pages": {"bytes": max(r.own_bytes for r in runs),
                               "files": [f.name for f in own_files(binary)], "source": (
                  f"measured: Rss of the engine's own file mappings ({', '.join(f.name for f in own_files(binary))}) "
                  f"in /proc/PID/smaps at the filled peak of {Path(model).name}; the largest of {RUNS} runs")},
              "terms": [t.to_json() for t in terms],
              "runs": [{"peak_bytes": r.peak_bytes, "peak_pss_bytes": r.peak_pss_bytes, "own_bytes": r.own_bytes,
                        "buffer_bytes": r.buffer_bytes, "tokens": r.tokens, "seconds": round(r.seconds, 3)}
                       for r in runs],
              "seconds": round(time.monotonic() - t0, 3),
              "source": f"measured: peak PSS (smaps_rollup every {SAMPLE_S * 1000:.0f} ms) through a filled context, "
                        "less the engine's own file pages (kept apart as shared_pages), the allocator's host buffer "
                        f"bytes and the calibration model's scaling parts; the largest of {RUNS} runs"}
    path = _record_path(binary)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = path.with_suffix(f".tmp{os.getpid()}")
    tmp_path.write_text(json.dumps(record, indent=2))
    os.replace(tmp_path, path)
    return record
