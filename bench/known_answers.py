"""Pricing against the known answers of another machine: writes its section of docs/machines.md.

``tests/data/hardware/intel-xeon-amx/runs.json`` holds what the pinned llama-server allocated on an Intel Xeon with
AMX for every model of zoo v1, with and without ``-nr``, to the byte. This prices each run twice, side by side:
with the host buffer rules as they were before AMX was known (x86 with AVX-512: CPU_REPACK only), and with the rule
table for that CPU's flags (AMX first), and compares the model buffers with the engine's.

    .venv/bin/python bench/known_answers.py [--no-write]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import write_section  # noqa: E402

from fitevict.pricing import price as pricing  # noqa: E402
from fitevict.pricing.buftrace import parse_exact_log  # noqa: E402
from fitevict.pricing.cmdline import parse_server_argv  # noqa: E402
from fitevict.pricing.gguf import load_structure  # noqa: E402
from fitevict.pricing.hostbufs import rule_table  # noqa: E402
from fitevict.zoo import write_zoo  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "hardware" / "intel-xeon-amx"
DOC = ROOT / "docs" / "machines.md"


def _engine_model_bytes(run: dict) -> dict[str, int]:
    bufs = run["buffers_at_health"] or run["buffers_before_death"] or []
    text = "\n".join([*run["log_buffer_lines"], "fitevict-buftrace: ready",
                      *(f"fitevict-buftrace: alloc {b['buft']} {b['bytes']}" for b in bufs)])
    return dict(parse_exact_log(text).model_buffers)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    runs = json.loads((DATA / "runs.json").read_text())
    before, after = rule_table({"avx2", "avx512f"}), rule_table(runs["cpu_flags"])
    rows, exact = [], {"before": 0, "after": 0}
    with tempfile.TemporaryDirectory() as tmp:
        write_zoo(Path(tmp), version=1)
        for run in runs["runs"]:
            cmd = parse_server_argv([a.replace("<demo-zoo>", tmp) for a in run["argv"][1:]])
            s = load_structure(cmd.model)
            engine = _engine_model_bytes(run)
            total = sum(engine.values())
            line = [run["model"].removesuffix(".gguf"), run["config"].replace("c4096_np1", "c4096 -np 1")
                    .replace("_norepack", " -nr"), ", ".join(f"{k} {v:,}" for k, v in sorted(engine.items()))]
            for label, table in (("before", before), ("after", after)):
                priced = {b.name: b.bytes for b in pricing.price(s, cmd.config, host=table).buffers}
                err = sum(priced.values()) - total
                names_ok = set(priced) == set(engine)
                exact["before" if label == "before" else "after"] += priced == engine
                line.append(("exact" if priced == engine else f"{err:+,} B ({err / total:+.1%})"
                             + ("" if names_ok else f", buffers {'/'.join(sorted(priced))}")))
            rows.append(line)
    n = len(runs["runs"])
    body = [
        "## Before and after, on the known answers",
        "",
        f"`bench/known_answers.py`: the {n} runs of `tests/data/hardware/intel-xeon-amx/runs.json` ({runs['cpu']}, "
        "zoo v1), the model buffers the engine allocated against the price with the host buffer rules of before "
        "(x86 with AVX-512: `CPU_REPACK` only) and of now (the rule table for that CPU's flags, the same as its "
        f"probe would learn). Exact before: {exact['before']} of {n}; exact now: {exact['after']} of {n}.",
        "",
        "| model | flags | engine's model buffers (B) | before | now |",
        "|---|---|---|---|---|",
        *(f"| {' | '.join(r)} |" for r in rows),
    ]
    text = "\n".join(body)
    print(text)
    if not args.no_write:
        write_section("known_answers", text, DOC)


if __name__ == "__main__":
    main()
