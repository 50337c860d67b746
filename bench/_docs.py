"""Write one benchmark's section of a doc between its own markers, leaving the others alone, with its stamp.

Every table of figures in ``docs/`` and README lies in such a section (``<!-- name:start -->`` ...
``<!-- name:end -->``), and a bench under ``bench/`` writes it by its name. The section's last line is its **stamp**
(``Stamp``): the commit the run was on, its date, the CPU's model and a digest of its flags, the load average when it
began, and the exact command. A bench that saves its rows (JSON) saves the stamp with them and renders the section
again from them (``rerender()``), stamp included, so the same file gives the same section
(``tests/test_doc_sections.py`` checks the markers, the stamps and the renders)."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
STAMP_HEAD = "Stamp:"


def _git(*args: str) -> str:
    got = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    return got.stdout.strip() if got.returncode == 0 else ""


def _commit() -> str:
    head = _git("rev-parse", "--short", "HEAD")
    if not head:
        return "unavailable, because git could not read the repository"
    changed = [x for x in _git("diff", "--name-only", "HEAD", "--", "src", "bench").splitlines() if x]
    return (f"{head} with uncommitted changes in {', '.join(changed)}" if changed
            else f"{head} (src/ and bench/ as committed)")


def _cpu() -> tuple[str, str]:
    """The CPU's model name and a digest of its feature flags, from /proc/cpuinfo."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError as e:
        why = f"unavailable, because /proc/cpuinfo could not be read ({e.strerror})"
        return why, why
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", info, re.M)
    digest = (f"sha256 {hashlib.sha256(' '.join(sorted(flags.group(1).split())).encode()).hexdigest()[:12]}"
              if flags else "unavailable, because /proc/cpuinfo lists no flags")
    return (model.group(1).strip() if model else "unavailable, because /proc/cpuinfo names no model"), digest


def _command(argv: list[str]) -> str:
    script = Path(argv[0]).resolve() if argv else None
    if script is None or not script.exists():
        return "unavailable, because the run was not started from a script"
    try:
        shown = str(script.relative_to(ROOT))
    except ValueError:
        shown = str(script)
    return shlex.join([".venv/bin/python", shown, *argv[1:]])


@dataclass(frozen=True)
class Stamp:
    """Where a section's figures came from. A field the run could not know says "unavailable, because ..."."""

    commit: str
    date: str
    cpu: str
    flags: str
    load: str
    command: str

    @classmethod
    def now(cls, argv: list[str] | None = None) -> Stamp:
        cpu, flags = _cpu()
        return cls(commit=_commit(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), cpu=cpu, flags=flags,
                   load=" / ".join(f"{x:.2f}" for x in os.getloadavg()),
                   command=_command(list(sys.argv if argv is None else argv)))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, saved: dict | str | None, **known: str) -> Stamp:
        """A saved stamp. A run saved before stamps were whole (a line "Ran on commit X, ..., DATE", or nothing)
        keeps what it had, takes what else its rows recorded (``known``: the CPU, the load) and says why the rest is
        unavailable."""
        if isinstance(saved, dict):
            return cls(**{f.name: str(saved[f.name]) for f in fields(cls)})
        why = "unavailable, because the run saved " + ("only its commit and date" if saved else "no stamp")
        m = re.fullmatch(r"Ran on commit (\S+), (.+), (\d{4}-\d\d-\d\d \d\d:\d\d UTC)", (saved or "").strip())
        got = {"commit": f"{m.group(1)} ({m.group(2)})", "date": m.group(3)} if m else {}
        return cls(**{f.name: known.get(f.name) or got.get(f.name) or why for f in fields(cls)})

    def line(self) -> str:
        return (f"{STAMP_HEAD} commit {self.commit}; date {self.date}; CPU {self.cpu}; flags {self.flags}; "
                f"load average {self.load} at the start; command `{self.command}`.")

    @classmethod
    def parse(cls, line: str) -> Stamp | None:
        """The stamp a section's last line holds, or None when it holds none (or one with a field missing)."""
        m = re.fullmatch(rf"{STAMP_HEAD} commit (.+?); date (.+?); CPU (.+?); flags (.+?); "
                         r"load average (.+?) at the start; command `(.*)`\.", line.strip())
        return cls(*m.groups()) if m and all(g.strip() for g in m.groups()) else None


