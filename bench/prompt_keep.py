"""Time to first token after a swap, with the prompt cache kept across swaps (``policy.prompt_cache``) on and off.
Writes docs/benchmarks.md (section ``prompt_keep``).

Two ``fitevict serve`` run side by side on the same folder: two copies of the demo zoo's largest model
(``llama-medium``), a RAM limit of 1.5 models, so that loading one evicts the other; one server keeps prompts
(``FITEVICT_PROMPT_CACHE=true``), the other does not (``false``). Every chat shares a ~2,000-token system prompt and
asks a new question, alternating between the two copies, so every measured request is a swap: stop the other
copy (saving its prompt where the cache is on), load this one, restore its saved prompt, prefill what is new.
The requests alternate between the servers, each going first in every other swap, so both see the same machine.

Measured at the client: time to first token (streamed chat, request sent to the first chunk with content).
From the servers: the seconds the save added to each stop (``kv_save_seconds`` of the evict events), the bytes
and tokens of each saved prompt (engine-reported), the restore (``kv_restore`` of the load report) and the
engine's own prefill timings (the stream's last chunk).

The ratio is read per swap (cache off / cache on, the two servers' requests of the same swap), and reported as the
median with its spread (quartiles, range, and the median of each half of the run, to show it has settled). The raw
rows are kept in ``bench/prompt_keep.json``; ``--render`` writes the section again from them.

    .venv/bin/python bench/prompt_keep.py [--swaps 15] [--no-doc]
    .venv/bin/python bench/prompt_keep.py --render   # the section again from bench/prompt_keep.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import DOC, STARTED, Section, Stamp, publish  # noqa: E402
from _serve import Served, cpu_model, fmt, load_average, med, scale, serve, signal_exit  # noqa: E402

MODEL = "llama-medium"
COPIES = ("med-a", "med-b")
RAW = Path(__file__).resolve().parent / "prompt_keep.json"
SYSTEM = " ".join(f"Clause {i}: keep every answer short and name the clause it follows." for i in range(80))


def stream_chat(base: str, model: str, question: str) -> dict:
    """One streamed chat: time to the first content chunk, the load report and the engine's last timings."""
    body = {"model": model, "max_tokens": 2, "temperature": 0, "stream": True,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}
    out: dict = {"ttft": None, "timings": None, "report": None}
    t0 = time.perf_counter()
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            raise SystemExit(f"{base} {model}: {r.status_code} {r.read()[:300]!r}")
        head = r.headers.get("x-fitevict-load-report")
        out["report"] = json.loads(head) if head else None
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            doc = json.loads(line[6:])
            delta = (doc.get("choices") or [{}])[0].get("delta") or {}
            if out["ttft"] is None and delta.get("content"):
                out["ttft"] = time.perf_counter() - t0
            out["timings"] = doc.get("timings") or out["timings"]
    if out["ttft"] is None:
        out["ttft"] = time.perf_counter() - t0  # no content at all: the whole answer's time
    return out


def run(servers: dict[str, Served], swaps: int) -> dict[str, list[dict]]:
    """Two warm-up chats per server (the second evicts the first copy), then ``swaps`` measured swaps each."""
    for s in servers.values():
        for i, model in enumerate(COPIES):
            stream_chat(s.base, model, f"Which clause covers greetings? ({i})")
    got: dict[str, list[dict]] = {name: [] for name in servers}
    names = list(servers)
    for i in range(swaps):
        model = COPIES[i % 2]
        for name in (names if i % 2 == 0 else names[::-1]):
            r = stream_chat(servers[name].base, model, f"What does clause {7 + 3 * i} ask for?")
            got[name].append(r)
            print(f"swap {i + 1}/{swaps} {name}: {model} first token {r['ttft']:.3f} s", flush=True)
    return got


def saves(s: Served) -> dict:
    """The evict events' saving figures: seconds added to the stop, and each saved prompt's bytes and tokens."""
    evicts = [e for e in s.history("evict") if "kv_save_seconds" in (e.get("details") or {})]
    saved = [p for e in evicts for p in e["details"]["kv_saved"]]
    return {"stops": len(evicts), "save_s": [e["details"]["kv_save_seconds"] for e in evicts],
            "engine_s": [p["save_seconds"] for p in saved], "bytes": [p["bytes"] for p in saved],
            "tokens": [p["tokens"] for p in saved]}


def restores(rows: list[dict]) -> dict:
    kv = [r["report"]["kv_restore"] for r in rows if r["report"] and r["report"].get("kv_restore")]
    return {"n": len(kv), "tokens": [k["kv_restored_tokens"] for k in kv], "shared": [k["shared_tokens"] for k in kv],
            "seconds": [k["kv_restore_seconds"] for k in kv],
            "estimate": [k["prefill_seconds_saved"] for k in kv if k["prefill_seconds_saved"] is not None]}


