"""Write one benchmark's section of a doc between its own markers, leaving the others alone.

Every table in ``docs/benchmarks.md``, ``docs/accuracy.md``, ``docs/machines.md`` and ``docs/cluster.md`` lies in
such a section (``<!-- name:start -->`` ... ``<!-- name:end -->``), and a bench under ``bench/`` writes it by its name
(``tests/test_doc_sections.py`` checks both)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"


def write_section(name: str, body: str, doc: Path = DOC) -> None:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)


def run_stamp() -> str:
    """The commit the bench ran on, and whether the working tree differed from it in src/ (then the files)."""
    def git(*args: str) -> str:
        got = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
        return got.stdout.strip() if got.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unavailable, because git could not read the repository"
    changed = [x for x in git("diff", "--name-only", "HEAD", "--", "src").splitlines() if x]
    tree = (f", with uncommitted changes in {len(changed)} file(s) of src/ ({', '.join(changed)})" if changed
            else ", src/ as committed")
    return f"Ran on commit {head}{tree}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
