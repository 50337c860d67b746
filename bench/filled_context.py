"""Host price against peak PSS, on a first load and through a filled context: writes docs/first_load.md and the
``filled`` section of docs/accuracy.md.

For each model and configuration (``-c 4096``, ``-np`` 1 and 2) it prices a first load as the server does (rules,
this machine's host buffer table, the engine's dry-run compute, plus the engine process's overhead: the part
calibrated on a fresh cache and the parts that scale with the model), starts the model as a seat starts, samples
the process tree's PSS every 20 ms from spawn through the load and through every slot filled with a prompt of
``n_ctx_seq - max_tokens`` tokens and ``max_tokens`` generated (``bench/_filled.py``), and compares the planned
bytes with the peaks: each seat runs alone, so it carries the engine binary's shared pages (``pricing.pages``). Then
it runs ``DOOR`` side by side, as one door's seats (the first carries the pages), and compares the sum of their
planned bytes with the sum of their peak PSS as read. The seats run a copy of the engine's folder of their own
(``_filled.private_binary``). The calibration model (llama-gqa) is not among the models measured.

    .venv/bin/python bench/filled_context.py [--models a,b] [--configs 1,2] [--no-write] [--json out.json]
    .venv/bin/python bench/filled_context.py --render out.json   # the docs again from a saved run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import STARTED, Section, Stamp, publish  # noqa: E402
from _filled import (ABOVE, BELOW, FLOOR_BYTES, SMALL_FILE, attributed, predict, private_binary,  # noqa: E402
                     SeatCrashed, run_door, run_filled, within, within_bare)
from _serve import cpu_model, load_average  # noqa: E402

from fitevict.engines.base import Unavailable
from fitevict.engines.llama_cpp.fill import MAX_TOKENS, SAMPLE_S
from fitevict.engines.llama_cpp.install import resolve_binary
from fitevict.engines.llama_cpp.overhead import CALIBRATION_MODEL, calibrate_overhead
from fitevict.engines.llama_cpp.machine import host_buffers
from fitevict.pricing.footprint import HOST
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.units import MiB

ROOT = Path(__file__).resolve().parents[1]
ACCURACY, FIRST_LOAD, README = ROOT / "docs" / "accuracy.md", ROOT / "docs" / "first_load.md", ROOT / "README.md"
SAVED = Path(__file__).resolve().parent / "filled_context.json"
# dense GQA (f32, f16), SWA, MoE, hybrid and recurrent, quantized (Q8_0, Q4_0 repacked), the ~200 MB model
MODELS = ("llama-tied", "qwen2-k256", "gemma3-swa", "qwen3moe", "jamba-hybrid", "granitehybrid-moe",
          "lfm2-shortconv", "mamba", "llama-q8_0", "llama-q4_0", "gemma3-q4_0", "llama-medium")
N_CTX = 4096
DOOR = ("llama-tied", "granitehybrid-moe", "gemma3-swa", "qwen3moe")  # run side by side as one door's seats, -np 2


def _pct(x: int, ref: int) -> str:
    return f"{100 * x / ref:+.2f}%"


def measure(models: list[str], slots: list[int]) -> tuple[dict, list[dict]]:
    """The calibration record and one row per model and configuration."""
    found = resolve_binary("llama-server")
    if found.path is None:
        raise SystemExit(f"no llama-server: {found.why}")
    here = host_buffers(found.path)  # this machine's table, as the server reads it (the probe, else the rule table)
    binary = private_binary(found.path, Path(tempfile.mkdtemp(prefix="fitevict-filled-engine-")))
    os.environ["FITEVICT_CACHE_DIR"] = tempfile.mkdtemp(prefix="fitevict-filled-")  # a fresh install
    rec = calibrate_overhead(binary, host=here)
    if isinstance(rec, Unavailable):
        raise SystemExit(rec.reason)
    rec["host_buffers"] = here.label()
    rec["run"] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_model(),
                  "load_before": load_average(), "stamp": STARTED.to_json(),
                  "cores": os.cpu_count()}
    calibrated, pages = int(rec["overhead"][HOST]), int(rec["shared_pages"]["bytes"])
    from fitevict.zoo import write_zoo

    logs = Path(tempfile.mkdtemp(prefix="fitevict-filled-logs-"))
    rows = []
    for m in write_zoo(Path(tempfile.mkdtemp(prefix="fitevict-zoo-")), only=models):
        for np_ in slots:
            cfg = LoadConfig(n_ctx=N_CTX, n_parallel=np_)
            pred = predict(binary, m.path, cfg, here, calibrated)
            flags = ""
            try:
                got = run_filled(binary, m.path, cfg, pred, logs / f"{m.name}-np{np_}.log")
            except (SeatCrashed, httpx.HTTPError) as e:  # as a seat that crashes: loaded again with -nr, once
                print(f"{m.name}: {e!r}: again with -nr", flush=True)
                cfg, flags = cfg.with_(repack=False), " -nr"
                pred = predict(binary, m.path, cfg, here, calibrated)
                got = run_filled(binary, m.path, cfg, pred, logs / f"{m.name}-np{np_}-nr.log")
            rows.append({"model": m.name, "arch": load_structure(m.path).arch,
                         "config": f"-c {N_CTX} -np {np_}{flags}",
                         "file_bytes": m.path.stat().st_size, **asdict(pred), "overhead": pred.overhead,
                         "predicted": pred.host, "pages": pages, "planned": pred.host + pages, **asdict(got)})
            print(f"{m.name} -np {np_}: predicted {pred.host:,} B, peak load {got.peak_load:,} B "
                  f"({_pct(pred.host - got.peak_load, got.peak_load)}), peak filled {got.peak_fill:,} B "
                  f"({_pct(pred.host - got.peak_fill, got.peak_fill)}; as read {got.peak_fill_pss:,} B), "
                  f"tokens {got.tokens}", flush=True)
    rec["door"] = measure_door(binary, here, calibrated, pages, logs)
    rec["run"]["load_after"] = load_average()
    return rec, rows


def measure_door(binary: Path, here, calibrated: int, pages: int, logs: Path) -> dict:
    """``DOOR``'s seats side by side (``-np 2``), the first carrying the binary's pages: per seat planned, measured
    as the planner attributes the pages, and PSS as read."""
    from fitevict.zoo import write_zoo

    cfg = LoadConfig(n_ctx=N_CTX, n_parallel=2)
    zoo = {m.name: m.path for m in write_zoo(Path(tempfile.mkdtemp(prefix="fitevict-door-")), only=list(DOOR))}
    paths = [zoo[m] for m in DOOR]
    preds = [predict(binary, p, cfg, here, calibrated) for p in paths]
    got, door = run_door(binary, [(p, cfg, pred) for p, pred in zip(paths, preds)], logs)
    a = attributed(preds, got, pages, door)
    seats = [{"model": m, "carries": pages if i == 0 else 0, "planned": a.planned[i], "measured": a.measured[i],
              "read": a.read[i], "own": got[i].peak_fill_own, "neighbours": got[i].neighbours,
              "tokens": got[i].tokens} for i, m in enumerate(DOOR)]
    print(f"door: planned {a.door_planned:,} B, read {a.door_read:,} B "
          f"({_pct(a.door_planned - a.door_read, a.door_read)})", flush=True)
    return {"config": f"-c {N_CTX} -np 2", "seats": seats, "read": a.door_read}


def _err(r: dict, peak: int) -> str:
    d = r["planned"] - peak
    ok = "yes" if within(r["planned"], peak, r["file_bytes"]) else "**no**"
    return f"{peak:,} | {d:+,} ({_pct(d, peak)}) | {ok}"


def _summary(rows: list[dict], key: str) -> str:
    errs = [abs(r["planned"] - r[key]) / r[key] * 100 for r in rows]
    signed = [(r["planned"] - r[key]) / r[key] * 100 for r in rows]
    ok = sum(within(r["planned"], r[key], r["file_bytes"]) for r in rows)
    return (f"median |error| {statistics.median(errs):.2f}%, max {max(errs):.2f}%; signed from {min(signed):+.2f}% "
            f"to {max(signed):+.2f}%; {ok} / {len(rows)} within the bounds")


def _raw(r: dict, pss: int) -> str:
    return f"{pss:,} ({_pct(r['planned'] - pss, pss)})"


def _parts(r: dict) -> str:
    """The planned host bytes as their parts: buffers + calibrated + each scaling term + the shared pages."""
    terms = " + ".join(f"{n:,} {name}" for name, n in r["terms"])
    return (f"{r['planned']:,} ({r['buffers']:,} buffers + {r['calibrated']:,} calibrated + {terms} + "
            f"{r['pages']:,} shared pages)")


def _how(rec: dict, rows: list[dict]) -> list[str]:
    """The paragraphs that say what was run, on what, and how PSS was sampled."""
    periods = [r["mean_period_s"] * 1000 for r in rows]
    gaps = [r["max_gap_s"] * 1000 for r in rows]
    ov, run, cal = int(rec["overhead"][HOST]), rec["run"], rec["config"]
    own = sum(t["bytes"] for t in rec["terms"])
    runs = ", ".join(f"{x['peak_bytes'] - x['own_bytes'] - x['buffer_bytes']:,} B" for x in rec["runs"])
    sp = rec["shared_pages"]
    return [
        f"Generated by `bench/filled_context.py` on {run['date']}, {run['cpu']} (`lscpu` model name; "
        f"{run['cores']} cores"
        + (f", shared with other work: load average {run['load_before']} before, {run['load_after']} after"
           if "load_after" in run else "")
        + "), CPU only (`-dev none`), the pinned engine (llama.cpp 0c1e570).",
        "",
        f"**Planned** is what the planner counts for a seat on a first load: the host price as the server makes it "
        f"(the rules with this machine's host buffer table ({rec['host_buffers']}), the compute buffer from the "
        "engine's own dry run, plus the engine process's own memory that `PriceBook.footprint` adds "
        "(`with_engine_overhead`)) and, on the seat that carries them, the engine binary's shared file pages. The "
        f"overhead's calibrated part, {ov:,} B ({ov / MiB:.2f} MiB), was measured on a fresh cache as `fitevict "
        f"engine install` does, in {rec['seconds']:.1f} s: {CALIBRATION_MODEL} (`-c {cal['n_ctx']} -np "
        f"{cal['n_parallel']}`) started as a seat with its allocator traced, its context filled the way the seats "
        f"below are, its peak PSS (the engine's own file pages counted whole) {rec['pss_bytes']:,} B less those "
        f"pages, its {rec['buffer_bytes']:,} B of host buffers and its own {own:,} B of the parts that scale with a "
        f"model; the largest of {len(rec['runs'])} runs ({runs} beyond the buffers and the pages). The engine "
        f"binary's own file pages, {sp['bytes']:,} B ({sp['bytes'] / MiB:.2f} MiB: {sp['source']}), are kept "
        "apart: every seat of the binary maps them and the kernel holds them once, so the planner counts them once, "
        "on the first seat of the binary (`pricing.pages`). Each seat of the table runs alone, so it carries them. "
        "The parts that scale with the model (`pricing.process`: the tokenizer's heap, ggml's CPU work buffer, the "
        "heap of a filled context, each slot beyond the first, a sliding-window or recurrent model's context "
        f"checkpoints) are priced per row by their rules. {CALIBRATION_MODEL} is not among the models "
        "below and nothing was fitted to them (no stored measurement, no correction: a fresh store; the rules' "
        f"per-entry and per-token bytes were measured on {CALIBRATION_MODEL} variants).",
        "",
        "**Measured** is the peak PSS of the seat's process tree: each model started as a seat starts (the seat's "
        "argv: `-c 4096 -np N -dev none --fit off -cram 0`), and a thread reading `procmem.read_tree` "
        "(Pss_Anon + Pss_Shmem + Pss_File from `/proc/PID/smaps_rollup`) every "
        f"{SAMPLE_S * 1000:.0f} ms from spawn: through the load, until `/health` answers (\"first load\"), then "
        f"through the fill (\"filled\"): every slot is sent at once a prompt of `n_ctx_seq - {MAX_TOKENS}` tokens "
        f"(token ids from the model's own `/tokenize`) and asked for {MAX_TOKENS} more (`/completion`, `n_predict` "
        f"{MAX_TOKENS}, `ignore_eos`), so every slot's context is full when its answer ends. The sampler's mean "
        f"period was {statistics.median(periods):.1f} ms (median over seats) and its longest gap between two "
        f"readings {max(gaps):.0f} ms, on a machine where the engine's own threads share the same cores. The seats "
        "run a copy of the engine's folder of their own, so that no process outside the door maps the binary (on "
        "this shared machine, other programs ran the same build): PSS as read is then the door's own "
        f"({sum(1 for r in rows if r['neighbours'])} of {len(rows)} seats had another process of their binary "
        "beside them). Each reading also reads `/proc/PID/smaps` for the engine's own file pages (its executable and "
        "its own libraries; the C and C++ runtimes, which every process shares, are counted as read): \"the binary "
        "whole\" counts those pages whole, as for the only seat of its binary.",
        "",
        f"Bounds: the planned bytes may fall {BELOW:.0%} under the peak and exceed it by {ABOVE:.0%}, with no floor; "
        f"a column says which seats would pass with a floor of {FLOOR_BYTES // MiB} MiB either way for a model file "
        f"under {SMALL_FILE // MiB} MiB (the largest file here is {max(r['file_bytes'] for r in rows) / MiB:.2f} "
        f"MiB, so the floor would cover {sum(r['file_bytes'] < SMALL_FILE for r in rows)} of {len(rows)} seats).",
        "",
    ]


def first_load_doc(rec: dict, rows: list[dict]) -> str:
    table = [
        "| model | arch | config | file, B | planned, B (buffers + calibrated + scaling parts + shared pages) | peak "
        "PSS through the load, the binary whole, B | error, B (%) | within bounds with the floor | peak PSS as read, "
        "B (error) |",
        "|---|---|---|---|---|---|---|---|---|",
        *(f"| {r['model']} | {r['arch']} | `{r['config']}` | {r['file_bytes']:,} | {_parts(r)} | "
          f"{_err(r, r['peak_load'])} | {_raw(r, r['peak_load_pss'])} |" for r in rows),
    ]
    return "\n".join([
        *_how(rec, rows),
        f"First loads (from spawn until `/health` answers), the binary whole: {_summary(rows, 'peak_load')}. As "
        f"read: {_summary(rows, 'peak_load_pss')}.", "",
        "The price holds what a seat grows to once its context fills (`docs/accuracy.md`, \"Against a",
        "measurement\"); until a request runs, the compute buffer's and the caches' pages are allocated but",
        "untouched and the process has not grown what a request needs, so a first load reads under its price,",
        "beyond the bounds on the seats counted above. That is the price's design, not an error of a term.", "",
        *table, "",
    ])


def _finding(rec: dict, rows: list[dict]) -> list[str]:
    """Which term is off: the buffers against the log, and the process beyond its buffers against its price."""
    logged = [r for r in rows if r["logged_buffers"] is not None]
    if not logged:
        return []
    buf = max(abs(r["buffers"] - r["logged_buffers"]) for r in logged)
    own = sorted((r["peak_fill_bare"] - r["logged_buffers"]) / MiB for r in logged)
    miss = sorted((r["overhead"] - (r["peak_fill_bare"] - r["logged_buffers"])) / MiB for r in logged)
    return [
        f"The buffers: the priced host buffers and the ones the load log reports differ by at most {buf:,} B (the "
        f"log's 0.01 MiB rounding). The process beyond them: at the filled peak the seats held {own[0]:.2f} to "
        f"{own[-1]:.2f} MiB (median {statistics.median(own):.2f} MiB) beyond their logged buffers and the "
        "binary's own file pages; the priced "
        f"overhead (calibrated + scaling parts) was off that by {miss[0]:+.2f} to {miss[-1]:+.2f} MiB (median "
        f"{statistics.median(miss):+.2f} MiB).", "",
    ]


def door_line(rec: dict) -> str:
    """The whole door as read: the sum of its seats' peak PSS against the sum of their planned bytes."""
    seats = rec["door"]["seats"]
    planned, read = sum(x["planned"] for x in seats), rec["door"]["read"]
    pages = rec["shared_pages"]["bytes"]
    every = planned + (len(seats) - 1) * pages
    return (f"For a whole door, as read: {len(seats)} seats side by side (`{rec['door']['config']}`: "
            f"{', '.join(x['model'] for x in seats)}; the first carries the binary's shared pages), planned "
            f"{planned:,} B against {read:,} B, the door's peak PSS as read (the highest sum of its seats' PSS read "
            f"at once, every 50 ms): {_pct(planned - read, read)}, "
            f"{'within' if within_bare(planned, read) else '**outside**'} {-BELOW:.0%}/+{ABOVE:.0%} with no floor "
            f"(with the pages counted in every seat, as before they were counted once: {every:,} B, "
            f"{_pct(every - read, read)})")


