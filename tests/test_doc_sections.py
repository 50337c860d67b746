"""Every table of figures in the docs and README is written by a script, under the stamp of the run it came from.

``bench/_docs.write_section`` writes a bench's output between ``<!-- name:start -->`` and ``<!-- name:end -->``, with
a stamp as its last line (``bench/_docs.Stamp``: commit, date, CPU model and flags digest, load average, command).
The checks:

- in ``docs/benchmarks.md``, ``docs/accuracy.md``, ``docs/machines.md`` and ``docs/cluster.md`` every table (a run of
  lines starting with ``|``) lies inside such a section; in every other doc and README, a table holding a measured
  figure (a decimal percentage, a ratio ``1.5×`` or a signed decimal) does;
- every section has a generator (a script under ``bench/`` that writes it by name) and ends with a whole stamp: a
  field the run could not know says "unavailable, because ...";
- a bench that saves its rows renders its sections again from them (``rerender()``), stamp included, exactly as the
  docs hold them.

Reads files only: no bench runs.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _docs import DOCS, Section, Stamp, section_text  # noqa: E402

FIGURE_DOCS = ("docs/benchmarks.md", "docs/accuracy.md", "docs/machines.md", "docs/cluster.md")
MARK = re.compile(r"^<!-- ([\w-]+):(start|end) -->$")
FIGURE = re.compile(r"(?<![\w.])(?:[+\-−]\d+\.\d+|\d+\.\d+\s?(?:%|×))")
RENDERED = ("fault_table", "filled_context", "lifesize_accuracy", "prompt_keep")  # benches whose saved rows are committed


def _table_problem(line: str, n: int, every_table: bool) -> str | None:
    if every_table:
        return f"line {n}: a table outside any section a script writes: {line[:80]!r}"
    hit = FIGURE.search(line)
    return f"line {n}: a figure ({hit.group(0)!r}) in a table outside any section: {line[:80]!r}" if hit else None


def check(text: str, generators: dict[str, list[str]], every_table: bool = True) -> list[str]:
    """What is wrong with one doc: markers unpaired or nested, tables outside a section (by the line they start
    on; with ``every_table`` off, only those holding a measured figure), sections no script writes, sections with
    no whole stamp as their last line."""
    problems: list[str] = []
    open_: tuple[str, int] | None = None
    seen: set[str] = set()
    last = ""
    in_table = False
    for n, line in enumerate(text.splitlines(), 1):
        m = MARK.match(line.strip())
        if m:
            name, edge = m.groups()
            if edge == "start":
                if open_ is not None:
                    problems.append(f"line {n}: section {name!r} starts inside {open_[0]!r} (line {open_[1]})")
                if name in seen:
                    problems.append(f"line {n}: section {name!r} appears twice")
                seen.add(name)
                open_, last = (name, n), ""
            elif open_ is None or open_[0] != name:
                problems.append(f"line {n}: section {name!r} ends where it did not start")
            else:
                if Stamp.parse(last) is None:
                    problems.append(f"section {name!r}: its last line is no whole stamp: {last[:80]!r}")
                open_ = None
            in_table = False
            continue
        last = line if line.strip() else last
        table = line.startswith("|")
        if table and open_ is None and (not in_table or not every_table):
            problem = _table_problem(line, n, every_table)
            problems += [problem] if problem else []
        in_table = table
    if open_ is not None:
        problems.append(f"line {open_[1]}: section {open_[0]!r} never ends")
    problems += [f"section {name!r}: no script under bench/ writes it" for name in sorted(seen)
                 if not generators.get(name)]
    return problems


def bench_generators() -> dict[str, list[str]]:
    """Section name -> the bench scripts that write a section of that name."""
    out: dict[str, list[str]] = {}
    for path in sorted((ROOT / "bench").glob("*.py")):
        text = path.read_text()
        names = set(re.findall(r"<!-- ([\w-]+):start -->", text))  # a writer of its own markers
        if "write_section(" in text or "Section(" in text:
            names |= set(re.findall(r"write_section\(\s*[\"']([\w-]+)[\"']", text))
            names |= set(re.findall(r"Section\([^,]+,\s*[\"']([\w-]+)[\"']", text))
            names |= set(re.findall(r"^SECTION\w* = [\"']([\w-]+)[\"']", text, re.M))
        for name in names:
            out.setdefault(name, []).append(path.name)
    return out


def test_every_table_in_the_docs_is_written_by_a_script_and_stamped() -> None:
    gens = bench_generators()
    problems = {str(doc.relative_to(ROOT)): check(doc.read_text(), gens,
                                                   every_table=str(doc.relative_to(ROOT)) in FIGURE_DOCS)
                for doc in DOCS}
    assert {doc: p for doc, p in problems.items() if p} == {}


STAMP = Stamp.from_json({"commit": "abc1234 (src/ and bench/ as committed)", "date": "2026-12-04 18:00 UTC",
                         "cpu": "AMD EPYC", "flags": "sha256 0123456789ab", "load": "1.00 / 0.50 / 0.25",
                         "command": ".venv/bin/python bench/made.py --runs 3"})


def test_the_check_finds_a_table_no_script_wrote_and_a_missing_stamp() -> None:
    gens = {"made": ["made.py"]}
    table = "| a | b |\n|---|---|\n| 1 | 2 |"
    good = "# Doc\n\n" + section_text("made", table, STAMP) + "\n\nprose\n"
    assert check(good, gens) == []
    outside = good + "\n| hand | made |\n|---|---|\n| 3 | 4 |\n"
    assert check(outside, gens) == ["line 13: a table outside any section a script writes: '| hand | made |'"]
    assert check(outside, gens, every_table=False) == []  # no figure in it
    figure = good + "\n| hand | made |\n|---|---|\n| 3 | +4.5% |\n"
    assert check(figure, gens, every_table=False) == [
        "line 15: a figure ('+4.5') in a table outside any section: '| 3 | +4.5% |'"]
    orphan = good.replace("made:", "hand:")
    assert check(orphan, gens) == ["section 'hand': no script under bench/ writes it"]
    unstamped = "<!-- made:start -->\n| a |\n<!-- made:end -->\n"
    assert check(unstamped, gens) == ["section 'made': its last line is no whole stamp: '| a |'"]
    torn = good.replace("; flags sha256 0123456789ab", "")
    assert [p.split(":")[0] for p in check(torn, gens)] == ["section 'made'"]
    unclosed = "<!-- made:start -->\n| a |\n"
    assert check(unclosed, gens) == ["line 1: section 'made' never ends"]


def test_a_stamp_reads_back_as_written_and_says_what_a_run_did_not_save() -> None:
    assert Stamp.parse(STAMP.line()) == STAMP
    now = Stamp.now(["bench/made.py", "--runs", "3"])
    assert Stamp.parse(now.line()) == now
    assert now.command.endswith("bench/made.py --runs 3") or now.command.startswith("unavailable, because")
    legacy = Stamp.from_json("Ran on commit cc6196d, src/ as committed, 2026-12-02 09:14 UTC", cpu="AMD EPYC")
    assert (legacy.commit, legacy.date, legacy.cpu) == ("cc6196d (src/ as committed)", "2026-12-02 09:14 UTC",
                                                        "AMD EPYC")
    assert legacy.load.startswith("unavailable, because") and legacy.command.startswith("unavailable, because")


@pytest.mark.parametrize("bench", RENDERED)
def test_a_saved_run_renders_its_sections_again_exactly(bench: str) -> None:
    got: list[Section] = importlib.import_module(bench).rerender()
    assert got
    for s in got:
        text = s.doc.read_text()
        start, end = f"<!-- {s.name}:start -->", f"<!-- {s.name}:end -->"
        held = start + text.split(start, 1)[1].split(end, 1)[0] + end
        assert held == s.text(), f"{s.doc.name}: section {s.name!r} differs from {bench}.rerender()"


def test_the_generators_are_found_by_name() -> None:
    gens = bench_generators()
    assert "prompt_keep.py" in gens["prompt_keep"] and "filled_context.py" in gens["filled"]
    assert "plan_latency.py" in gens["plan_latency"]  # a bench with its own writer of the markers
