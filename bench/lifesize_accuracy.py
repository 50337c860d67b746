"""The price at life size: against the engine's own buffers (to the byte) and against peak PSS as read with a
context filled. Writes the ``lifesize`` section of docs/accuracy.md.

For each life-size model (``fitevict demo-models --life-size``) and configuration it prices a first load as the
server does (``bench/_filled.predict``: rules, this machine's host buffer table, the engine's dry run, the engine
process's calibrated overhead and the parts that scale with the model), starts the model as a seat starts with the
allocator traced (``llama_cpp/buftrace``), samples the process tree's PSS every 20 ms from spawn through the load and
through its slots filled to ``n_ctx_seq`` tokens, and compares. No floor in MiB: every model here is 70 MB or more,
and the bounds (-2 % / +10 % of the peak as read) hold for each row as it is.

    .venv/bin/python bench/lifesize_accuracy.py [--models a,b] [--no-write] [--json out.json]
    .venv/bin/python bench/lifesize_accuracy.py --render out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import STARTED, Section, Stamp, publish  # noqa: E402
from _filled import ABOVE, BELOW, predict, run_filled  # noqa: E402
from _lifesize import life_size_models  # noqa: E402
from _serve import cpu_model, load_average  # noqa: E402

from fitevict.engines.base import Unavailable
from fitevict.engines.llama_cpp.install import resolve_binary
from fitevict.engines.llama_cpp.machine import host_buffers
from fitevict.engines.llama_cpp.overhead import calibrated_overhead, calibrate_overhead
from fitevict.pricing.footprint import HOST
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.logparse import PRECISION_BYTES
from fitevict.units import MiB

ROOT = Path(__file__).resolve().parents[1]
ACCURACY = ROOT / "docs" / "accuracy.md"
# (model, n_ctx, slots): 8k on the smallest, 4k on the others and 1k on the 8B (on 2 shared cores a filled 8k
# context of a 1B model takes many minutes), two slots on the smallest; the embedder has no context to fill.
RUNS: tuple[tuple[str, int, int], ...] = (
    ("qwen2.5-0.5b", 8192, 1), ("qwen2.5-0.5b", 4096, 2), ("llama-3.2-1b", 4096, 1),
    ("llama-3.2-1b-q4_k_m", 4096, 1), ("gemma-3-1b", 4096, 1), ("qwen3-30b-a3b-6l", 4096, 1),
    ("llama-3.1-8b", 1024, 1),
)


def pct(x: int, ref: int) -> str:
    return f"{100 * x / ref:+.2f}%"


def measure(runs: list[tuple[str, int, int]], saved: Path | None = None) -> tuple[dict, list[dict]]:
    """Each run in turn; with ``saved``, the rows already there are kept and each new row is written as it comes,
    so an interrupted run resumes where it stopped."""
    found = resolve_binary("llama-server")
    if found.path is None:
        raise SystemExit(f"no llama-server: {found.why}")
    binary = found.path
    here = host_buffers(binary)
    calibrated = calibrated_overhead(binary)
    if calibrated is None:
        got = calibrate_overhead(binary, host=here)
        if isinstance(got, Unavailable):
            raise SystemExit(got.reason)
        calibrated = {k: int(v) for k, v in got["overhead"].items()}
    models = {m.name: m for m in life_size_models(sorted({r[0] for r in runs}))}
    logs = Path(tempfile.mkdtemp(prefix="fitevict-lifesize-logs-"))
    kept = json.loads(saved.read_text()) if saved is not None and saved.exists() else {"calibration": {}, "rows": []}
    rows = kept["rows"]
    rec = {**kept["calibration"], "host_buffers": here.label(), "calibrated": int(calibrated[HOST])}
    for name, n_ctx, slots in runs:
        if any(r["model"] == name and r["config"] == f"-c {n_ctx} -np {slots}" for r in rows):
            continue
        m = models[name]
        cfg = LoadConfig(n_ctx=n_ctx, n_parallel=slots)
        pred = predict(binary, m.path, cfg, here, int(calibrated[HOST]))
        got = run_filled(binary, m.path, cfg, pred, logs / f"{name}-c{n_ctx}-np{slots}.log", timeout=600.0,
                         trace=True)
        row = {"model": name, "arch": load_structure(m.path).arch, "config": f"-c {n_ctx} -np {slots}",
               "file_bytes": m.path.stat().st_size, **asdict(pred), "overhead": pred.overhead,
               "predicted": pred.host, **asdict(got)}
        rows.append(row)
        print(f"{name} -c {n_ctx} -np {slots}: buffers priced {pred.buffers:,} B, traced {got.exact_buffers}; "
              f"predicted {pred.host:,} B vs filled PSS as read {got.peak_fill_pss:,} B "
              f"({pct(pred.host - got.peak_fill_pss, got.peak_fill_pss)}); fill {got.fill_s:.1f} s", flush=True)
        rec["run"] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_model(),
                      "stamp": STARTED.to_json(),
                      "cores": os.cpu_count(), "load": load_average()}
        if saved is not None:
            saved.write_text(json.dumps({"calibration": rec, "rows": rows}, indent=1))
    return rec, rows


def filled_peak(r: dict) -> int | None:
    """The peak PSS as read while the context filled, after the load had ended. A row from before that was kept
    apart has it when the load's own peak was lower (the filled peak then came after the load)."""
    if r.get("peak_fill_only_pss") is not None:
        return r["peak_fill_only_pss"]
    return r["peak_fill_pss"] if r["peak_load_pss"] < r["peak_fill_pss"] else None


