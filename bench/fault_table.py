"""The fault table, made by the suite's own run: runs every test that carries a ``fault`` marker (all of
``tests/faults`` and the marked tests elsewhere) with ``FITEVICT_FAULT_TABLE`` set, and writes the rows the plugin in
``tests/faults/faultrows.py`` wrote: the fault and the test's kind (its marker), what the client saw, what history
says, what was left running and what was lost (what the test asserted, recorded through its ``fault_seen`` fixture;
"not asserted" where it recorded nothing), the test, whether it passed, its seconds. The table goes into
docs/faults.md and docs/reliability.md (section ``fault-table``), the count of rows by kind into README (section
``fault-kinds``).

    .venv/bin/python bench/fault_table.py [--no-doc] [--rows FILE]     # --rows: a saved run's rows and stamp
    .venv/bin/python bench/fault_table.py --runs A.json B.json ...     # rows the plugin wrote in separate runs
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import Section, Stamp, publish  # noqa: E402
from _serve import load_average  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SAVED = Path(__file__).resolve().parent / "fault_table.json"  # the last run's rows, context and stamp
KINDS = ("real door", "collaborator with stand-ins", "rule alone")  # as tests/faults/faultrows.py has them
COLUMNS = ("client", "history", "running", "lost")


def _marked(path: Path) -> bool:
    """Whether a test function in ``path`` carries a fault marker (read from the source: no collection needed)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "fault"
                for d in node.decorator_list):
            return True
    return False