def engine(rows: list[dict], key: str) -> float | None:
    return med([float(r["timings"][key]) for r in rows if r["timings"] and key in r["timings"]])


def loaded(rows: list[dict]) -> float | None:
    return med([r["report"]["base_load_seconds"] for r in rows
                if r["report"] and r["report"].get("base_load_seconds") is not None])


def swapped(rows: list[dict]) -> int:
    """How many of the requests loaded their copy and evicted the other for it (load report)."""
    return sum(1 for r in rows if r["report"] and not r["report"]["base_hit"] and r["report"]["evicted"])


def ratios(on: list[dict], off: list[dict]) -> list[float]:
    """Per swap: the cache-off server's time to first token over the cache-on server's, for the same swap."""
    return [a["ttft"] / b["ttft"] for a, b in zip(off, on) if a["ttft"] and b["ttft"]]


def spread(xs: list[float]) -> str:
    """Median, quartiles, range and the median of each half of the run, of per-swap ratios."""
    if len(xs) < 4:
        return "too few swaps for a spread"
    q1, q2, q3 = statistics.quantiles(xs, n=4)
    half = len(xs) // 2
    return (f"median {q2:.2f}x, quartiles {q1:.2f}x to {q3:.2f}x, range {min(xs):.2f}x to {max(xs):.2f}x; "
            f"median of swaps 1-{half} {statistics.median(xs[:half]):.2f}x, of swaps {half + 1}-{len(xs)} "
            f"{statistics.median(xs[half:]):.2f}x")


def table(on: list[dict], off: list[dict]) -> list[str]:
    ttft_on, ttft_off = med([r["ttft"] for r in on]), med([r["ttft"] for r in off])
    per = ratios(on, off)

    def both(key: str, spec: str, k: float = 1.0) -> str:
        return f"{fmt(scale(engine(off, key), k), spec)} | {fmt(scale(engine(on, key), k), spec)}"

    return [
        "| per swap (median) | cache off | cache on | off / on |",
        "|---|---:|---:|---:|",
        f"| time to first token (measured, client), s | {fmt(ttft_off)} | {fmt(ttft_on)} | "
        f"{fmt(med(per), '.2f')} (per swap) |",
        f"| load seconds (load report `base_load_seconds`) | {fmt(loaded(off))} | {fmt(loaded(on))} | |",
        f"| tokens prefilled (engine `prompt_n`) | {both('prompt_n', '.0f')} | |",
        f"| prefill seconds (engine `prompt_ms`) | {both('prompt_ms', '.3f', 1e-3)} | |",
        f"| tokens reused (engine `cache_n`) | {both('cache_n', '.0f')} | |",
        "",
        f"Off / on, per swap: {spread(per)} ({len(per)} swaps; the ratio of the two medians is "
        f"{fmt(ttft_off / ttft_on if ttft_on and ttft_off else None, '.2f')}x).",
        "",
        "Runs (off / on), time to first token s: " + ", ".join(f"{r['ttft']:.3f}" for r in off) + " / "
        + ", ".join(f"{r['ttft']:.3f}" for r in on) + ".",
    ]


def kept_text(on: list[dict], off: list[dict], kept: dict) -> str:
    rs = restores(on)
    per_token = med([b / t for b, t in zip(kept["bytes"], kept["tokens"]) if t])
    return (
        f"With the cache on: {rs['n']} of {len(on)} swaps restored a saved prompt; median "
        f"{fmt(med(rs['tokens']), '.0f')} tokens restored (engine `n_restored`), {fmt(med(rs['shared']), '.0f')} "
        f"shared with the new request, in {fmt(scale(med(rs['seconds']), 1e3), '.1f')} ms (engine `restore_ms`). "
        "The load report's estimate of the prefill saved (`prefill_seconds_saved`: shared tokens / the prefill rate "
        "of the seat that saved the prompt, over its prefills of 256 tokens or more, from its engine timings): median "
        f"{fmt(med(rs['estimate']), '.2f')} s, against "
        f"{fmt(scale(engine(off, 'prompt_ms'), 1e-3))} s the cache-off server's engine took to prefill the same "
        f"prompts (measured). Each stop that saved ({kept['stops']} stops): median "
        f"{fmt(scale(med(kept['save_s']), 1e3), '.1f')} ms added to the stop (`kv_save_seconds`, measured; max "
        f"{fmt(scale(max(kept['save_s'], default=None), 1e3), '.1f')} ms), of which the engine's own write "
        f"{fmt(scale(med(kept['engine_s']), 1e3), '.1f')} ms (`save_ms`); each saved prompt "
        f"{fmt(med(kept['tokens']), '.0f')} tokens, {fmt(scale(med(kept['bytes']), 1 / 2**20), '.2f')} MiB "
        f"({fmt(per_token, '.0f')} bytes per token; engine `n_saved`, `n_written`).")


