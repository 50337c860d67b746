"""The engine's own dry run: compute-buffer bytes per device, cached on disk; and real load logs.

The compute buffer has no closed form. llama-server's ``--fit`` step (on by default in the pinned build)
first loads the model and context with ``no_alloc``: nothing is read or allocated, but the worst-case
graph is reserved and ``sched_reserve: <buft> compute buffer size = X MiB`` is logged at debug level
(``-lv 5``). ``dry_run_compute`` reads those lines and stops the server when the fit step reports its
time, before the real load reads a weight.
(``llama-fit-params`` runs the same dry run, but without the server's slot-sized ``n_outputs_max`` and
without ``-kvu``, so it over-states the server's compute buffer.)

The same dry run sizes the context caches (``llama_kv_cache: size = ...`` and the per-layer ``dev = ...``
debug lines): ``dry_run`` returns them too, so an architecture fitevict has no KV rules for is still
priced fully (context source "dry-run").

Results are cached as JSON under ``cache_dir()/dryrun`` keyed by the file identity (path, size, mtime_ns),
the binary identity and the llama-server arguments, so each placement (``-dev``, ``-ngl``, ``--n-cpu-moe``, ``-ot``,
``-ts``) has its own entry: a GPU placement is dry-run as itself. With ``mmproj`` the same run also logs the
engine's estimate of the projector (weights plus compute), kept as ``DryRun.projector_estimate``.

``capture_load_log`` starts a real llama-server, returns its load log once every buffer is logged, and
stops it (process group, SIGTERM then SIGKILL): the measured counterpart of a price.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import selectors
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fitevict.engines.base import Unavailable
from fitevict.engines.llama_cpp.buftrace import buftrace_library, preload_env
from fitevict.engines.llama_cpp.server import load_args as server_args
from fitevict.pricing.buftrace import STOP_MARK
from fitevict.engines.process import free_port, orphan_proof, stop_group
from fitevict.engines.llama_cpp.machine import this_cpu
from fitevict.paths import cache_dir
from fitevict.pricing.footprint import HOST
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.logparse import DryContext, device_aliases, device_of, parse_dry_context
from fitevict.pricing.projector import parse_projector_estimate
from fitevict.units import MiB

SERVER = "llama-server"
CACHE_VERSION = 3


def _key(binary: Path, model: Path, args: list[str], loras: tuple[str, ...] = ()) -> str:
    st = model.stat()
    bst = binary.stat()
    adapters = [(str(Path(f).resolve()), Path(f).stat().st_size, Path(f).stat().st_mtime_ns) for f in loras]
    blob = json.dumps([CACHE_VERSION, str(model.resolve()), st.st_size, st.st_mtime_ns,
                       str(binary.resolve()), bst.st_size, bst.st_mtime_ns, args[2:], *([adapters] if loras else []),
                       this_cpu().fingerprint,  # the same build on another CPU sizes other buffers
                       # which Vulkan devices the engine is shown (only when set: earlier keys stay the same)
                       *([os.environ["GGML_VK_VISIBLE_DEVICES"]] if "GGML_VK_VISIBLE_DEVICES" in os.environ else [])])
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class DryRun:
    """What one dry run sized: compute bytes per device, and the context caches (None if it logged none)."""

    compute: dict[str, int]
    context: DryContext | None
    projector_estimate: int | None = None  # with --mmproj: the engine's projector weights + compute (2-decimal MiB)
    # the fit step's memory breakdown: whole MiB of weights per row ("Host", "AMX", "CPU_REPACK", "CUDA0", ...)
    model_mib: dict[str, int] = field(default_factory=dict)


def dry_run_compute(binary_dir: str | Path, model_path: str | Path, cfg: LoadConfig,
                    *, timeout_s: float = 120.0, use_cache: bool = True,
                    extra_args: tuple[str, ...] = ()) -> dict[str, int] | Unavailable:
    """Compute-buffer bytes per device ("CPU", "CUDA0", ...) from the engine's own dry run, or why not.

    llama-server's ``--fit`` step (on by default) first builds the model and context with ``no_alloc``:
    nothing is read or allocated, but the graph is reserved and its compute buffer sizes are logged at
    debug level. The server is stopped as soon as the real load starts, before any weight is read. This
    uses the server's own context parameters (its ``n_outputs_max`` is the slot count, which
    ``llama-fit-params`` cannot reproduce).
    """
    res = dry_run(binary_dir, model_path, cfg, timeout_s=timeout_s, use_cache=use_cache, extra_args=extra_args)
    return res if isinstance(res, Unavailable) else res.compute


def dry_run(binary_dir: str | Path, model_path: str | Path, cfg: LoadConfig, *, timeout_s: float = 120.0,
            use_cache: bool = True, extra_args: tuple[str, ...] = (),
            mmproj: str | Path | None = None) -> DryRun | Unavailable:
    """The engine's dry run for ``cfg``: compute bytes per device and the KV / SWA / recurrent caches it sized
    (``llama_kv_cache: size = ...`` with the per-layer devices of its ``-lv 5`` lines), or why not."""
    binary = Path(binary_dir) / SERVER
    model = Path(model_path)
    if not binary.is_file() or not os.access(binary, os.X_OK):
        return Unavailable(f"no executable {SERVER} in {binary_dir}; run: fitevict engine install llama.cpp")
    try:
        args = server_args(model, cfg, extra_args, mmproj)
        key = _key(binary, model, args, cfg.loras)
    except (OSError, ValueError) as err:
        return Unavailable(f"{model}: cannot prepare the dry run: {err}")
    cdir = cache_dir() / "dryrun"
    cfile = cdir / f"{key}.json"
    if use_cache:
        try:
            cached = json.loads(cfile.read_text())
            ctx = cached["context"]
            return DryRun({str(k): int(v) for k, v in cached["compute"].items()},
                          DryContext.from_json(ctx) if ctx else None, cached.get("projector_estimate"),
                          {str(k): int(v) for k, v in cached.get("model_mib", {}).items()})
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError):
            pass  # an unreadable cache entry is recomputed below and overwritten
    argv = [str(binary), *args, "--fit", "on", "-lv", "5", "--host", "127.0.0.1", "--port", str(free_port()),
            "-t", "1"]
    text, reason = _run_until(argv, FIT_DONE, timeout_s)
    found = parse_dry_compute(text)
    if not found:
        tail = " | ".join(l.strip() for l in text.splitlines()[-3:] if l.strip())
        return Unavailable(f"the {SERVER} dry run logged no compute buffer for {model}"
                           f"{': ' + reason if reason else ''}; last lines: {tail}")
    found.setdefault(HOST, 0)
    context = parse_dry_context(text)
    estimate = parse_projector_estimate(text) if mmproj is not None else None
    model_mib = parse_dry_model_rows(text)
    try:
        cdir.mkdir(parents=True, exist_ok=True)
        tmp = cfile.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"argv": args, "compute": found, "context": context.to_json() if context else None,
                                   "projector_estimate": estimate, "model_mib": model_mib}))
        os.replace(tmp, cfile)
    except OSError:
        pass  # caching is an optimisation; the figure itself is still returned
    return DryRun(found, context, estimate, model_mib)


FIT_DONE = re.compile(r"fitting params to free memory took|failed to fit params")
_DRY_COMPUTE = re.compile(r"sched_reserve:\s+(\S+) compute buffer size =\s+([0-9.]+) MiB")
_DRY_START = re.compile(r"llama_context: constructing llama_context")


def parse_dry_compute(text: str) -> dict[str, int]:
    """Compute bytes per budget device from the last dry-run reservation in a ``-lv 5`` server log."""
    out: dict[str, int] = {}
    aliases = device_aliases(text)  # RPC0[HOST:PORT] -> the RPC device it is
    for line in text.splitlines():
        if _DRY_START.search(line):
            out = {}
        elif m := _DRY_COMPUTE.search(line):
            dev = device_of(m.group(1), aliases)
            out[dev] = out.get(dev, 0) + round(float(m.group(2)) * MiB)
        elif FIT_DONE.search(line):
            break
    return out


_BREAKDOWN_ROW = re.compile(r"common_memory_breakdown_print: \|\s+- (\S+).*?\|\s+(\d+) =\s+(\d+) \+\s+(\d+) \+\s+(\d+)")


def parse_dry_model_rows(text: str) -> dict[str, int]:
    """The fit step's first memory breakdown: whole MiB of weights per row (``Host``, ``AMX``, ``CUDA0``, ...)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if m := _BREAKDOWN_ROW.search(line):
            if m.group(1) in out:
                break  # the next breakdown begins
            out[m.group(1)] = int(m.group(3))
        elif FIT_DONE.search(line):
            break
    return out


