"""Replay recorded GPU loads (bench/gpu_placement_check.py) against today's prices: the ``gpu-placement`` table.

Each recorded load is priced again here with the recorded machine's host buffer table and the engine's own dry run
on the device, then compared with the allocator's bytes in the recorded log: every model buffer by name, the KV
cache per device and the output buffer to the byte, compute per device within 1 %. The seat's GPU memory as NVML
read it (measured) is set beside the allocator's bytes on the device: the difference is the CUDA context and
runtime, which no buffer holds.
"""

from __future__ import annotations

import gzip
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from _docs import ROOT, write_section

from fitevict.pricing.buftrace import parse_exact_log
from fitevict.pricing.gguf import PricingError, load_structure
from fitevict.pricing.hostbufs import HostBuffers
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.price import price
from fitevict.units import MiB
from fitevict.zoo import write_zoo

DOC = ROOT / "docs" / "accuracy.md"
COMPUTE_TOLERANCE = 0.01


@dataclass
class Tally:
    rows: list[str] = field(default_factory=list)
    loads: int = 0
    exact: int = 0
    compute_ok: int = 0
    misses: list[str] = field(default_factory=list)
    overheads: list[int] = field(default_factory=list)
    precisions: set[int] = field(default_factory=set)


def read_records(path: Path) -> tuple[dict, list[dict]]:
    with gzip.open(path, "rt") as f:
        lines = [json.loads(x) for x in f if x.strip()]
    facts = next(x for x in lines if x.get("kind") == "facts")
    return facts, [x for x in lines if x.get("kind") == "load"]


def same(a: int, b: int, precision: int) -> bool:
    """Equal to the byte where the allocator trace ran, else as the log prints them (2-decimal MiB)."""
    return a == b if precision == 0 else f"{a / MiB:.2f}" == f"{b / MiB:.2f}"


def _d(a: int | None, b: int | None) -> str:
    if a is None or b is None:
        return "n/a"
    return f"{a:,} ({b - a:+,})"


def compare(rec: dict, structure, host: HostBuffers, t: Tally) -> None:
    """One recorded load against today's price: a table row per device, misses tallied."""
    cfg = LoadConfig.from_json(rec["config"])
    head = f"| {rec['model']} | `{rec['label']}` |"
    if not rec["ok"]:
        t.rows.append(f"{head} all | the engine did not load it: {rec['reason'][:80]} | | | | |")
        return
    try:
        p = price(structure, cfg, compute=rec.get("dry_compute") or None, host=host)
    except PricingError as e:
        t.loads += 1
        t.misses.append(f"{rec['model']} {rec['label']}: fitevict refuses what the engine loaded ({e})")
        t.rows.append(f"{head} all | REFUSED by fitevict, loaded by the engine | | | | |")
        return
    log = parse_exact_log(rec["log"])
    meas = log.to_footprint()
    t.loads += 1
    t.precisions.add(log.precision_bytes)
    prec = log.precision_bytes
    got, want = dict(log.model_buffers), {b.name: b.bytes for b in p.buffers}
    names_ok = got.keys() == want.keys() and all(same(got[k], want[k], prec) for k in got)
    out_meas = sum(n for _, n in log.output_buffers)
    out_ok = same(out_meas, p.output_at_load, prec)
    exact, comp_ok = names_ok and out_ok, True
    for d in sorted({x.name for x in p.footprint.devices} | {x.name for x in meas.devices}):
        pd, md = p.footprint.device(d), meas.device(d)
        pm, mm = (pd.model.bytes if pd else 0), (md.model.bytes if md else 0)
        pc, mc = (pd.context.bytes if pd else 0), (md.context.bytes if md else 0)
        pk, mk = (pd.compute.bytes if pd else 0), (md.compute.bytes if md else 0)
        dev_ok = same(pm, mm, prec) and same(pc, mc, prec)
        exact = exact and dev_ok
        rel = abs(pk - mk) / mk if mk else (0.0 if not pk else 1.0)
        comp_ok = comp_ok and rel <= COMPUTE_TOLERANCE
        t.rows.append(f"{head} {d} | {_d(mm, pm)} | {_d(mc, pc)} | {_d(mk, pk)} ({rel * 100:.2f} %) | "
                      f"{'exact' if dev_ok else 'MISS'} |")
    t.rows.append(f"{head} output | {_d(out_meas, p.output_at_load)} | | | {'exact' if out_ok else 'MISS'} |")
    t.exact += exact
    t.compute_ok += comp_ok
    if not exact:
        t.misses.append(f"{rec['model']} {rec['label']}: model/KV/output not exact"
                        + ("" if names_ok else f" (buffers {dict(log.model_buffers)} priced "
                                               f"{ {b.name: b.bytes for b in p.buffers} })"))
    dev = meas.device("CUDA0")
    used = rec.get("nvml", {}).get("CUDA0")
    if dev is not None and isinstance(used, int):
        t.overheads.append(used - dev.total_bytes)


def report(path: Path, *, write: bool = True) -> int:
    facts, recs = read_records(path)
    host = HostBuffers.from_json(facts["host_buffers"])
    names = sorted({r["model"] for r in recs})
    zoo = {m.name: load_structure(m.path) for m in write_zoo(Path(tempfile.mkdtemp(prefix="fitevict-gpu-")),
                                                              only=names)}
    t = Tally()
    for rec in recs:
        compare(rec, zoo[rec["model"]], host, t)
    over = (f"{min(t.overheads) / MiB:.0f}-{max(t.overheads) / MiB:.0f} MiB over {len(t.overheads)} loads"
            if t.overheads else "unavailable, because NVML attributed no memory to the seats")
    body = "\n".join([
        "### GPU placement on CUDA0, recorded on a real GPU",
        "",
        f"Recorded {facts['date']} on {facts['gpu']} (CUDA {' '.join(facts['nvcc'])}), CPU {facts['cpu_model']}, "
        f"commit {facts['commit']}; CUDA build {facts.get('build_seconds') or 'cached'} s. "
        "Replayed from the records by `bench/gpu_placement_check.py --report FILE`; the stamp below is the replay's.",
        "",
        f"**{t.exact} of {t.loads} loads priced exactly** (every model buffer by name, KV per device, output: "
        f"{'allocator bytes' if t.precisions == {0} else 'as the load log prints them, 0.01 MiB, where the allocator trace was unavailable'}); compute within 1 % of the allocator in {t.compute_ok} of {t.loads} (dry run on the "
        f"device). The seat's GPU memory as NVML read it exceeded the allocator's CUDA0 bytes by {over}: the CUDA "
        "context and runtime, measured.",
        "",
        "| model | placement | device | model bytes (Δ priced) | KV (Δ) | compute (Δ) | |",
        "|---|---|---|---|---|---|---|",
        *t.rows,
        *([""] + [f"- miss: {m}" for m in t.misses] if t.misses else []),
    ])
    print(body)
    if write:
        write_section("gpu-placement", body, doc=DOC)
    return 1 if t.misses or t.compute_ok < t.loads else 0
