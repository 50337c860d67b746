"""Fault tests drive real processes with the e2e helpers (tests/e2e/_frontdoor.py, _server.py, _models.py).

Each fault test carries its row of the fault table as ``@pytest.mark.fault(fault=, client=, history=, running=,
lost=)`` (the marker is registered in pyproject.toml, so tests elsewhere can carry it too). With
``FITEVICT_FAULT_TABLE=PATH`` set, the run writes every marked test's row, with its outcome and seconds, to PATH as
JSON: the plugin is ``faultrows.py`` beside this file (``bench/fault_table.py`` makes the table in docs/faults.md and
docs/reliability.md from it)."""

from __future__ import annotations

import sys
from pathlib import Path

E2E = str(Path(__file__).resolve().parent.parent / "e2e")
if E2E not in sys.path:
    sys.path.insert(0, E2E)

from faultrows import pytest_configure  # noqa: E402,F401  (the plugin: registered when the variable is set)