def follow_process(argv: list[str], timeout_s: float, on_line: Callable[[str, int], str | None], *,
            before_stop: Callable[[int], None] | None = None,
            env: dict[str, str] | None = None) -> tuple[list[str], str | None, int]:
    """Run ``argv`` in its own process group and read its output line by line until ``on_line`` returns a
    verdict ("" = done, anything else = the failure), the process exits, or ``timeout_s`` passes; then call
    ``before_stop(pid)`` and stop the group. Returns the lines, the verdict (a reason when no line gave one)
    and the pid."""
    spawned, preexec = orphan_proof(argv)
    proc = subprocess.Popen(spawned, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=preexec, env=env)
    assert proc.stdout is not None
    lines: list[str] = []
    verdict: str | None = None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    buf = b""
    try:
        while verdict is None:
            left = deadline - time.monotonic()
            if left <= 0:
                verdict = f"{Path(argv[0]).name}: no verdict within {timeout_s:.0f} s"
                break
            if not sel.select(timeout=left):
                continue
            data = os.read(proc.stdout.fileno(), 65536)
            if not data:
                verdict = f"{Path(argv[0]).name} exited with {proc.wait()}"
                break
            *done, buf = (buf + data).split(b"\n")
            for raw in done:
                line = raw.decode("utf-8", "replace")
                lines.append(line)
                verdict = on_line(line, proc.pid)
                if verdict is not None:
                    break
        if verdict == "" and before_stop is not None:
            before_stop(proc.pid)
    finally:
        sel.close()
        lines.append(STOP_MARK)  # what the process writes from here on is its shutdown, not its load
        stop_group(proc)
        rest = proc.stdout.read() or b""
        if buf or rest:
            lines.extend((buf + rest).decode("utf-8", "replace").splitlines())
        proc.stdout.close()
    return lines, verdict, proc.pid


