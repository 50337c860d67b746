"""Record what the host-buffer probe's one-layer loads allocate on this machine, for tests on any machine.

The probe (``llama_cpp/probe.py``) writes, for every ggml type it knows and several shape classes, a one-layer model
whose weights are F32 but one matrix, loads it into llama-server under the allocator trace and reads which buffer
types the engine tried for the probed weight and what it allocated. This script runs the same loads and keeps their
raw answers, the trace lines (``fitevict-buftrace: alloc <buffer type> <bytes>``) of each case and of the all-F32
baseline, with the CPU and the engine build they came from, and what ``learn`` made of them then. The file goes to
``tests/data/probe/``, one per machine; ``tests/engines/test_probe_record.py`` checks ``learn`` against every file
there. A machine with another CPU (an Intel Xeon with AMX, an ARM server) adds its own file by running this.

    .venv/bin/python bench/probe_record.py [--out tests/data/probe/NAME.json] [--types F16,Q4_0,...]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

from gguf import GGMLQuantizationType as QT

from fitevict.engines.llama_cpp.buftrace import Unavailable, buftrace_library
from fitevict.engines.llama_cpp.install import resolve_binary
from fitevict.engines.llama_cpp.machine import machine_key, this_cpu
from fitevict.engines.llama_cpp.probe import PROBE_TYPES, cases, learn, read_trace, run_engine, write_model

ROOT = Path(__file__).resolve().parents[1]
FORMAT = 1
TRACE = "fitevict-buftrace: alloc "


def trace_lines(lines: list[str]) -> list[str]:
    """The allocator trace's allocation lines, in order: all the probe reads."""
    return [line[line.index(TRACE):].rstrip() for line in lines if TRACE in line]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="default: tests/data/probe/<cpu model>-<arch>.json")
    ap.add_argument("--types", default=",".join(t.name for t in PROBE_TYPES), help="ggml types, comma-separated")
    args = ap.parse_args()
    found = resolve_binary("llama-server")
    if found.path is None:
        raise SystemExit(f"no llama-server: {found.why}")
    lib = buftrace_library()
    if isinstance(lib, Unavailable):
        raise SystemExit(lib.reason)
    binary, cpu, t0 = found.path, this_cpu(), time.monotonic()
    out = args.out or ROOT / "tests" / "data" / "probe" / f"{slug(cpu.model)}-{cpu.arch}.json"
    recorded = []
    with tempfile.TemporaryDirectory(prefix="fitevict-probe-record-") as tmp:
        base = Path(tmp) / "f32.gguf"
        write_model(None, base)
        baseline = trace_lines(run_engine(binary, base, lib))
        for case in cases(tuple(QT[t] for t in args.types.split(","))):
            path = Path(tmp) / f"{case.name}.gguf"
            write_model(case, path)
            recorded.append({"type": case.ggml_type.name, "k": case.k, "n": case.n, "expert": case.expert,
                             "trace": trace_lines(run_engine(binary, path, lib))})
            path.unlink()
            print(f"{case.name}: {recorded[-1]['trace'][-1] if recorded[-1]['trace'] else 'no trace'}", flush=True)
    from fitevict.engines.llama_cpp.probe import Case

    seen = {Case(QT[c["type"]], c["k"], c["n"], c["expert"]): read_trace(c["trace"]) for c in recorded}
    learned = learn(seen, read_trace(baseline), cpu, machine_key(binary, cpu))
    doc = {"format": FORMAT, "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu.model,
           "arch": cpu.arch, "cpu_flags": sorted(cpu.flags), "engine": machine_key(binary, cpu),
           "seconds": round(time.monotonic() - t0, 1), "baseline": baseline, "cases": recorded,
           "learned": learned.to_json()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}: {len(recorded)} cases in {doc['seconds']} s; learned {learned.label()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
