"""Load and swap time at life size: fitevict against llama-server started directly, and against reading the file.
Writes the ``lifesize-swap`` section of docs/benchmarks.md.

Per model, side by side in one run, each cold (the file's pages dropped with ``posix_fadvise(POSIX_FADV_DONTNEED)``)
and warm (its pages in the page cache):
- reading the file once, start to end, in 16 MiB reads;
- llama-server started directly with the argv a seat gets (``LlamaServerEngine.launch_spec``), until its first
  token (``/health`` polled every 10 ms, then the same chat completion with ``max_tokens`` 1);
- through ``fitevict serve`` (after it has read the prices ahead): a chat completion with ``max_tokens`` 1 for a
  model that is not resident, until its answer.

Then a swap A -> B -> A under a RAM budget that holds either model but not both: each request is streamed with
``x-fitevict-progress: 1``, and the arrival of each progress comment (plan, evict, start, weights, ready) and of
the first token splits it into phases. fitevict's own share of a swap is its time to first token less the direct
engine's (warm) and less the evicted engine's own exit (the ``evict`` record's stop seconds).

    .venv/bin/python bench/lifesize_swap.py [--models a,b] [--swap A,B] [--no-write] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import write_section  # noqa: E402
from _lifesize import life_size_models  # noqa: E402
from _serve import cpu_model, engine_first_token, load_average, prices_read_ahead, serve, spawn_engine  # noqa: E402

from fitevict.engines.llama_cpp.install import resolve_binary
from fitevict.engines.process import stop_group
from fitevict.units import MiB

N_CTX = 4096  # a model's default contract (docs/config.md: ctx 4096, parallel 1), which the requests below get
CONFIG = ""


def drop(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_file(path: Path) -> float:
    t = time.perf_counter()
    with path.open("rb", buffering=0) as f:
        while f.read(16 * MiB):
            pass
    return time.perf_counter() - t


def direct(binary: Path, path: Path) -> float:
    """Seconds from spawning llama-server with a seat's argv until its first token."""
    t = time.perf_counter()
    proc, base = spawn_engine(binary, path, N_CTX)
    try:
        engine_first_token(proc, base, path.name, 0.01)
        return time.perf_counter() - t
    finally:
        stop_group(proc, 30.0)


def through(base: str, model: str) -> float:
    t = time.perf_counter()
    r = httpx.post(base + "/v1/chat/completions", timeout=900, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    r.raise_for_status()
    return time.perf_counter() - t


def unload(base: str, model: str) -> None:
    httpx.post(f"{base}/v1/models/{model}/unload", timeout=300).raise_for_status()


def swap_step(base: str, model: str) -> dict:
    """One streamed request with progress comments: the arrival of each phase, seconds from sending."""
    t = time.perf_counter()
    marks: list[tuple[str, float]] = []
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "stream": True}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=900,
                      headers={"x-fitevict-progress": "1"}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            now = time.perf_counter() - t
            if line.startswith(": fitevict-progress "):
                marks.append((json.loads(line.split(" ", 2)[2])["phase"], now))
            elif line.startswith("data: ") and '"choices"' in line:
                marks.append(("first token", now))
                break
    return {"model": model, "marks": marks, "total": marks[-1][1] if marks else None}


def last_stop(base: str) -> float | None:
    r = httpx.get(base + "/v1/models/history", params={"event": "evict", "limit": 1}, timeout=30)
    r.raise_for_status()
    data = r.json()["data"]
    return data[0]["seconds"] if data else None


def measure(names: list[str], swap: tuple[str, str], repeat: int = 3) -> dict:
    binary = resolve_binary("llama-server").path
    if binary is None:
        raise SystemExit("no llama-server: run fitevict engine install llama.cpp")
    models = {m.name: m.path for m in life_size_models(sorted({*names, *swap}))}
    rows = []
    for name in names:
        path = models[name]
        row = {"model": name, "bytes": path.stat().st_size}
        drop(path)
        row["read_cold"], row["read_warm"] = read_file(path), read_file(path)
        drop(path)
        row["direct_cold"] = direct(binary, path)
        row["direct_warm"] = statistics.median(direct(binary, path) for _ in range(repeat))
        rows.append(row)
        print(json.dumps(row), flush=True)
    with tempfile.TemporaryDirectory(prefix="fitevict-swap-") as tmp:
        folder = Path(tmp) / "models"
        folder.mkdir()
        for name in {*names, *swap}:
            (folder / f"{name}.gguf").symlink_to(models[name])
        with serve(Path(tmp), "door", folder, CONFIG) as s:
            prices_read_ahead(s.base)
            for row in rows:
                drop(models[row["model"]])
                row["fitevict_cold"] = through(s.base, row["model"])
                unload(s.base, row["model"])
                warm = []
                for _ in range(repeat):
                    warm.append(through(s.base, row["model"]))
                    unload(s.base, row["model"])
                row["fitevict_warm"] = statistics.median(warm)
                print(json.dumps(row), flush=True)
            limits = resident_bytes(s.base, swap)
        budget = max(limits.values()) + min(limits.values()) // 2  # either one, never both
        with serve(Path(tmp), "swap", folder, CONFIG + f"[budget]\nram_limit = {budget}\nram_reserve = 0\n") as s:
            prices_read_ahead(s.base)
            a, b = swap
            steps = []
            for model in (a, b, a):
                step = swap_step(s.base, model)
                step["stop"] = last_stop(s.base) if steps else None
                steps.append(step)
                print(json.dumps(step), flush=True)
    return {"rows": rows, "swap": steps, "swap_budget": budget, "resident": limits, "repeat": repeat,
            "run": {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_model(),
                    "cores": os.cpu_count(), "load": load_average()}}


