"""Fault tests drive real processes with the e2e helpers (tests/e2e/_frontdoor.py, _server.py, _models.py).

Each fault test carries its row of the fault table as ``@pytest.mark.fault(fault=, kind=)`` and records what it
asserts through the ``fault_seen`` fixture: ``faultrows.py`` beside this file (loaded by tests/conftest.py for every
folder) has both, and the plugin that writes the rows when ``FITEVICT_FAULT_TABLE=PATH`` is set."""

from __future__ import annotations

import sys
from pathlib import Path

E2E = str(Path(__file__).resolve().parent.parent / "e2e")
if E2E not in sys.path:
    sys.path.insert(0, E2E)
