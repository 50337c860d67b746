"""Every test in tests/faults/ carries its row of the fault table: a ``fault`` marker with the five texts (read from
the source, nothing run), so the table bench/fault_table.py writes has a row for each fault the suite injects."""

from __future__ import annotations

import ast
from pathlib import Path

FAULTS = Path(__file__).resolve().parent / "faults"
FIELDS = {"fault", "client", "history", "running", "lost"}


def _fault_mark(dec: ast.expr) -> ast.Call | None:
    """``dec`` when it is ``pytest.mark.fault(...)``."""
    if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr == "fault":
        return dec
    return None


def unmarked(source: str) -> list[str]:
    """The test functions of one module without a complete fault marker, each with what it lacks."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.name.startswith("test_"):
            continue
        marks = [m for m in map(_fault_mark, node.decorator_list) if m is not None]
        if not marks:
            out.append(f"{node.name}: no @pytest.mark.fault(...)")
            continue
        given = {k.arg for k in marks[0].keywords if isinstance(k.value, (ast.Constant, ast.JoinedStr))
                 and (not isinstance(k.value, ast.Constant) or str(k.value.value).strip())}
        if FIELDS - given:
            out.append(f"{node.name}: its fault marker lacks {', '.join(sorted(FIELDS - given))}")
    return out


def test_every_fault_test_has_its_row() -> None:
    missing = [f"{p.name}::{m}" for p in sorted(FAULTS.glob("test_*.py")) for m in unmarked(p.read_text())]
    assert not missing, ("fault tests without their row of the fault table (add @pytest.mark.fault(fault=, client=, "
                         "history=, running=, lost=)): " + "; ".join(missing))


def test_the_check_sees_a_missing_marker_and_a_missing_field() -> None:
    src = '''
import pytest
@pytest.mark.fault(fault="f", client="c", history="h", running="r", lost="l")
def test_whole(): pass
@pytest.mark.fault(fault="f", client="c", history="h", running="r", lost="")
def test_empty_field(): pass
@pytest.mark.e2e
def test_bare(): pass
def helper(): pass
'''
    assert unmarked(src) == ["test_empty_field: its fault marker lacks lost", "test_bare: no @pytest.mark.fault(...)"]