def report(got: dict[str, list[dict]], kept: dict, ctx: dict) -> str:
    on, off = got["on"], got["off"]
    return "\n".join([
        "## Prompt cache across swaps (`bench/prompt_keep.py`)",
        "",
        f"Measured {ctx['date']} on {ctx['cpu']} ({platform.machine()}, {ctx['cores']} cores shared "
        f"with other work: load average {ctx['load_before']} before, {ctx['load_after']} after; read the ratio, not "
        f"the absolute times), CPU only. Two `fitevict serve` side by side on two copies of `{MODEL}` (demo zoo, "
        f"f16) with `--ram-limit` {ctx['limit'] / 2**20:.0f} MiB (1.5 models priced at ctx 4096, -np 1), so loading "
        "one copy evicts the other; one server with `policy.prompt_cache` on, one with it off "
        "(`FITEVICT_PROMPT_CACHE=false`). Each chat: a system prompt shared by every request and a new question, "
        f"{ctx['prompt_tokens']} tokens in all (the engine's count), 2 tokens streamed. {len(on)} measured swaps per "
        f"server (load reports: {swapped(off)} / {swapped(on)} of them loaded their copy and evicted the other, "
        "off / on), alternating between the servers, after two warm-up chats each. Time to first token is measured "
        "at the client: request sent to the first chunk with content; it includes the stop of the other copy (and "
        "its save), the load, the restore and the prefill.",
        "",
        *table(on, off),
        "",
        kept_text(on, off, kept),
        "",
        f"Rerun: `nice -n 5 .venv/bin/python bench/prompt_keep.py --swaps {len(on)}` (writes this section and "
        f"`bench/prompt_keep.json`; `--no-doc` prints it only; `--render` writes it from the json).",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--swaps", type=int, default=15)
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--render", action="store_true", help="write the section from bench/prompt_keep.json; run nothing")
    args = ap.parse_args()
    if args.render:
        publish(rerender())
        return
    signal_exit()
    from fitevict.engines.llama_cpp.machine import host_buffers
    from fitevict.pricing.footprint import HOST
    from fitevict.pricing.gguf import load_structure
    from fitevict.pricing.loadconfig import LoadConfig
    from fitevict.pricing.price import price
    from fitevict.zoo import write_zoo

    tmp = Path(tempfile.mkdtemp(prefix="fitevict-prompt-keep-"))
    zoo = write_zoo(tmp / "zoo", only=[MODEL])
    models = tmp / "models"
    models.mkdir()
    for name in COPIES:
        shutil.copyfile(zoo[0].path, models / f"{name}.gguf")
    one = price(load_structure(models / "med-a.gguf"), LoadConfig(n_ctx=4096, n_parallel=1),
                host=host_buffers()).footprint.bytes_on(HOST)
    limit = int(1.5 * one)
    config = f"[budget]\nram_limit = {limit}\n[policy]\nmin_residency_seconds = 0\nidle_unload_seconds = 0\n"
    ctx = {"cpu": cpu_model(), "cores": os.cpu_count(), "limit": limit, "load_before": load_average(),
           "date": time.strftime("%Y-%m-%d"), "stamp": STARTED.to_json()}
    try:
        with serve(tmp, "on", models, config, {"FITEVICT_PROMPT_CACHE": "true"}) as on, \
                serve(tmp, "off", models, config, {"FITEVICT_PROMPT_CACHE": "false"}) as off:
            got = run({"on": on, "off": off}, args.swaps)
            kept = saves(on)
            if saves(off)["stops"]:
                raise SystemExit("the server with the cache off saved prompts")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ctx["load_after"] = load_average()
    ctx["prompt_tokens"] = fmt(engine(got["off"], "prompt_n"), ".0f")
    RAW.write_text(json.dumps({"got": got, "kept": kept, "ctx": ctx}, indent=1) + "\n")
    if not args.no_doc:
        publish(rerender())
    print(report(got, kept, ctx))


def rerender() -> list[Section]:
    """The section again from the saved run (``bench/prompt_keep.json``), under its stamp."""
    saved = json.loads(RAW.read_text())
    ctx = saved["ctx"]
    stamp = Stamp.from_json(ctx.get("stamp"), cpu=ctx.get("cpu", ""), load=ctx.get("load_before", ""))
    return [Section(DOC, "prompt_keep", report(saved["got"], saved["kept"], ctx), stamp)]


if __name__ == "__main__":
    main()