def verdict(r: dict) -> str:
    peak = filled_peak(r)
    if peak is None:
        return "unavailable, because this row's filled peak was not kept apart from its load's"
    d = r["predicted"] - peak
    if -BELOW * peak <= d <= ABOVE * peak:
        return "yes"
    side = "under" if d < 0 else "over"
    return f"**no** ({side} by {abs(d) / MiB:.1f} MiB)"


def render(rec: dict, rows: list[dict]) -> str:
    run = rec["run"]
    exact = sum(1 for r in rows if r["exact_buffers"] is not None
                and abs(r["exact_buffers"] - r["buffers"]) <= PRECISION_BYTES)
    ok = sum(1 for r in rows if verdict(r) == "yes")
    transient = [r for r in rows if r["peak_load_pss"] > r["predicted"]]
    lines = [
        "## At life size: models of real shape, real vocabularies (`bench/lifesize_accuracy.py`)", "",
        f"Generated by `bench/lifesize_accuracy.py` on {run['date']}, {run['cpu']} (`lscpu` model name; "
        f"{run['cores']} cores, shared: load average {run.get('load', 'unknown')} at the last row), CPU only, the "
        "pinned engine. The models are the life-size zoo "
        "(`fitevict demo-models DIR --life-size`): the shapes of public models, every `tokenizer.*` key copied from "
        "the engine's own vocabulary files, random weights. Host buffer table: "
        f"{rec['host_buffers']}; the engine's calibrated overhead {rec['calibrated']:,} B.", "",
        "**Buffers** compares the priced host buffers with the engine's own allocations, read to the byte by the "
        "allocator trace (`llama_cpp/buftrace`): weights, caches and output are priced to the byte, the compute "
        "buffer from the engine's dry run, which prints it in MiB with 2 decimals (within "
        f"{PRECISION_BYTES:,} B): {exact} of {len(rows)} rows within that. **Filled** compares the whole "
        "price (buffers + the engine process's overhead) with the peak of the seat's PSS *as read* (Pss_Anon + "
        "Pss_Shmem + Pss_File of its process tree, sampled every 20 ms) while its slots filled to `n_ctx_seq` "
        f"tokens. Bounds: {BELOW:.0%} under and {ABOVE:.0%} over the peak, no floor in MiB. {ok} of {len(rows)} "
        "rows within them.", "",
        "**During the load** the engine maps the whole file and reads every weight through that mapping, the ones "
        "it copies (`CPU_REPACK`) included; when the load ends it unmaps what lies outside the span its mapped "
        "weights keep (`CPU_Mapped`). Until then the process holds those file pages too: page cache, reclaimable, "
        "for the seconds of the load. The last column shows that peak; "
        + (f"{len(transient)} of {len(rows)} rows ({', '.join(sorted({r['model'] for r in transient}))}) went above "
           "their price there, by the repacked weights that lie outside the mapped span." if transient else
           "no row went above its price there.") + " The price is the memory the seat holds once loaded; it does "
        "not add that transient.", "",
        "| model | arch | config | file | priced buffers, B | traced buffers, B | predicted, B | peak PSS as read, "
        "filled, B | error | within | peak PSS as read during the load, B | fill |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        traced = r["exact_buffers"]
        tr = "unavailable" if traced is None else (f"{traced:,}" + ("" if traced == r["buffers"] else
                                                                   f" ({traced - r['buffers']:+,})"))
        peak = filled_peak(r)
        err = pct(r["predicted"] - peak, peak) if peak else "unavailable"
        lines.append(
            f"| {r['model']} | {r['arch']} | `{r['config']}` | {r['file_bytes'] / 1e9:.2f} GB | {r['buffers']:,} | "
            f"{tr} | {r['predicted']:,} | {f'{peak:,}' if peak else 'unavailable'} | {err} | {verdict(r)} | "
            f"{r['peak_load_pss']:,} ({pct(r['predicted'] - r['peak_load_pss'], r['peak_load_pss'])}) | "
            f"{r['fill_s']:.0f} s, {sum(a for a, _ in r['tokens']):,} tokens |")
    lines += ["", *overhead_table(rows)]
    notes = sorted({n for r in rows for n in r["exact_notes"]})
    if notes:
        lines += ["", "Traced figures that are not exact: " + "; ".join(notes) + "."]
    return "\n".join([*lines, ""])


def overhead_table(rows: list[dict]) -> list[str]:
    """The engine process beyond its buffers at the filled peak (code pages counted whole, as the calibration
    counts them) against its price: the calibrated part and the parts that scale with the model (pricing/process.py,
    whose per-entry and per-token bytes were fitted on small llama-gqa variants: none of these models took part)."""
    out = [
        "**The process beyond its buffers.** At the filled peak, with the engine's code pages counted whole (as the "
        "calibration counts them), what each seat held beyond its traced buffers, against the overhead it was priced "
        "with: the calibrated part plus the parts that scale with the model (`pricing/process.py`: the tokenizer's "
        "heap per vocabulary entry and merge, ggml's work buffer, a filled context's heap). Those rules were fitted "
        "on small llama-gqa variants; none of the models here took part in a fit.", "",
        "| model | config | beyond the traced buffers, B | priced overhead, B (calibrated + scaling parts) | error |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if r["exact_buffers"] is None:
            continue
        top = r.get("peak_fill_only") or (r["peak_fill"] if r["peak_load_pss"] < r["peak_fill_pss"] else None)
        if top is None:
            continue
        beyond = top - r["exact_buffers"]
        terms = " + ".join(f"{n:,} {name}" for name, n in r["terms"])
        out.append(f"| {r['model']} | `{r['config']}` | {beyond:,} | {r['overhead']:,} ({r['calibrated']:,} + "
                   f"{terms}) | {(r['overhead'] - beyond) / MiB:+.2f} MiB |")
    return out


def readme_line(rows: list[dict]) -> str:
    """README's life-size accuracy line, from the same rows as the section."""
    read = [(r, filled_peak(r)) for r in rows]
    signed = [(r["predicted"] - peak) / peak * 100 for r, peak in read if peak]
    exact = sum(1 for r in rows if r["exact_buffers"] is not None
                and abs(r["exact_buffers"] - r["buffers"]) <= PRECISION_BYTES)
    ok = sum(1 for r in rows if verdict(r) == "yes")
    return (f"At life size, {exact} of {len(rows)} seats' priced buffers equal the engine's traced ones (weights, "
            "caches and output to the byte, the compute buffer within its dry run's 0.01 MiB print), and through a "
            f"filled context the price is {min(signed):+.2f}% to {max(signed):+.2f}% of the seat's PSS *as read*, "
            f"{ok} of {len(rows)} seats within {-BELOW:.0%}/+{ABOVE:.0%} with no floor (`bench/lifesize_accuracy.py`; "
            "`docs/accuracy.md`, \"At life size\").")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="only these models (comma-separated)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--json", type=Path, help="rows are written here as they come; a run resumes from them")
    ap.add_argument("--render", type=Path)
    args = ap.parse_args()
    if args.render:
        saved = json.loads(args.render.read_text())
        rec, rows = saved["calibration"], saved["rows"]
    else:
        only = {x for x in args.models.split(",") if x}
        rec, rows = measure([r for r in RUNS if not only or r[0] in only], args.json)
    if args.json:
        args.json.write_text(json.dumps({"calibration": rec, "rows": rows}, indent=1))
    got = sections(rec, rows)
    if args.no_write:
        print(got[0].body)
        return
    publish(got)
    print(f"wrote the lifesize section of {ACCURACY} and README's life-size accuracy line")


def sections(rec: dict, rows: list[dict]) -> list[Section]:
    """The doc's section and README's line, under the stamp the run saved."""
    run = rec["run"]
    stamp = Stamp.from_json(run.get("stamp"), date=run.get("date", ""), cpu=run.get("cpu", ""))
    return [Section(ACCURACY, "lifesize", render(rec, rows), stamp),
            Section(ACCURACY.parent.parent / "README.md", "accuracy-lifesize", readme_line(rows), stamp)]


def rerender() -> list[Section]:
    """The sections again from the committed run (``bench/lifesize_accuracy.json``)."""
    saved = json.loads((Path(__file__).resolve().parent / "lifesize_accuracy.json").read_text())
    return sections(saved["calibration"], saved["rows"])


if __name__ == "__main__":
    main()
