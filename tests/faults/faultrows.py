"""The fault table's rows from a test run. A fault test carries ``@pytest.mark.fault(fault=, kind=)`` (registered in
pyproject.toml): the fault it injects, and what it drives (``KINDS``). What its row says the client saw, what history
says, what was left running and what was lost is what the test *asserted*, recorded at the assertion through the
``fault_seen`` fixture: ``assert fault_seen.client(r.status_code, "status") == 503`` records the status it read and
hands it back to the assertion, so a row's cell is the observed value of an assertion that ran (the row's result says
whether it held). A column a test records nothing in says "not asserted".

With ``FITEVICT_FAULT_TABLE=PATH`` set, every marked test's row (its marker, its records, its outcome and seconds) is
written to PATH as JSON, whatever folder the test is in (``bench/fault_table.py`` makes the table in docs/faults.md
and docs/reliability.md from it). tests/conftest.py loads this module, so the fixture and the plugin serve every
folder."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest

TABLE_ENV = "FITEVICT_FAULT_TABLE"
COLUMNS = ("client", "history", "running", "lost")
KINDS = ("real door", "collaborator with stand-ins", "rule alone")
NOT_ASSERTED = "not asserted"
ENTRY_CHARS = 240  # one record's text in a cell, at most (a longer one is cut with "...")
T = TypeVar("T")


def shown(value: Any) -> str:
    """A recorded value as a cell shows it: an exception (or its type) by its type's name and message, a collection
    item by item, anything else as ``str``."""
    if isinstance(value, BaseException):
        text = f"{type(value).__name__}: {value}" if str(value) else type(value).__name__
    elif isinstance(value, type):
        text = value.__name__
    elif isinstance(value, Mapping):
        text = "{" + ", ".join(f"{k}: {shown(v)}" for k, v in value.items()) + "}"
    elif isinstance(value, (set, frozenset)):
        text = "{" + ", ".join(sorted(shown(v) for v in value)) + "}"
    elif isinstance(value, (list, tuple)):
        text = "[" + ", ".join(shown(v) for v in value) + "]"
    else:
        text = str(value)
    text = " ".join(text.split())
    return text if len(text) <= ENTRY_CHARS else text[:ENTRY_CHARS - 3] + "..."


class FaultSeen:
    """What one fault test asserted, column by column. Each method records ``value`` (with ``what``: which reading
    it is) and returns it unchanged, so the record is the value the assertion tests."""

    def __init__(self) -> None:
        self.records: dict[str, list[str]] = {c: [] for c in COLUMNS}

    def _record(self, column: str, value: T, what: str) -> T:
        entry = f"{what}: {shown(value)}" if what else shown(value)
        if entry not in self.records[column]:
            self.records[column].append(entry)
        return value

    def client(self, value: T, what: str = "") -> T:
        """What the client got: a status code, an error's type or body, an event, an answer."""
        return self._record("client", value, what)

    def history(self, value: T, what: str = "") -> T:
        """What history (or the log, or /health) says: the event kinds and the details asserted."""
        return self._record("history", value, what)

    def running(self, value: T, what: str = "") -> T:
        """What was left running: seat pids, processes, or that none is."""
        return self._record("running", value, what)

    def lost(self, value: T, what: str = "") -> T:
        """What was lost, as counted: requests, events, records."""
        return self._record("lost", value, what)

    def cells(self) -> dict[str, str]:
        return {c: "; ".join(self.records[c]) or NOT_ASSERTED for c in COLUMNS}


SEEN = pytest.StashKey[FaultSeen]()


@pytest.fixture
def fault_seen(request: pytest.FixtureRequest) -> FaultSeen:
    """The recorder of what this fault test asserts (its row of the fault table)."""
    seen = request.node.stash.setdefault(SEEN, FaultSeen())
    return seen


class FaultTable:
    """Collects each marked test's row and how it ran (registered as a plugin, so it sees tests in any folder)."""

    def __init__(self, path: Path) -> None:
        self.path, self.rows, self.order = path, {}, []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:  # after deselection (-k, -m): the tests that will run
            mark = item.get_closest_marker("fault")
            if mark is not None:
                self.rows[item.nodeid] = {"test": item.nodeid, "fault": mark.kwargs.get("fault", ""),
                                          "kind": mark.kwargs.get("kind", ""), **FaultSeen().cells(),
                                          "outcome": "not run", "seconds": 0.0, "setup_seconds": 0.0}
                self.order.append(item.nodeid)

    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> None:
        row, seen = self.rows.get(item.nodeid), item.stash.get(SEEN, None)
        if row is not None and seen is not None:
            row.update(seen.cells())

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
