"""The fault table's rows from a test run: with ``FITEVICT_FAULT_TABLE=PATH`` set, every test that carries a
``fault`` marker (``@pytest.mark.fault(fault=, client=, history=, running=, lost=)``, registered in pyproject.toml)
is written to PATH as JSON with its outcome and seconds, whatever folder it is in (``bench/fault_table.py`` makes the
table in docs/faults.md and docs/reliability.md from it). Loaded by tests/faults/conftest.py, or by ``-p faultrows``
with this folder on the path for a run of tests elsewhere."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

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
