"""Fault tests drive real processes with the e2e helpers (tests/e2e/_frontdoor.py, _server.py, _models.py).

Each fault test carries its row of the fault table as ``@pytest.mark.fault(fault=, client=, history=, running=,
lost=)`` (the marker is registered in pyproject.toml, so tests elsewhere can carry it too). With
``FITEVICT_FAULT_TABLE=PATH`` set, the run writes every marked test's row, with its outcome and seconds, to PATH as
JSON (``bench/fault_table.py`` makes the table in docs/faults.md and docs/reliability.md from it)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

E2E = str(Path(__file__).resolve().parent.parent / "e2e")
if E2E not in sys.path:
    sys.path.insert(0, E2E)

TABLE_ENV = "FITEVICT_FAULT_TABLE"
FIELDS = ("fault", "client", "history", "running", "lost")


class FaultTable:
    """Collects each marked test's row and how it ran (registered as a plugin, so it sees tests in any folder)."""

    def __init__(self, path: Path) -> None:
        self.path, self.rows, self.order = path, {}, []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:  # after deselection (-k, -m): the tests that will run
            mark = item.get_closest_marker("fault")
            if mark is not None:
                self.rows[item.nodeid] = {"test": item.nodeid, **{k: mark.kwargs.get(k, "") for k in FIELDS},
                                          "outcome": "not run", "seconds": 0.0, "setup_seconds": 0.0}
                self.order.append(item.nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        row = self.rows.get(report.nodeid)
        if row is None:
            return
        if report.when == "setup":
            row["setup_seconds"] = report.duration
        if report.when == "call" or (report.when == "setup" and not report.passed):
            row["seconds"] = report.duration
            xfail = hasattr(report, "wasxfail")
            row["outcome"] = ("xfailed" if report.skipped else "xpassed") if xfail else report.outcome
            if not report.passed and not xfail:
                row["why"] = str(report.longrepr).splitlines()[-1][:300] if report.longrepr else ""
        elif report.when == "teardown" and report.failed:
            row["outcome"], row["why"] = "failed", "teardown: " + str(report.longrepr).splitlines()[-1][:300]

    def pytest_sessionfinish(self) -> None:
        self.path.write_text(json.dumps([self.rows[n] for n in self.order], indent=1))


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get(TABLE_ENV)
    if path and not config.pluginmanager.has_plugin("fault-table"):
        config.pluginmanager.register(FaultTable(Path(path)), "fault-table")
