"""Every fault test carries its row of the fault table, read from the source (nothing run): a ``fault`` marker with
the fault it injects and a valid ``kind``, no typed-in descriptions of what it saw (those come from its records), and
at least one record of what it asserts through the ``fault_seen`` fixture. A stated kind is checked against the test
where the source shows it: a "real door" test reaches a real front door (``front_door`` or ``running_server``, through
its fixtures and helpers), and a "rule alone" test reaches no process at all."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS / "faults"))

from faultrows import COLUMNS, KINDS  # noqa: E402

HELPERS = (TESTS / "faults", TESTS / "e2e", TESTS / "cluster")  # where a test's imported helpers and fixtures live
REAL_DOOR = {"front_door", "running_server"}  # a real `fitevict serve` process, spoken to over HTTP
RECORDER = {"fault_seen", "seen"}  # the fixture's names in a test and in the helpers it hands it to
PROCESS = REAL_DOOR | {"llama_server", "Popen", "subprocess", "Supervisor"}


def _fault_mark(dec: ast.expr) -> ast.Call | None:
    """``dec`` when it is ``pytest.mark.fault(...)``."""
    if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr == "fault":
        return dec
    return None


def _names(node: ast.AST) -> set[str]:
    """The names a function uses: its parameters and every name and attribute in its body."""
    out = {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
            if isinstance(n.value, ast.Name) and n.value.id in RECORDER and n.attr in COLUMNS:
                out.add(f"recorded {n.attr}")
    return out


class Module:
    """A test module's functions by name, and the helper modules it imports names from."""

    def __init__(self, path: Path, source: str | None = None) -> None:
        self.tree = ast.parse(path.read_text() if source is None else source)
        self.funcs = {n.name: n for n in self.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.imports: dict[str, str] = {}
        for n in self.tree.body:
            if isinstance(n, ast.ImportFrom) and n.module and not n.module.startswith(("fitevict", "__")):
                self.imports.update({a.asname or a.name: n.module for a in n.names})


def reaches(module: Module, func: ast.AST, seen: set[tuple[int, str]] | None = None) -> set[str]:
    """The names ``func`` uses, with those of the module's functions and fixtures it uses, and of the helpers it
    imports from the test folders, transitively."""
    seen = set() if seen is None else seen
    out = _names(func)
    for name in sorted(out):
        target: tuple[Module, ast.AST] | None = None
        if name in module.funcs:
            target = (module, module.funcs[name])
        elif name in module.imports:
            path = next((d / f"{module.imports[name]}.py" for d in HELPERS
                         if (d / f"{module.imports[name]}.py").exists()), None)
            other = Module(path) if path else None
            target = (other, other.funcs[name]) if other and name in other.funcs else None
        if target is not None and (id(target[0].tree), name) not in seen:
            seen.add((id(target[0].tree), name))
            out |= reaches(target[0], target[1], seen)
    return out


def problems(path: Path, source: str | None = None) -> list[str]:
    """What is wrong with one module's fault tests (``source`` stands for the file's text when given): in
    tests/faults every test is one, elsewhere the marked ones."""
    module, out, every = Module(path, source), [], path.parent.name == "faults"
    for node in module.tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.name.startswith("test_"):
            continue
        marks = [m for m in map(_fault_mark, node.decorator_list) if m is not None]
        if not marks and every:
            out.append(f"{node.name}: no @pytest.mark.fault(fault=, kind=)")
        if not marks:
            continue
        kw = {k.arg: k.value.value for k in marks[0].keywords if isinstance(k.value, ast.Constant)}
        if not str(kw.get("fault", "")).strip():
            out.append(f"{node.name}: its fault marker says no fault")
        typed = sorted(set(kw) & set(COLUMNS))
        if typed:
            out.append(f"{node.name}: its marker types {', '.join(typed)} (record them with fault_seen instead)")
        kind = kw.get("kind")
        if kind not in KINDS:
            out.append(f"{node.name}: kind {kind!r} is none of {', '.join(KINDS)}")
        used = reaches(module, node)
        if "fault_seen" not in {a.arg for a in node.args.args} or not used & {f"recorded {c}" for c in COLUMNS}:
            out.append(f"{node.name}: records nothing it asserts (ask for fault_seen and call its "
                       f"{'/'.join(COLUMNS)})")
        if kind == "real door" and not used & REAL_DOOR:
            out.append(f"{node.name}: kind 'real door' but it reaches no {' or '.join(sorted(REAL_DOOR))}")
        if kind == "rule alone" and used & PROCESS:
            out.append(f"{node.name}: kind 'rule alone' but it reaches {', '.join(sorted(used & PROCESS))}")
    return out


def marked_files() -> list[Path]:
    """tests/faults/test_*.py, and every other test file with a fault marker."""
    return sorted({*(TESTS / "faults").glob("test_*.py"),
                   *(p for p in TESTS.rglob("test_*.py") if p != Path(__file__).resolve()
                     and any(map(_fault_mark, (d for n in ast.walk(ast.parse(p.read_text()))
                                               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                                               for d in n.decorator_list))))})


def test_every_fault_test_has_its_row() -> None:
    found = [f"{p.relative_to(TESTS)}::{m}" for p in marked_files() for m in problems(p)]
    assert not found, "fault tests whose row of the fault table is wrong: " + "; ".join(found)


def test_the_check_sees_each_problem() -> None:
    src = '''
import pytest
from _frontdoor import front_door
@pytest.fixture
def door(): return front_door
@pytest.mark.fault(fault="f", kind="real door")
def test_whole(door, fault_seen): assert fault_seen.client(200) == 200
@pytest.mark.fault(fault="f", kind="rule alone")
def test_rule(fault_seen): assert fault_seen.lost(0) == 0
@pytest.mark.fault(fault="f", kind="real door", client="typed")
def test_typed(door, fault_seen): assert fault_seen.client(200) == 200
@pytest.mark.fault(fault="f", kind="real door")
def test_unrecorded(door): pass
@pytest.mark.fault(fault="f", kind="real door")
def test_no_door(fault_seen): assert fault_seen.history([]) == []
@pytest.mark.fault(fault="f", kind="rule alone")
def test_not_alone(door, fault_seen): assert fault_seen.running(None) is None
@pytest.mark.fault(fault="f", kind="a door")
def test_bad_kind(fault_seen): fault_seen.lost(0)
@pytest.mark.e2e
def test_bare(): pass
def helper(): pass
'''
    assert problems(TESTS / "faults" / "test_x.py", src) == [
        "test_typed: its marker types client (record them with fault_seen instead)",
        "test_unrecorded: records nothing it asserts (ask for fault_seen and call its client/history/running/lost)",
        "test_no_door: kind 'real door' but it reaches no front_door or running_server",
        "test_not_alone: kind 'rule alone' but it reaches Popen, front_door, subprocess",
        "test_bad_kind: kind 'a door' is none of real door, collaborator with stand-ins, rule alone",
        "test_bare: no @pytest.mark.fault(fault=, kind=)"]


RECORDING = '''
import pytest

@pytest.mark.fault(fault="f", kind="rule alone")
def test_recorded(fault_seen):
    assert fault_seen.client(503, "status") == 503 and fault_seen.client(503, "status") == 503  # recorded once
    assert fault_seen.lost([], "requests") == [] and fault_seen.running(ValueError("gone")).args == ("gone",)

@pytest.mark.fault(fault="g", kind="rule alone")
def test_failed(fault_seen):
    assert fault_seen.history("crash", "event") == "load"

def test_unmarked(fault_seen):
    fault_seen.client(200)
'''


def test_a_row_is_what_its_test_recorded(tmp_path: Path) -> None:
    """The plugin, run on a test file of its own: each marked test's row holds what it recorded (the value its
    assertion read, even when the assertion failed, with the failure in its result), "not asserted" for the rest;
    an unmarked test has no row."""
    (tmp_path / "test_recording.py").write_text(RECORDING)
    rows_file = tmp_path / "rows.json"
    env = {**os.environ, "FITEVICT_FAULT_TABLE": str(rows_file),
           "PYTHONPATH": os.pathsep.join([str(TESTS / "faults"), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "faultrows", "-p", "no:cacheprovider",
                    "test_recording.py"], cwd=tmp_path, env=env, capture_output=True, timeout=120)
    rows = {r["test"].split("::")[1]: r for r in json.loads(rows_file.read_text())}
    assert set(rows) == {"test_recorded", "test_failed"}
    got = {k: rows["test_recorded"][k] for k in ("fault", "kind", *COLUMNS, "outcome")}
    assert got == {"fault": "f", "kind": "rule alone", "client": "status: 503", "history": "not asserted",
                   "running": "ValueError: gone", "lost": "requests: []", "outcome": "passed"}
    assert rows["test_failed"]["history"] == "event: crash" and rows["test_failed"]["outcome"] == "failed"