def marked_elsewhere() -> list[str]:
    """Test files outside tests/faults with a test that carries a fault marker."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if "faults" not in p.relative_to(ROOT / "tests").parts and _marked(p))


def run_suite(rows_path: Path) -> tuple[list[str], int, float]:
    """``pytest -m fault`` over tests/faults, then each other file with a marked test whole (its marked tests may
    rely on the module's earlier ones); their commands, worst exit code and seconds. The rows of both runs are
    written to ``rows_path``."""
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    runs = [["tests/faults", "-m", "fault"], *([f] for f in marked_elsewhere())]  # tests/conftest.py: the plugin
    rows, rcs, t0 = [], [], time.monotonic()
    for i, args in enumerate(runs):
        part = rows_path.with_suffix(f".{i}.json")
        env = {**os.environ, "FITEVICT_FAULT_TABLE": str(part)}
        rcs.append(subprocess.run([*base, *args], cwd=ROOT, env=env).returncode)
        rows += json.loads(part.read_text()) if part.exists() else []
    rows_path.write_text(json.dumps(rows))
    return ["` then `".join("python -m pytest " + " ".join(a) for a in runs)], max(rcs), time.monotonic() - t0


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(rows: list[dict]) -> list[str]:
    out = ["| fault | kind | what the client saw | what history says | what was left running | lost | test | result "
           "| s |",
           "|---|---|---|---|---|---|---|---|---:|"]
    for r in rows:
        test = r["test"].removeprefix("tests/faults/")
        result = r["outcome"] + (f": {_cell(r['why'])}" if r.get("why") else "")
        seen = " | ".join(_cell(r.get(c) or "not asserted") for c in COLUMNS)
        out.append(f"| {_cell(r['fault'])} | {r.get('kind') or 'no kind'} | {seen} | `{test}` | {result} | "
                   f"{r['seconds']:.1f} |")
    return out


def kinds_line(rows: list[dict]) -> str:
    """How many rows of each kind, and how many columns each kind left unasserted."""
    counts = Counter(r.get("kind") or "no kind" for r in rows)
    unasserted = sum(1 for r in rows for c in COLUMNS if (r.get(c) or "not asserted") == "not asserted")
    parts = [f"{counts[k]} {k}" for k in (*KINDS, "no kind") if counts[k]]
    return (f"{len(rows)} fault tests by what they drive: {', '.join(parts)} (real door: a real `fitevict serve` "
            "spoken to over HTTP; collaborator with stand-ins: a part of fitevict driven in the test's process, "
            "with stand-ins for what it talks to; rule alone: one rule, no process). "
            f"{unasserted} of their {len(rows) * len(COLUMNS)} descriptive cells say \"not asserted\".")


def body(rows: list[dict], ctx: dict) -> str:
    passed = sum(1 for r in rows if r["outcome"] == "passed")
    return "\n".join([
        f"Written by `bench/fault_table.py` from {ctx['how']} ({ctx['cores']} cores shared with other work, 1-minute "
        f"load average {ctx['load']}; {ctx['seconds']:.0f} s in all, pytest exit code {ctx['rc']}): {len(rows)} fault "
        f"tests, {passed} passed. Each row's fault and kind are the test's `fault` marker; what the client saw, what "
        "history says, what was left running and what was lost are the values the test's assertions read, recorded as "
        "it asserted them (its `fault_seen` fixture), and \"not asserted\" where it checked nothing of that. `s` is "
        "the test's call alone, after its module's front door started (its fixture).",
        "",
        kinds_line(rows),
        "",
        *table(rows),
    ])


def from_runs(paths: list[Path]) -> tuple[list[dict], dict]:
    """The rows of separate runs (each a file the plugin wrote), later runs of a test replacing earlier ones."""
    rows: dict[str, dict] = {}
    for p in paths:
        rows.update({r["test"]: r for r in json.loads(p.read_text())})
    files = sorted({r["test"].split("::")[0] for r in rows.values()})
    ctx = {"how": f"{len(paths)} runs, one or a few test files each (`FITEVICT_FAULT_TABLE=FILE python -m pytest "
                  f"TEST_FILE`, over {', '.join(f'`{f}`' for f in files)}), merged by `--runs`",
           "rc": "per run: see each row's result", "cores": os.cpu_count(),
           "seconds": sum(r["seconds"] + r["setup_seconds"] for r in rows.values()),
           "load": f"{load_average().split(' / ')[0]} when the runs were merged"}
    return list(rows.values()), ctx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--rows", type=Path, default=None, help="a run's rows (JSON), context and stamp, already made")
    ap.add_argument("--runs", type=Path, nargs="+", default=None,
                    help="rows files the plugin wrote (FITEVICT_FAULT_TABLE) in separate runs, merged")
    args = ap.parse_args()
    stamp = Stamp.now()
    if args.rows is not None:
        saved = json.loads(args.rows.read_text())
        rows, ctx, stamp = saved["rows"], saved["ctx"], Stamp.from_json(saved.get("stamp"))
    elif args.runs:
        rows, ctx = from_runs(args.runs)
    else:
        before = load_average().split(" / ")[0]
        with tempfile.TemporaryDirectory(prefix="fitevict-faults-") as tmp:
            path = Path(tmp) / "rows.json"
            argv, rc, seconds = run_suite(path)
            rows = json.loads(path.read_text()) if path.exists() else []
        ctx = {"how": f"the runs `{' '.join(argv)}`", "rc": rc, "seconds": seconds, "cores": os.cpu_count(),
               "load": f"{before} before and {load_average().split(' / ')[0]} after"}
    if not rows:
        raise SystemExit("no fault rows were written: did pytest collect the fault tests? (its exit code: "
                         f"{ctx.get('rc')})")
    if args.rows is None:
        SAVED.write_text(json.dumps({"rows": rows, "ctx": ctx, "stamp": stamp.to_json()}))
    if not args.no_doc:
        publish(sections(rows, ctx, stamp))
    print(body(rows, ctx))


def sections(rows: list[dict], ctx: dict, stamp: Stamp) -> list[Section]:
    """The table in both docs and README's count by kind, under the run's stamp."""
    text = body(rows, ctx)
    return [Section(DOCS / "faults.md", "fault-table", text, stamp),
            Section(DOCS / "reliability.md", "fault-table", text, stamp),
            Section(ROOT / "README.md", "fault-kinds", kinds_line(rows), stamp)]


def rerender() -> list[Section]:
    """The sections again from the committed run (``bench/fault_table.json``)."""
    saved = json.loads(SAVED.read_text())
    return sections(saved["rows"], saved["ctx"], Stamp.from_json(saved.get("stamp")))


if __name__ == "__main__":
    main()
