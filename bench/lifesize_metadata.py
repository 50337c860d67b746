"""Metadata at life size: reading a GGUF's structure, and listing a folder of life-size models through the front door.
Writes the ``lifesize-metadata`` section of docs/benchmarks.md.

1. Per life-size model (``fitevict demo-models --life-size``), each in a fresh Python process with the file's pages
   dropped from the page cache first (``posix_fadvise(POSIX_FADV_DONTNEED)``): seconds and peak RSS growth to read
   its structure with fitevict's reader (``pricing.gguf.parse_structure``), and the same for ``gguf.GGUFReader``
   alone (which the structure used to be read with), side by side.
2. A folder of ``--listed`` models (hard links to the life-size files under other names, so each is a model of its
   own to the catalog), served by ``fitevict serve``: ``GET /api/tags`` and ``GET /v1/models`` the first time, again,
   and the first time after a restart (structures read from the store), with the front door's RSS sampled every
   5 ms against its idle RSS; then a first chat request's wait before its seat's engine process is spawned.

    .venv/bin/python bench/lifesize_metadata.py [--listed 20] [--no-reader] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import write_section  # noqa: E402
from _lifesize import life_size_models  # noqa: E402
from _serve import cpu_model, load_average, prices_read_ahead, serve  # noqa: E402

from fitevict.units import MiB

ONE = r"""
import os, sys, time
path, how = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
if how == "fitevict":
    from fitevict.pricing.gguf import parse_structure as read
else:
    from gguf import GGUFReader
    read = lambda p: GGUFReader(p, "r")
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak RSS (VmHWM) starts again from the RSS now
before = hwm()
t = time.perf_counter(); got = read(path); dt = time.perf_counter() - t
print(dt, hwm() - before)
"""


def read_once(path: Path, how: str) -> tuple[float, int]:
    """(seconds, peak RSS growth in bytes) of one cold read in a fresh process."""
    out = subprocess.run([sys.executable, "-c", ONE, str(path), how], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"reading {path.name} with {how} failed: {out.stderr[-800:]}")
    s, rss = out.stdout.split()
    return float(s), int(rss)


class RssPeak:
    """The peak RSS of one process, sampled every 5 ms by a thread while the block runs."""

    def __init__(self, pid: int) -> None:
        self.proc, self.peak, self._stop = psutil.Process(pid), 0, threading.Event()

    def __enter__(self) -> "RssPeak":
        self.peak = self.proc.memory_info().rss
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def timed_get(base: str, path: str, pid: int) -> tuple[float, int, int]:
    """(seconds, models listed, peak RSS while answering)."""
    with RssPeak(pid) as rss:
        t = time.perf_counter()
        r = httpx.get(base + path, timeout=900)
        dt = time.perf_counter() - t
    r.raise_for_status()
    body = r.json()
    return dt, len(body.get("models", body.get("data", []))), rss.peak


def seat_spawned(pid: int) -> bool:
    for c in psutil.Process(pid).children(recursive=True):
        try:
            cmd = c.cmdline()
        except psutil.Error:
            continue
        if "--fit" in cmd and cmd[cmd.index("--fit") + 1] == "off":
            return True
    return False


def first_request_wait(base: str, pid: int, model: str) -> float:
    """Seconds from sending a first chat request until its seat's engine process runs (the request is left to
    finish in the background)."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    t = time.perf_counter()
    threading.Thread(target=lambda: httpx.post(base + "/v1/chat/completions", json=body, timeout=900),
                     daemon=True).start()
    while not seat_spawned(pid):
        if time.perf_counter() - t > 600:
            raise SystemExit(f"{model}: no seat spawned within 600 s")
        time.sleep(0.002)
    return time.perf_counter() - t


def read_ahead_seconds(base: str, t0: float) -> float:
    """Seconds from the front door's start until it has read every model's price ahead (``/health``)."""
    prices_read_ahead(base)
    return time.monotonic() - t0


def listing(files: list[Path], n: int, tmp: Path) -> dict:
    folder = tmp / "models"
    folder.mkdir()
    for i in range(n):
        src = files[i % len(files)]
        os.link(src, folder / f"{src.stem}-{i:02d}.gguf")
    config = "[server]\nsample_seconds = 60\n"
    out: dict = {"listed": n, "bytes": sum(p.stat().st_size for p in folder.iterdir())}
    t0 = time.monotonic()
    with serve(tmp, "door", folder, config) as s:
        out["bare_rss"] = psutil.Process(s.pid).memory_info().rss
        httpx.get(s.base + "/api/version", timeout=60).raise_for_status()  # builds the admin/Ollama app once
        idle = psutil.Process(s.pid).memory_info().rss
        out["first"] = [timed_get(s.base, "/api/tags", s.pid), timed_get(s.base, "/v1/models", s.pid)]
        out["again"] = [timed_get(s.base, "/api/tags", s.pid), timed_get(s.base, "/v1/models", s.pid)]
        out["idle_rss"] = idle
        out["ahead_s"] = read_ahead_seconds(s.base, t0)
        first = next(p.stem for p in sorted(folder.iterdir()) if p.stem.startswith("qwen2.5-0.5b"))
        out["wait"] = (first, first_request_wait(s.base, s.pid, first))
    with serve(tmp, "door", folder, config) as s:  # the same data directory: the store has the structures
        httpx.get(s.base + "/api/version", timeout=60).raise_for_status()
        idle = psutil.Process(s.pid).memory_info().rss
        out["restart"] = [timed_get(s.base, "/api/tags", s.pid), timed_get(s.base, "/v1/models", s.pid)]
        out["restart_idle_rss"] = idle
    return out