def resident_bytes(base: str, names: tuple[str, str]) -> dict[str, int]:
    """Each model's planned host bytes, loaded alone (the figure the planner counts)."""
    out = {}
    for name in names:
        through(base, name)
        view = {v["key"]: v for v in httpx.get(base + "/v1/models/residents", timeout=30).json()["data"]}[name]
        out[name] = view["devices"]["CPU"]["planned_bytes"]
        unload(base, name)
    return out


def render(res: dict) -> str:
    run = res["run"]
    lines = [
        "## Load and swap time at life size (`bench/lifesize_swap.py`)", "",
        f"Run on {run['date']}, {run['cpu']} (`lscpu` model name), {run['cores']} cores, load average {run['load']} "
        f"at the end; CPU only, `-c {N_CTX} -np 1`. Cold: the file's pages dropped from the page cache first "
        f"(`posix_fadvise(POSIX_FADV_DONTNEED)`); warm: in it, the median of {res.get('repeat', 1)} runs. \"Direct\" "
        "is llama-server started with the argv a seat gets, until its first token; \"fitevict\" is a chat completion (`max_tokens` 1) for the model not resident, "
        "after the front door read the prices ahead, until its answer.", "",
        "| model | file | read cold | read warm | direct cold | fitevict cold | direct warm | fitevict warm | "
        "fitevict / direct (warm) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(f"| {r['model']} | {r['bytes'] / 1e9:.2f} GB | {r['read_cold']:.2f} s | {r['read_warm']:.2f} s | "
                     f"{r['direct_cold']:.2f} s | {r['fitevict_cold']:.2f} s | {r['direct_warm']:.2f} s | "
                     f"{r['fitevict_warm']:.2f} s | {r['fitevict_warm'] / r['direct_warm']:.2f}x |")
    direct = {r["model"]: r["direct_warm"] for r in res["rows"]}
    lines += ["", f"Swap: a RAM budget of {res['swap_budget'] / MiB:,.0f} MiB holds either model (planned "
              + ", ".join(f"{k} {v / MiB:,.0f} MiB" for k, v in res["resident"].items()) + ") but not both. "
              "Each column is when that phase's progress comment arrived, in seconds from sending (the progress is "
              "polled every 0.1 s, so each mark may lag by that much); \"own\" is the time to first token less the "
              "direct engine's warm time to first token and less the evicted engine's own stop (its `evict` "
              "record's seconds).", "",
              "| request | plan | evict (stopped, release verified) | engine started | weights | ready | first token "
              "| evicted seat's stop | own | own / direct |", "|---|---|---|---|---|---|---|---|---|---|"]
    for i, step in enumerate(res["swap"]):
        marks = dict(step["marks"])
        cell = [f"{marks[p]:.2f}" if p in marks else "-" for p in ("plan", "evict", "start", "weights", "ready",
                                                                  "first token")]
        stop = step["stop"]
        d = direct.get(step["model"])
        own = step["total"] - (d or 0) - (stop or 0) if step["total"] is not None and d else None
        lines.append(f"| {i + 1}. {step['model']} | {' | '.join(cell)} | "
                     f"{f'{stop:.2f} s' if stop is not None else 'none'} | "
                     f"{f'{own:+.2f} s' if own is not None else 'unavailable'} | "
                     f"{f'{100 * own / d:+.1f}%' if own is not None and d else 'unavailable'} |")
    return "\n".join([*lines, ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen2.5-0.5b,llama-3.2-1b,gemma-3-1b,qwen3-30b-a3b-6l,llama-3.1-8b")
    ap.add_argument("--swap", default="llama-3.2-1b,gemma-3-1b")
    ap.add_argument("--repeat", type=int, default=3, help="warm times are the median of this many")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--render", type=Path)
    args = ap.parse_args()
    if args.render:
        res = json.loads(args.render.read_text())
    else:
        a, b = args.swap.split(",")
        res = measure([x for x in args.models.split(",") if x], (a, b), args.repeat)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    text = render(res)
    if args.no_write:
        print(text)
        return
    write_section("lifesize-swap", text)
    print("wrote the lifesize-swap section of docs/benchmarks.md")


if __name__ == "__main__":
    main()