def _run_until(argv: list[str], stop: re.Pattern[str], timeout_s: float) -> tuple[str, str]:
    """Run ``argv`` until a line matches ``stop``; returns the output and, if it never did, why."""
    lines, verdict, _pid = follow_process(argv, timeout_s, lambda line, _pid: "" if stop.search(line) else None)
    return "\n".join(lines), verdict or ""


# --- the measured counterpart: a real llama-server load log ------------------------------------------

LOG_DONE = re.compile(r"sched_reserve: graph: nodes|llama_server: listening on|srv\s+load_model: initializing")
LOAD_START = re.compile(r"srv\s+load_model: loading model")
LOG_FAIL = re.compile(r"failed to load model|error: |exiting due to|terminate called")


@dataclass(frozen=True, slots=True)
class CapturedLoad:
    text: str
    pid: int
    ok: bool
    reason: str = ""
    smaps: dict[str, int] | None = None  # /proc/PID/smaps_rollup fields (bytes) once the model was loaded
    smaps_before: dict[str, int] | None = None  # the same, when the server announced it starts loading


def _smaps(pid: int) -> dict[str, int] | None:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[-1] == "kB":
            out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out


def capture_load_log(binary_dir: str | Path, model_path: str | Path, cfg: LoadConfig, *,
                     port: int = 0, timeout_s: float = 60.0, wait_listening: bool = False,
                     extra_args: tuple[str, ...] = (), exact: bool = False,
                     mmproj: str | Path | None = None, warmup: bool = False,
                     on_ready: Callable[[int], None] | None = None) -> CapturedLoad:
    """Start llama-server for ``cfg`` at ``-lv 4``, read its log until every buffer is reported (or it
    listens, with ``wait_listening``), sample smaps_rollup, then stop the process group. ``exact``: preload the
    allocator trace (llama_cpp/buftrace), so ``pricing.buftrace.parse_exact_log`` reads every buffer to the byte; a
    trace that cannot be built fails the capture with the reason. ``on_ready(pid)`` reads the loaded process
    (a device's own reading, say) before it is stopped."""
    binary = Path(binary_dir) / SERVER
    argv = [str(binary), *server_args(model_path, cfg, extra_args, mmproj), "-lv", "4", "--host", "127.0.0.1",
            "--port", str(port or free_port()), *([] if warmup else ["--no-warmup"]), "-t", "1"]
    done = re.compile(r"llama_server: listening on") if wait_listening else LOG_DONE
    seen: dict[str, dict[str, int] | None] = {"before": None, "after": None}

    def on_line(line: str, pid: int) -> str | None:
        if LOG_FAIL.search(line) and " D " not in line[:20]:
            return line.strip()
        if seen["before"] is None and LOAD_START.search(line):
            seen["before"] = _smaps(pid)
        return "" if done.search(line) else None

    def sample(pid: int) -> None:
        seen["after"] = _smaps(pid)
        if on_ready is not None:
            on_ready(pid)

    env = None
    if exact:
        lib = buftrace_library()
        if isinstance(lib, Unavailable):
            return CapturedLoad("", 0, False, f"exact bytes unavailable: {lib.reason}")
        env = preload_env(lib)
    lines, verdict, pid = follow_process(argv, timeout_s, on_line, before_stop=sample, env=env)
    ok = verdict == ""
    if not ok and verdict and "exited with" in verdict:
        verdict = f"llama-server {verdict.split(' ', 1)[1]} before the buffers were logged"
    elif not ok and verdict and "no verdict" in verdict:
        verdict = f"llama-server did not finish loading within {timeout_s:.0f} s"
    return CapturedLoad("\n".join(lines), pid, ok, "" if ok else (verdict or ""),
                        seen["after"] if ok else None, seen["before"])


