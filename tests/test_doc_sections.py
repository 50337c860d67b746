"""Every table of figures in the benchmark and accuracy docs is written by a script.

``bench/_docs.write_section`` writes a bench's output between ``<!-- name:start -->`` and ``<!-- name:end -->``. A
table (a run of lines starting with ``|``) in ``docs/benchmarks.md``, ``docs/accuracy.md``, ``docs/machines.md`` or
``docs/cluster.md`` must lie inside such a section, and the section must have a generator: a script under ``bench/``
that writes it (``write_section`` with the section's name, or its own writer of those markers). Reads files only:
no bench runs.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("docs/benchmarks.md", "docs/accuracy.md", "docs/machines.md", "docs/cluster.md")
MARK = re.compile(r"^<!-- ([\w-]+):(start|end) -->$")


def check(text: str, generators: dict[str, list[str]]) -> list[str]:
    """What is wrong with one doc: markers unpaired or nested, tables outside a section (by the line they start
    on), sections no script writes."""
    problems: list[str] = []
    open_: tuple[str, int] | None = None
    seen: set[str] = set()
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
                open_ = (name, n)
            elif open_ is None or open_[0] != name:
                problems.append(f"line {n}: section {name!r} ends where it did not start")
            else:
                open_ = None
            in_table = False
            continue
        table = line.startswith("|")
        if table and not in_table and open_ is None:
            problems.append(f"line {n}: a table outside any section a script writes: {line[:80]!r}")
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
        if "write_section(" in text:
            names |= set(re.findall(r"write_section\(\s*[\"']([\w-]+)[\"']", text))
            names |= set(re.findall(r"^SECTION\w* = [\"']([\w-]+)[\"']", text, re.M))
        for name in names:
            out.setdefault(name, []).append(path.name)
    return out


def test_every_table_in_the_docs_is_written_by_a_script() -> None:
    gens = bench_generators()
    problems = {doc: check((ROOT / doc).read_text(), gens) for doc in DOCS}
    assert {doc: p for doc, p in problems.items() if p} == {}


def test_the_check_finds_a_table_no_script_wrote() -> None:
    gens = {"made": ["made.py"]}
    good = "# Doc\n\n<!-- made:start -->\n| a | b |\n|---|---|\n| 1 | 2 |\n<!-- made:end -->\n\nprose\n"
    assert check(good, gens) == []
    outside = good + "\n| hand | made |\n|---|---|\n| 3 | 4 |\n"
    assert check(outside, gens) == ["line 11: a table outside any section a script writes: '| hand | made |'"]
    orphan = good.replace("made:", "hand:")
    assert check(orphan, gens) == ["section 'hand': no script under bench/ writes it"]
    unclosed = "<!-- made:start -->\n| a |\n"
    assert check(unclosed, gens) == ["line 1: section 'made' never ends"]
    nested = "<!-- made:start -->\n<!-- made:start -->\n<!-- made:end -->\n"
    assert [p.split(": ", 1)[1] for p in check(nested, gens)] == ["section 'made' starts inside 'made' (line 1)",
                                                            "section 'made' appears twice"]


def test_the_generators_are_found_by_name() -> None:
    gens = bench_generators()
    assert "prompt_keep.py" in gens["prompt_keep"] and "filled_context.py" in gens["filled"]
    assert "plan_latency.py" in gens["plan_latency"]  # a bench with its own writer of the markers