def per_seat_line(rec: dict, rows: list[dict]) -> str:
    """Per seat, the binary's pages attributed as the planner attributes them, over the table's seats (each alone:
    it carries them) and the door's (the first carries them, the others not)."""
    pairs = [(r["planned"], r["peak_fill"]) for r in rows]
    pairs += [(x["planned"], x["measured"]) for x in rec["door"]["seats"]]
    signed = [(p - m) / m * 100 for p, m in pairs]
    bare = sum(within_bare(p, m) for p, m in pairs)
    return (f"Per seat, the binary's pages attributed as the planner attributes them ({len(rows)} seats alone, "
            f"each carrying them, and the door's {len(rec['door']['seats'])}: the first measured with them whole, "
            f"the others without them): {min(signed):+.2f}% to {max(signed):+.2f}% (median |error| "
            f"{statistics.median(map(abs, signed)):.2f}%); {bare} of {len(pairs)} within {-BELOW:.0%}/+{ABOVE:.0%} "
            "with no floor")


def headline(rec: dict, rows: list[dict]) -> str:
    """The two figures a user reads first: the whole door as read, and per seat as attributed."""
    return f"{door_line(rec)}. {per_seat_line(rec, rows)}"


def _alone(rows: list[dict]) -> str:
    signed = [(r["planned"] - r["peak_fill_pss"]) / r["peak_fill_pss"] * 100 for r in rows]
    bare = sum(within_bare(r["planned"], r["peak_fill_pss"]) for r in rows)
    floored = sum(within(r["planned"], r["peak_fill"], r["file_bytes"]) for r in rows)
    return (f"Each seat alone as read (no other process mapping its binary, so its PSS holds the pages it carries): "
            f"{min(signed):+.2f}% to {max(signed):+.2f}%; {bare} of {len(rows)} within the percentages alone, "
            f"{floored} of {len(rows)} with the floor (the binary whole).")