STARTED = Stamp.now()  # this run's stamp, taken as it began (a bench imports this module first thing)


def section_text(name: str, body: str, stamp: Stamp) -> str:
    """The block ``write_section`` writes: the markers, the body, and the stamp as the last line."""
    return f"<!-- {name}:start -->\n{body.rstrip()}\n\n{stamp.line()}\n<!-- {name}:end -->"


def write_section(name: str, body: str, doc: Path = DOC, stamp: Stamp | None = None) -> None:
    """Write ``body`` as the section ``name`` of ``doc``, stamped with ``stamp`` (a saved run's) or this run's
    (``STARTED``)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    block = section_text(name, body, stamp or STARTED)
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)


@dataclass(frozen=True)
class Section:
    """One section a bench writes: the doc, its name, the body and the stamp of the run its figures came from."""

    doc: Path
    name: str
    body: str
    stamp: Stamp

    def text(self) -> str:
        return section_text(self.name, self.body, self.stamp)


def publish(sections: list[Section]) -> None:
    for s in sections:
        write_section(s.name, s.body, doc=s.doc, stamp=s.stamp)


MARKER = re.compile(r"^<!-- ([\w-]+):(start|end) -->$")
DOCS = (*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md")


def sections_of(doc: Path) -> dict[str, tuple[int, list[str]]]:
    """Each section of ``doc`` by name: the line number of its start marker and the lines between its markers."""
    out: dict[str, tuple[int, list[str]]] = {}
    name, start, body = None, 0, []
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        m = MARKER.match(line.strip())
        if m and m.group(2) == "start":
            name, start, body = m.group(1), n, []
        elif m and name == m.group(1):
            out[name] = (start, body)
            name = None
        elif name is not None:
            body.append(line)
    return out


def history_stamp(doc: Path, first: int, last: int) -> Stamp:
    """The stamp of a section written before runs were stamped, from git: the newest commit among its lines."""
    blame = _git("blame", "--line-porcelain", "-L", f"{first},{last}", "--", str(doc.relative_to(ROOT)))
    newest = max(((int(t), c) for c, t in re.findall(r"^([0-9a-f]{40}) .*?^committer-time (\d+)$", blame, re.M | re.S)
                  if c.strip("0")), default=None)
    why = "unavailable, because the run recorded no stamp"
    if newest is None:
        return Stamp(commit=why, date=why, cpu=why, flags=why, load=why, command=why)
    return Stamp(commit=f"unavailable, because the run recorded no stamp; its figures were last written in "
                        f"commit {newest[1][:7]}", date=time.strftime("%Y-%m-%d", time.gmtime(newest[0])) +
                 " (that commit's date)", cpu=why, flags=why, load=why, command=why)


def stamp_unstamped() -> list[str]:
    """Stamp, from git history, each section of the docs whose last line is no stamp; the names of those stamped.
    A doc's stamps are all read before any is written (a written stamp moves the lines below it)."""
    done = []
    for doc in DOCS:
        todo = {name: (body, history_stamp(doc, start + 1, start + len(body)))
                for name, (start, body) in sections_of(doc).items()
                if body and Stamp.parse(next((x for x in reversed(body) if x.strip()), "")) is None}
        for name, (body, stamp) in todo.items():
            write_section(name, "\n".join(body), doc=doc, stamp=stamp)
            done.append(f"{doc.relative_to(ROOT)}:{name}")
    return done


if __name__ == "__main__":
    if sys.argv[1:] != ["--stamp-unstamped"]:
        raise SystemExit("usage: bench/_docs.py --stamp-unstamped   (stamps, from git history, each section "
                         "written before runs were stamped)")
    print("\n".join(stamp_unstamped()) or "every section is stamped")