def render(rows: list[dict], listed: dict, run: dict) -> str:
    lines = [
        "## Metadata at life size (`bench/lifesize_metadata.py`)", "",
        f"Run on {run['date']}, {run['cpu']} (`lscpu` model name), {run['cores']} cores, load average "
        f"{run['load']} at the end. Each read is a fresh Python "
        "process with the file's pages dropped from the page cache first; \"peak RSS growth\" is the process's peak "
        "RSS during the read less its RSS before it (`VmHWM` from `/proc/self/status`, reset through `/proc/self/clear_refs` just before the read; the file's pages that the read maps count). fitevict's figure is the whole structure pricing uses "
        "(`parse_structure`); `gguf.GGUFReader` is the library reader alone, which the structure was read with "
        "before.", "",
        "| model | file | vocabulary (merges) | fitevict: s | peak RSS growth | gguf.GGUFReader: s | peak RSS growth | "
        "ratio (GGUFReader / fitevict) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        theirs = r.get("reader")
        ratio = f"{theirs[0] / r['ours'][0]:,.0f}x" if theirs else "not run"
        t = f"{theirs[0]:.2f} | {theirs[1] / MiB:.1f} MiB" if theirs else "not run | not run"
        lines.append(f"| {r['model']} | {r['bytes'] / 1e9:.2f} GB | {r['vocab']:,} ({r['merges']:,}) | "
                     f"{r['ours'][0] * 1000:.1f} ms | {r['ours'][1] / MiB:.1f} MiB | {t} | {ratio} |")
    idle = listed["idle_rss"]

    def row(what: str, got: list) -> list[str]:
        return [f"| {what} | `{p}` | {n} | {dt * 1000:.0f} ms | {(peak - idle) / MiB:+.1f} MiB |"
                for p, (dt, n, peak) in zip(("/api/tags", "/v1/models"), got)]

    lines += [
        "", f"Listing: a folder of {listed['listed']} life-size models ({listed['bytes'] / 1e9:.1f} GB as files; hard "
        "links to the models above under other names, each a model of its own to the catalog) served by `fitevict "
        f"serve`. The front door's RSS after start-up: {listed['bare_rss'] / MiB:.1f} MiB, and {idle / MiB:.1f} MiB "
        "once its admin and Ollama routes are built (`GET /api/version`, which reads no model): its idle RSS here. "
        "\"Peak RSS\" is its RSS sampled every 5 ms while it answered, less that idle figure. Meanwhile it reads "
        "every model's price ahead in the background (below), so the first listing shares the machine with those "
        "reads.", "",
        "| when | route | models | answered in | peak RSS over idle |", "|---|---|---|---|---|",
        *row("first scan", listed["first"]), *row("again", listed["again"]),
    ]
    idle = listed["restart_idle_rss"]
    lines += [*row("after a restart (same store)", listed["restart"]), ""]
    model, wait = listed["wait"]
    lines += [f"The front door read every model's price ahead (`server.read_prices_ahead`: each structure and the "
              f"engine's dry run, one model at a time) {listed['ahead_s']:.1f} s after it was started. A first chat "
              f"request for `{model}` then waited {wait:.3f} s from being sent until its seat's engine process was "
              "spawned (the plan and the start).", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listed", type=int, default=20)
    ap.add_argument("--no-reader", action="store_true", help="skip gguf.GGUFReader (about a minute per file)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from fitevict.pricing.gguf import parse_structure

    models = life_size_models()
    rows = []
    for m in models:
        s = parse_structure(m.path)
        row = {"model": m.name, "bytes": m.path.stat().st_size, "vocab": s.n_vocab, "merges": s.n_merges,
               "ours": read_once(m.path, "fitevict")}
        if not args.no_reader:
            row["reader"] = read_once(m.path, "gguf")
        print(json.dumps(row), flush=True)
        rows.append(row)
    with tempfile.TemporaryDirectory(prefix="fitevict-lifesize-list-") as tmp:
        listed = listing([m.path for m in models], args.listed, Path(tmp))
    print(json.dumps(listed), flush=True)
    run = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_model(), "cores": os.cpu_count(),
           "load": load_average()}
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "listed": listed, "run": run}, indent=1))
    text = render(rows, listed, run)
    if args.no_write:
        print(text)
        return
    write_section("lifesize-metadata", text)
    print("wrote the lifesize-metadata section of docs/benchmarks.md")


if __name__ == "__main__":
    main()