def _door_table(rec: dict) -> list[str]:
    out = ["| seat (in the order placed) | carries the shared pages, B | planned, B | measured as attributed, B "
           "(error) | PSS as read at the door's peak, B | the binary's own pages in it (Rss), B | other processes of "
           "the binary beside it |", "|---|---|---|---|---|---|---|"]
    for x in rec["door"]["seats"]:
        d = x["planned"] - x["measured"]
        out.append(f"| {x['model']} | {x['carries']:,} | {x['planned']:,} | {x['measured']:,} "
                   f"({_pct(d, x['measured'])}) | {x['read']:,} | {x['own']:,} | {x['neighbours']} |")
    return out


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def filled_section(rec: dict, rows: list[dict]) -> str:
    table = [
        "| model | arch | config | n_ctx_seq x slots | tokens per slot (prompt + generated) | planned, B (buffers + "
        "calibrated + scaling parts + shared pages) | PSS as read at the filled peak, B | error, B (%) | within "
        "-2%/+10% | with the floor | other processes of the binary beside it | the binary whole at the filled peak, "
        "B (error) | first load: PSS as read, B (error) | logged buffers, B | beyond the logged buffers and the "
        "binary's pages at the peak, B | priced overhead, B |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        toks = ", ".join(f"{a} + {b}" for a, b in r["tokens"])
        logged = r["logged_buffers"]
        beyond = f"{r['peak_fill_bare'] - logged:,}" if logged is not None else "unavailable"
        read = r["peak_fill_pss"]
        d = r["planned"] - read
        table.append(f"| {r['model']} | {r['arch']} | `{r['config']}` | {r['n_ctx_seq']} x {r['slots']} | {toks} | "
                     f"{_parts(r)} | {read:,} | {d:+,} ({_pct(d, read)}) | "
                     f"{_yes(within_bare(r['planned'], read))} | "
                     f"{_yes(within(r['planned'], read, r['file_bytes']))} | {r['neighbours']} | "
                     f"{_raw(r, r['peak_fill'])} | "
                     f"{_raw(r, r['peak_load_pss'])} | {f'{logged:,}' if logged is not None else 'unavailable'} | "
                     f"{beyond} | {r['overhead']:,} |")
    return "\n".join([
        "## Against a measurement: PSS through a filled context", "",
        *_how(rec, rows),
        f"**{headline(rec, rows)}.** {_alone(rows)} First loads, before a request touches the caches and the compute "
        f"buffer, the binary whole: {_summary(rows, 'peak_load')} (per model in `docs/first_load.md`).", "",
        *_finding(rec, rows),
        "The door's seats, side by side (each filled in turn while all ran):", "",
        *_door_table(rec), "",
        "\"Logged buffers\" are the host buffers the seat's load log reports (0.01 MiB per line); \"beyond the "
        "logged buffers and the binary's pages\" is what the process held beyond them at its peak, to set against "
        "the priced overhead. What that overhead is made of is in \"What the engine process holds beyond its "
        "buffers\" below.",
        "",
        *table, "",
        f"Rerun: `nice -n 5 .venv/bin/python bench/filled_context.py --json bench/filled_context.json` (writes this "
        "section, `docs/first_load.md` and the accuracy line of README.md; `--render bench/filled_context.json` "
        "writes them again from the saved rows).",
    ])


def sections(rec: dict, rows: list[dict]) -> list[Section]:
    """The three sections one run writes, under the stamp it saved."""
    run = rec["run"]
    stamp = Stamp.from_json(run.get("stamp"), cpu=run.get("cpu", ""), load=run.get("load_before", ""))
    return [Section(FIRST_LOAD, "first-load", first_load_doc(rec, rows), stamp),
            Section(ACCURACY, "filled", filled_section(rec, rows), stamp),
            Section(README, "accuracy-headline", readme_line(rec, rows), stamp)]


def rerender() -> list[Section]:
    """The sections again from the committed run (``bench/filled_context.json``)."""
    saved = json.loads(SAVED.read_text())
    return sections(saved["calibration"], saved["rows"])


def readme_line(rec: dict, rows: list[dict]) -> str:
    """README's accuracy headline, from the same rows: the whole door as read first, then per seat."""
    return (f"Through a filled context, on {len(rows)} seats of {len({r['model'] for r in rows})} zoo models "
            f"(`bench/filled_context.py`, `docs/accuracy.md`), the engine binary's shared pages counted once. "
            f"{headline(rec, rows)}. {_alone(rows)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--configs", default="1,2", help="-np values, comma-separated")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the raw rows here")
    ap.add_argument("--render", type=Path, help="write the docs from the rows a run saved with --json; run nothing")
    args = ap.parse_args()
    models = [x for x in args.models.split(",") if x]
    if CALIBRATION_MODEL in models:
        raise SystemExit(f"{CALIBRATION_MODEL} calibrates the engine overhead: it cannot also check it")
    if args.render:
        saved = json.loads(args.render.read_text())
        rec, rows = saved["calibration"], saved["rows"]
    else:
        rec, rows = measure(models, [int(x) for x in args.configs.split(",")])
    if args.json:
        args.json.write_text(json.dumps({"calibration": rec, "rows": rows}, indent=1))
    got = sections(rec, rows)
    if args.no_write:
        print(*(s.body for s in got), sep="\n\n")
        return
    publish(got)
    print(f"wrote {FIRST_LOAD}, the filled section of {ACCURACY} and README's accuracy line")


if __name__ == "__main__":
    main()
