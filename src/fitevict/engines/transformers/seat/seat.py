"""One seat's life: load, walk, serve, and the teardown leak breaker.

Teardown, in order:
1. drop every reference the seat holds (``del`` + ``gc.collect()``);
2. any weakref'd tensor still alive is this model's leak: named by module path, with its bytes;
3. only then ``malloc_trim(0)`` (and ``torch.cuda.empty_cache()`` on a GPU), and the PSS that came back is measured.
All weakrefs dead with PSS still held above the pre-load baseline is allocator retention, reported apart from leaks.
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fitevict.engines.transformers.seat import model as m
from fitevict.engines.transformers.seat.adapters import attach
from fitevict.engines.transformers.seat.walk import Walk, live_referents, walk
from fitevict.host.procmem import ProcessMemory, read_process
from fitevict.pricing.hf_price import HfLoadConfig

# how long a teardown waits for an answer in progress to end at its next token (it is cut: http.Handler._gone)
DRAIN_SECONDS = 10.0
# committed memory above the pre-load baseline after teardown that counts as allocator retention; below it is the
# runtime state a first request creates (thread pools, generation caches), not the model
LEAK_FLOOR_BYTES = 8 << 20


def _mem() -> ProcessMemory:
    return read_process(os.getpid())


def _mem_json(pm: ProcessMemory) -> dict:
    return {"committed_bytes": pm.committed_bytes, "mapped_bytes": pm.mapped_bytes, "rss_bytes": pm.rss_bytes,
            "source": pm.source, **({"reason": pm.reason} if pm.reason else {})}


def files_pss(folder: Path) -> int | None:
    """Pss of this process's mappings of files under ``folder`` (the model's checkpoint pages), from smaps."""
    prefix = str(folder.resolve()) + os.sep
    total, inside = 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 5)
                if head and not head[0].endswith(":"):  # a mapping's header line: range perms offset dev inode path
                    inside = len(head) == 6 and head[5].strip().startswith(prefix)
                elif inside and head and head[0] == "Pss:":
                    total += int(head[1]) * 1024
    except OSError:
        return None
    return total


def malloc_trim() -> bool:
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except OSError:
        return False


@dataclass
class HfSeat:
    """The model a transformers seat serves, inside the seat's own process: its load, its state and what it holds
    (the supervisor's record of the same seat is ``schedule.seats.Seat``, its process ``seat.running.SeatState``)."""

    path: Path
    cfg: HfLoadConfig
    test_keep: str | None = None  # test hook: keep a reference to this tensor past teardown (a deliberate leak)
    state: str = "loading"  # loading | ready | failed | unloaded
    reason: str = ""
    loaded: m.Loaded | None = None
    runner: m.Runner | None = None
    footprint: dict = field(default_factory=dict)
    _walk: Walk | None = None
    _baseline: ProcessMemory | None = None
    _kept: list = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)  # set once its teardown begins

    def load(self) -> None:
        """Load and walk; a walk that finds no weights from the files is a failed load (state 'failed', reason)."""
        m.prepare(self.path, self.cfg)
        gc.collect()
        malloc_trim()
        self._baseline = _mem()
        loaded = m.load(self.path, self.cfg)
        w = walk(loaded.obj)
        missing = set(loaded.missing_from_files)
        from_files = w.weight_bytes - sum(h.bytes for h in w.held if h.path in missing)
        if from_files <= 0:
            self.state, self.reason = "failed", (
                f"no weights: the object walk of {self.path} found {w.weight_bytes} B of parameters, "
                f"{from_files if from_files > 0 else 0} B of them from the checkpoint "
                f"({len(loaded.missing_from_files)} parameters missing from the files, randomly initialised); "
                "refusing the load. Check that the safetensors files belong to this config.json")
            del loaded, w
            gc.collect()
            return
        adapters: tuple = ()
        if self.cfg.adapters:  # the base wrapped once, with every adapter (adapters.attach); walked again with them
            t0 = time.monotonic()
            loaded.obj, adapters = attach(loaded.obj, self.cfg.adapters)
            loaded.load_seconds += time.monotonic() - t0
            w = walk(loaded.obj)
        w.missing_from_files = loaded.missing_from_files
        if self.test_keep:
            self._kept += [t for path, _, ref in w.refs if path == self.test_keep and (t := ref()) is not None]
        self.loaded, self._walk = loaded, w
        self.runner = (m.Runner(loaded, tuple(a.name for a in adapters)) if loaded.kind == "causal-lm" else None)
        after = _mem()
        held = w.adapter_bytes()
        self.footprint = {
            "model": str(self.path), "kind": loaded.kind, "config": self.cfg.to_json(),
            "walk": w.to_json(), "load_seconds": round(loaded.load_seconds, 4),
            # each adapter's own load inside load_seconds, and the bytes the walk found for it
            "adapters": [{**a.to_json(), "bytes": held.get(a.name, 0)} for a in adapters],
            # baseline: the seat's own memory before the model (its overhead, measured once per engine)
            "process": {"baseline": _mem_json(self._baseline),
                        "loaded": {**_mem_json(after), "model_files_pss_bytes": files_pss(self.path)}},
            "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
        }
        self.state = "ready"

    def process_now(self) -> dict:
        return {**_mem_json(_mem()), "model_files_pss_bytes": files_pss(self.path)}

    def unload(self) -> dict:
        """The teardown leak breaker. Idempotent: a second call returns the first report."""
        with self._lock:
            if self.state == "unloaded":
                return self.footprint.get("teardown", {})
            if self.state != "ready":
                return {"verdict": "not-loaded", "state": self.state, "reason": self.reason}
            drain = self._drain()
            before = _mem()
            refs = self._walk.refs if self._walk else []
            t0 = time.monotonic()
            self.runner = None
            self.loaded = None
            self._walk = None
            gc.collect()
            leaks = live_referents(refs)
            after_gc = _mem()
            trimmed = malloc_trim()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            after = _mem()
            base = self._baseline
            held = _minus(after.committed_bytes, base.committed_bytes if base else None)
            report = {
                "leaks": [{"path": p, "bytes": b} for p, b in leaks],
                "leaked_bytes": sum(b for _, b in leaks),
                "watched_tensors": len(refs),
                "committed_before": before.committed_bytes, "committed_after_gc": after_gc.committed_bytes,
                "committed_after_trim": after.committed_bytes,
                "returned_bytes": _minus(before.committed_bytes, after.committed_bytes),  # None: not measured
                "held_above_baseline_bytes": held, "malloc_trim": trimmed,
                "seconds": round(time.monotonic() - t0, 4), "in_flight": drain,
                "verdict": ("leak" if leaks else "allocator-retention" if held is not None and held > LEAK_FLOOR_BYTES
                            else "clean"),
                "source": "measured",
            }
            self.footprint["teardown"] = report
            self.state = "unloaded"
            return report


    def _drain(self) -> str:
        """Before the teardown: the answer in progress, if any, ends at its next token (cut: never sent as whole)
        and lets the model go, so that the leak breaker never counts the tensors it still uses. Says how it went;
        the runner's lock stays held, so no answer starts on a seat going away."""
        self.stopping.set()
        runner, t0 = self.runner, time.monotonic()
        if runner is None:
            return "none"
        if runner.lock.acquire(blocking=False):
            return "none"
        if runner.lock.acquire(timeout=DRAIN_SECONDS):
            return f"an answer was cut; it ended {time.monotonic() - t0:.2f} s after the teardown began"
        return (f"an answer was still running {DRAIN_SECONDS:g} s after the teardown began (no token in that time): "
                "the tensors it holds are named as leaks below")


def _minus(a: int | None, b: int | None) -> int | None:
    """a - b, or None when either reading is unavailable (never a stand-in 0)."""
    return None if a is None or b is None else a - b
