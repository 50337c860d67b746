"""The engine process's own memory, calibrated once per binary, so that a model's first load is priced with it.

A llama-server process holds more than its buffers: the binary's pages, its heap, its threads' stacks. fitevict
measures that once per engine binary: it starts the binary as a seat starts (the same argv builder), on the
smallest model (a zoo model written for the purpose unless one is given), waits until it listens (weights read,
warm-up run), reads the process tree's PSS (committed + mapped, smaps_rollup) and subtracts the exact bytes of
every host buffer the allocator trace saw (engines/buftrace). The figure is stored as JSON under
``cache_dir()/overhead``, keyed by the binary's path, size and mtime: a rebuilt binary is calibrated again.

``calibrated_overhead(binary)`` is what a supervisor reads at start: ``{"CPU": bytes}`` or None when this binary
was never calibrated.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fitevict.engines.base import Unavailable
from fitevict.engines.buftrace import buftrace_library, preload_env
from fitevict.engines.dryrun import follow_process
from fitevict.engines.llama_server import LlamaServerEngine
from fitevict.engines.process import free_port
from fitevict.host import procmem
from fitevict.host.machine import this_cpu
from fitevict.paths import cache_dir
from fitevict.pricing.buftrace import parse_exact_log
from fitevict.pricing.footprint import HOST
from fitevict.pricing.loadconfig import LoadConfig

CALIBRATION_CONFIG = LoadConfig(n_ctx=512, n_parallel=1)
CALIBRATION_MODEL = "llama-gqa"  # the zoo's smallest dense model
LISTENING = re.compile(r"server is listening on|llama_server: listening on")
FAILED = re.compile(r"failed to load model|error: |exiting due to|terminate called")


def _record_path(binary: Path) -> Path:
    st = binary.stat()
    ident = hashlib.sha256(str(binary.resolve()).encode()).hexdigest()[:12]
    # v2: measured as if the seat were alone (its binary's pages counted whole, not split with other seats)
    cpu = this_cpu().fingerprint  # the same binary on another CPU holds other pages
    return cache_dir() / "overhead" / f"{binary.name}-{ident}-{st.st_size}-{st.st_mtime_ns}-{cpu}-v2.json"


def calibrated_overhead(binary: str | Path) -> dict[str, int] | None:
    """The stored calibration of ``binary`` (device -> bytes of the process beyond its buffers), or None when this
    build (path, size, mtime) was never calibrated."""
    try:
        data = json.loads(_record_path(Path(binary)).read_text())
        return {str(d): int(n) for d, n in data["overhead"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True, slots=True)
class SeatMemory:
    """A seat's host memory once it listens: the process tree's PSS and its host buffers, to the byte."""

    pss_bytes: int
    buffer_bytes: int


def measure_seat(binary: Path, model: Path, cfg: LoadConfig, *, timeout_s: float = 120.0) -> SeatMemory | Unavailable:
    """Start ``model`` as a seat starts (the seat argv builder, warm-up included) with the allocator trace preloaded;
    once it listens, read its PSS and its host buffers' exact bytes, then stop it."""
    lib = buftrace_library()
    if isinstance(lib, Unavailable):
        return Unavailable(f"exact buffer bytes unavailable: {lib.reason}")
    spec = LlamaServerEngine(binary).launch_spec(model, cfg, free_port())
    seen: dict[str, procmem.ProcessMemory] = {}

    def on_line(line: str, _pid: int) -> str | None:
        if FAILED.search(line) and " D " not in line[:20]:
            return line.strip()
        return "" if LISTENING.search(line) else None

    def sample(pid: int) -> None:
        seen["pss"] = procmem.read_tree(pid)
        seen["binary"] = _binary_pages(pid, binary)

    lines, verdict, _pid = follow_process(list(spec.argv), timeout_s, on_line, before_stop=sample,
                                          env=preload_env(lib, dict(spec.env)))
    if verdict != "":
        return Unavailable(f"the seat did not come up on {model}: {verdict}")
    log = parse_exact_log("\n".join(lines))
    if log.precision_bytes:
        return Unavailable(f"buffers not exact: {'; '.join(log.notes)}")
    pss = seen.get("pss")
    if pss is None or pss.host_bytes is None:
        return Unavailable(f"no PSS for the seat ({pss.reason if pss else 'not sampled'})")
    rss_bin, pss_bin = seen.get("binary") or (0, 0)
    # PSS splits the engine binary's pages among every seat that maps them: a seat alone holds them whole, so the
    # calibration counts them whole (a conservative figure when several seats share the binary)
    return SeatMemory(pss.host_bytes - pss_bin + rss_bin, log.to_footprint().bytes_on(HOST))


def _binary_pages(pid: int, binary: Path) -> tuple[int, int]:
    """(Rss, Pss) bytes of ``pid``'s mappings of the engine binary itself, from /proc/PID/smaps."""
    target = str(Path(binary).resolve())
    rss = pss = 0
    inside = False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                first = line.split(None, 1)[0]
                if "-" in first and not first.endswith(":"):  # a mapping's header line
                    inside = line.rstrip().endswith(target)
                elif inside and first == "Rss:":
                    rss += int(line.split()[1]) * 1024
                elif inside and first == "Pss:":
                    pss += int(line.split()[1]) * 1024
    except OSError:
        return 0, 0
    return rss, pss


def calibrate_overhead(binary: str | Path, model: str | Path | None = None, *,
                       timeout_s: float = 120.0) -> dict | Unavailable:
    """Measure ``binary``'s process overhead on ``model`` (default: a freshly written zoo model) and store it.
    Returns the stored record: ``overhead`` (device -> bytes), ``pss_bytes``, ``buffer_bytes``, ``model``."""
    binary = Path(binary)
    with tempfile.TemporaryDirectory(prefix="fitevict-calibrate-") as tmp:
        if model is None:
            from fitevict.zoo import write_zoo

            model = write_zoo(Path(tmp), only=[CALIBRATION_MODEL])[0].path
        got = measure_seat(binary, Path(model), CALIBRATION_CONFIG, timeout_s=timeout_s)
    if isinstance(got, Unavailable):
        return Unavailable(f"cannot calibrate {binary}: {got.reason}")
    record = {"binary": str(binary.resolve()), "model": str(model), "config": CALIBRATION_CONFIG.to_json(),
              "pss_bytes": got.pss_bytes, "buffer_bytes": got.buffer_bytes,
              "overhead": {HOST: got.pss_bytes - got.buffer_bytes},
              "source": "measured: PSS (smaps_rollup; the binary's own pages counted whole, as for a seat alone) "
                        "minus the allocator's host buffer bytes"}
    path = _record_path(binary)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = path.with_suffix(f".tmp{os.getpid()}")
    tmp_path.write_text(json.dumps(record, indent=2))
    os.replace(tmp_path, path)
    return record
