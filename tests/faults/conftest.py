"""Fault tests drive real processes with the e2e helpers (tests/e2e/_frontdoor.py, _server.py, _models.py)."""

from __future__ import annotations

import sys
from pathlib import Path

E2E = str(Path(__file__).resolve().parent.parent / "e2e")
if E2E not in sys.path:
    sys.path.insert(0, E2E)


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "fault(fault, client, history, running, lost): the test's row in the fault table (docs/faults.md): the fault "
        "injected, what the client saw, what history says, what was left running, what was lost")
