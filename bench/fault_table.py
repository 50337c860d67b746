"""The fault table, made by the suite's own run: runs every test that carries a ``fault`` marker (all of
``tests/faults`` and the marked tests elsewhere) with ``FITEVICT_FAULT_TABLE`` set, and writes the rows the plugin in
``tests/faults/conftest.py`` recorded (fault, what the client saw, what history says, what was left running, what
was lost, the test, whether it passed, its seconds) into docs/faults.md and docs/reliability.md (section
``fault-table``).

    .venv/bin/python bench/fault_table.py [--no-doc] [--rows FILE]   # --rows: write the docs from a run's rows
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import write_section  # noqa: E402
from _serve import cpu_model, load_average  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


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
    runs = [["tests/faults", "-m", "fault"], *(["-p", "faultrows", f] for f in marked_elsewhere())]
    plugin_dir = str(ROOT / "tests" / "faults")  # faultrows.py: tests/faults/conftest.py loads it for its own tests
    rows, rcs, t0 = [], [], time.monotonic()
    for i, args in enumerate(runs):
        part = rows_path.with_suffix(f".{i}.json")
        path = os.pathsep.join(x for x in (plugin_dir, os.environ.get("PYTHONPATH")) if x)
        env = {**os.environ, "FITEVICT_FAULT_TABLE": str(part), "PYTHONPATH": path}
        rcs.append(subprocess.run([*base, *args], cwd=ROOT, env=env).returncode)
        rows += json.loads(part.read_text()) if part.exists() else []
    rows_path.write_text(json.dumps(rows))
    return ["` then `".join("python -m pytest " + " ".join(a) for a in runs)], max(rcs), time.monotonic() - t0


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(rows: list[dict]) -> list[str]:
    out = ["| fault | what the client saw | what history says | what was left running | lost | test | result | s |",
           "|---|---|---|---|---|---|---|---:|"]
    for r in rows:
        test = r["test"].removeprefix("tests/faults/")
        result = r["outcome"] + (f": {_cell(r['why'])}" if r.get("why") else "")
        out.append(f"| {_cell(r['fault'])} | {_cell(r['client'])} | {_cell(r['history'])} | {_cell(r['running'])} | "
                   f"{_cell(r['lost'])} | `{test}` | {result} | {r['seconds']:.1f} |")
    return out


def body(rows: list[dict], ctx: dict) -> str:
    passed = sum(1 for r in rows if r["outcome"] == "passed")
    return "\n".join([
        f"Written by `bench/fault_table.py` from the runs `{' '.join(ctx['argv'])}` on {ctx['date']} "
        f"(fitevict "
        f"{ctx['commit']}, {ctx['cpu']}, {ctx['cores']} cores shared with other work, 1-minute load average "
        f"{ctx['load_before']} before and {ctx['load_after']} after; {ctx['seconds']:.0f} s in all, pytest exit "
        f"code {ctx['rc']}): {len(rows)} fault tests, {passed} passed. Each row is the test's own `fault` marker; "
        "`s` is the test's call alone, after its module's front door started (its fixture).",
        "",
        *table(rows),
    ])


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "tests"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return (head.stdout.strip() or "unknown commit") + (" with uncommitted changes in src/ or tests/" if dirty else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--rows", type=Path, default=None, help="a run's rows (JSON) and context, already made")
    args = ap.parse_args()
    if args.rows is not None:
        saved = json.loads(args.rows.read_text())
        rows, ctx = saved["rows"], saved["ctx"]
    else:
        ctx = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit(), "cpu": cpu_model(),
               "cores": os.cpu_count(), "load_before": load_average().split(" / ")[0]}
        with tempfile.TemporaryDirectory(prefix="fitevict-faults-") as tmp:
            path = Path(tmp) / "rows.json"
            ctx["argv"], ctx["rc"], ctx["seconds"] = run_suite(path)
            rows = json.loads(path.read_text()) if path.exists() else []
        ctx["load_after"] = load_average().split(" / ")[0]
        (Path(tempfile.gettempdir()) / "fitevict-fault-table.json").write_text(json.dumps({"rows": rows, "ctx": ctx}))
    if not rows:
        raise SystemExit("no fault rows were written: did pytest collect the fault tests? (its exit code: "
                         f"{ctx.get('rc')})")
    text = body(rows, ctx)
    if not args.no_doc:
        write_section("fault-table", text, DOCS / "faults.md")
        write_section("fault-table", text, DOCS / "reliability.md")
    print(text)


if __name__ == "__main__":
    main()
