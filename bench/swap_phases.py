"""A swap A -> B through fitevict against the direct engine's own swap, side by side in one run, split by phase.
Writes the ``swap-phases`` section of docs/benchmarks.md.

Two models that a RAM budget holds one at a time. Each round, alternately:
- **direct**: llama-server serving A (the argv a seat gets, ``LlamaServerEngine.launch_spec``, with ``-nr`` where the
  door's own seat of that model runs with it: a build whose repacking crashes) is sent SIGTERM; once it has exited,
  llama-server is spawned on B, ``/health`` polled every 5 ms, then a chat completion with
  ``max_tokens`` 1 until its answer: the engine's own stop plus its spawn to first token;
- **fitevict**: a front door serving A (prices read ahead) is sent a streamed chat completion for B (``max_tokens``
  1) until the first chunk with a choice. The door runs with ``FITEVICT_PHASE_MARKS=1``: each phase mark of the stop
  and the load (``fitevict.phase``) is read from its log on the same clock as the client's, so the table says where
  every 10 ms went. What the door does after B's slot is free (A's stop recorded) is off the swap's path: its
  offset from the release is shown apart.

Both sides are measured from the outside; fitevict's records are never the ruler.

    .venv/bin/python bench/swap_phases.py [--swap A,B] [--rounds 6] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import re
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

from fitevict.engines.llama_cpp.install import resolve_binary  # noqa: E402
from fitevict.engines.process import stop_group  # noqa: E402
from fitevict.units import MiB  # noqa: E402

N_CTX = 4096
BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
MARK = re.compile(r"fitevict\.phase phase (\S+) (.+) (\d+\.\d+)$")
# the marks in the order a swap passes them: (model, mark); "A" is the evicted model, "B" the loaded one
ORDER = (("B", "asked"), ("A", "stop begins"), ("A", "prompts saved"), ("A", "read before the stop"), ("A", "exited"),
         ("A", "release verified"), ("B", "load begins"), ("B", "priced"), ("B", "spawned"),
         ("B", "healthy"), ("B", "handed to its waiters"), ("B", "seat held"))
OFF_PATH = (("A", "release verified"), ("A", "stop recorded"))  # the stop's record: written beside B's load


def direct_swap(binary: Path, running: tuple[subprocess.Popen, str], path: Path, repack: bool
                ) -> tuple[dict, tuple]:
    """SIGTERM the running engine; once it exited, spawn one on ``path`` until its first token."""
    t0 = time.monotonic()
    stop_group(running[0], 30.0)
    t1 = time.monotonic()
    new = spawn_engine(binary, path, N_CTX, repack=repack)
    engine_first_token(*new, path.name)
    t2 = time.monotonic()
    return {"stop": t1 - t0, "spawn_to_first_token": t2 - t1, "total": t2 - t0}, new


def door_swap(base: str, model: str, log: Path, evicted: str) -> dict:
    """One streamed request for ``model`` while ``evicted`` holds the budget: its time to first token and the door's
    marks, in seconds from sending."""
    seen = log.read_text().count("\n")
    t0 = time.monotonic()
    with httpx.stream("POST", base + "/v1/chat/completions", json={**BODY, "model": model, "stream": True},
                      timeout=900) as r:
        if r.status_code != 200:
            raise SystemExit(f"{model}: the door answered {r.status_code}: {r.read().decode()[:2000]}")
        for line in r.iter_lines():
            if line.startswith("data: ") and '"choices"' in line:
                break
    t1 = time.monotonic()
    marks: dict[str, float] = {}
    for line in log.read_text().splitlines()[seen:]:
        m = MARK.search(line)
        if m and m.group(1) in (model, evicted):
            role = "B" if m.group(1) == model else "A"
            marks.setdefault(f"{role}:{m.group(2)}", float(m.group(3)) - t0)
    return {"model": model, "evicted": evicted, "total": t1 - t0, "marks": marks}


def measure(swap: tuple[str, str], rounds: int) -> dict:
    binary = resolve_binary("llama-server").path
    if binary is None:
        raise SystemExit("no llama-server: run fitevict engine install llama.cpp")
    paths = {m.name: m.path for m in life_size_models(list(swap))}
    out: dict = {"swap": list(swap), "rounds": [], "cpu": cpu_model(), "load_before": load_average()}
    with tempfile.TemporaryDirectory(prefix="fitevict-swap-phases-") as tmp:
        folder = Path(tmp) / "models"
        folder.mkdir()
        for name, path in paths.items():
            (folder / f"{name}.gguf").symlink_to(path)
        planned, repack = planned_bytes(Path(tmp), folder, swap)
        out["repack"] = repack
        budget = max(planned.values()) + min(planned.values()) // 2  # either model, never both
        out["planned"], out["budget"] = planned, budget
        cfg = f"[budget]\nram_limit = {budget}\nram_reserve = 0\n[policy]\nmin_residency_seconds = 0\n"
        with serve(Path(tmp), "door", folder, cfg, {"FITEVICT_PHASE_MARKS": "1"}) as s:
            prices_read_ahead(s.base)
            log = Path(tmp) / "door" / "serve.log"
            for name in (swap[1], swap[0]):  # each loaded once first: what the door learns at a first load (a
                # build whose repacking crashes: -nr from then on) is not part of any measured swap
                warm = httpx.post(s.base + "/v1/chat/completions", timeout=900, json={**BODY, "model": name})
                if warm.status_code != 200:
                    raise SystemExit(f"{name}: the door answered {warm.status_code}: {warm.text[:2000]}")
            running = spawn_engine(binary, paths[swap[0]], N_CTX, repack=repack[swap[0]])
            engine_first_token(*running, swap[0])
            for i in range(rounds):
                a, b = (swap[0], swap[1]) if i % 2 == 0 else (swap[1], swap[0])
                d, running = direct_swap(binary, running, paths[b], repack[b])
                f = door_swap(s.base, b, log, a)
                out["rounds"].append({"from": a, "to": b, "direct": d, "fitevict": f})
                print(json.dumps(out["rounds"][-1]), flush=True)
            stop_group(running[0], 30.0)
    out["load_after"] = load_average()
    return out


def planned_bytes(tmp: Path, folder: Path, swap: tuple[str, str]) -> tuple[dict[str, int], dict[str, bool]]:
    """Each model's planned host bytes, loaded alone on a door with no budget to speak of, and whether its seat
    repacks (False: the build's repacking crashed, and the seat runs with ``-nr``). The door's data dir is the one
    the swaps' door starts from: what a first load taught (a crash of repacking, each file's measured price) is
    known there before the first swap."""
    out, repack = {}, {}
    with serve(tmp, "door", folder, "") as s:  # the swaps' door, in its own data dir: what it learns here it keeps
        prices_read_ahead(s.base)
        for name in swap:
            httpx.post(s.base + "/v1/chat/completions", timeout=900, json={**BODY, "model": name}).raise_for_status()
            view = {v["key"]: v for v in httpx.get(s.base + "/v1/models/residents", timeout=30).json()["data"]}[name]
            out[name] = view["devices"]["CPU"]["planned_bytes"]
            repack[name] = view["config"].get("repack", True)
            httpx.post(f"{s.base}/v1/models/{name}/unload", timeout=300).raise_for_status()
    return out, repack


def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f}" if xs else "unavailable"


def render(res: dict) -> str:
    rounds = res["rounds"]
    direct = [r["direct"]["total"] for r in rounds]
    door = [r["fitevict"]["total"] for r in rounds]
    ratio = [f / d for f, d in zip(door, direct)]
    lines = [
        "## A swap, phase by phase, against the direct engine (`bench/swap_phases.py`)", "",
        f"{' and '.join(res['swap'])}, life-size, CPU only, `-c {N_CTX} -np 1`; a RAM budget of "
        f"{res['budget'] / MiB:,.0f} MiB holds either (planned "
        + ", ".join(f"{k} {v / MiB:,.0f} MiB" for k, v in res["planned"].items()) + ") but not both. "
        + "".join(f"{k} runs with `-nr` on both sides (this build's repacking crashed on this CPU). "
                  for k, v in res.get("repack", {}).items() if not v) +
        f"{len(rounds)} rounds, each swapping the other way, the direct engine's swap and fitevict's one after the "
        f"other; {res['cpu']}, load average {res['load_before']} before, {res['load_after']} after. Seconds, "
        "measured by the client; the phase marks are the door's own (`fitevict.phase`), on the same clock.", "",
        "| round | direct: SIGTERM to exit | direct: spawn to first token | direct total | fitevict total | "
        "fitevict / direct |", "|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rounds, 1):
        d = r["direct"]
        lines.append(f"| {i}. {r['from']} → {r['to']} | {d['stop']:.3f} | {d['spawn_to_first_token']:.3f} | "
                     f"{d['total']:.3f} | {r['fitevict']['total']:.3f} | {r['fitevict']['total'] / d['total']:.2f}× |")
    lines += ["", f"Median: direct {_med(direct)} s, fitevict {_med(door)} s, fitevict / direct "
              f"{statistics.median(ratio):.2f}× (from {min(ratio):.2f}× to {max(ratio):.2f}×).", "",
              "Where fitevict's time went (median over the rounds of each step, from the mark before it; A is the "
              "evicted model, B the loaded one):", "", "| step | seconds (median) | min | max |", "|---|---|---|---|"]
    prev = "sent"
    for role, what in (*ORDER, ("client", "first token")):
        key = f"{role}:{what}"
        steps = [step(r["fitevict"], prev, key) for r in rounds]
        steps = [s for s in steps if s is not None]
        lines.append(f"| {prev} → {key} | {_med(steps)} | "
                     f"{f'{min(steps):.3f}' if steps else '-'} | {f'{max(steps):.3f}' if steps else '-'} |")
        prev = key
    (r0, w0), (r1, w1) = OFF_PATH
    off = [s for s in (step(r["fitevict"], f"{r0}:{w0}", f"{r1}:{w1}") for r in rounds) if s is not None]
    lines.append(f"| {r0}:{w0} → {r1}:{w1} (off the path: beside B's load) | {_med(off)} | "
                 f"{f'{min(off):.3f}' if off else '-'} | {f'{max(off):.3f}' if off else '-'} |")
    return "\n".join(lines)


def step(f: dict, prev: str, key: str) -> float | None:
    at = {"sent": 0.0, "client:first token": f["total"], **f["marks"]}
    return at[key] - at[prev] if key in at and prev in at else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--swap", default="llama-3.2-1b,gemma-3-1b")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    res = measure(tuple(args.swap.split(",")), args.rounds)  # type: ignore[arg-type]
    body = render(res)
    print(body)
    if not args.no_write:
        write_section("swap-phases", body)


if __name__ == "__main__":
    main()
