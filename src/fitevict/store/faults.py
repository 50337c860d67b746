"""What the store refused: which figures (history events, measurements, memory peaks, seat records, ...), how many,
since when and why, from the first refused write until a write succeeds again. The one writer keeps it
(``writer.Writer``) and reads note their failures too; ``/health`` shows it (``store``), and the server log says when a
fault begins and ends.

A refusal is an error the database gave a write or a read (``STORE_FAULTS``): its disk full, its file locked by
another writer past the busy timeout, corrupt, or its server gone. A later write may succeed; nothing here retries.
A SQLite file found corrupt while fitevict runs is moved aside and a new store opened in its place
(``Store.renew``); ``moved_aside`` lists each. A file deleted or replaced under the running store is found before
the next write (``connect.check_same_file``) and the store opened again at its path; ``lost_files`` lists each.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa



class StoreClosedError(RuntimeError):
    """A write was submitted after the store was closed (or while a corrupt one could not be renewed)."""


STORE_FAULTS = (sa.exc.DBAPIError, OSError, StoreClosedError)  # the store could not take a write (or a read) now
log = logging.getLogger("fitevict.store")

# what each write of the store holds, by its write function's name (``store.queries``, ``peaks``, ``retention``) or,
# for an upsert (``queries.upsert``), by its table
FIGURES = {"op_record_event": "history events", "op_put_measurement": "measurements",
           "op_put_peaks": "memory peaks (seat_peaks)", "op_seat_remove": "seat records", "op_prune": "history pruning",
           "op_compact": "space given back to the disk (vacuum)",
           "seats": "seat records", "compute_cache": "learned engine overheads and dry-run buffers",
           "gguf_structures": "parsed GGUF structures"}
READS = "reads"


def figure(fn: Callable[..., Any]) -> str:
    """What a write function stores, in words (its own name when it is none of ``FIGURES``)."""
    name = getattr(fn, "table", None) or getattr(fn, "__qualname__", type(fn).__name__).split(".<locals>")[0]
    return FIGURES.get(name, name)


def reason(e: BaseException) -> str:
    """The database's own words for a refusal (its first line), else the error's type."""
    orig = getattr(e, "orig", None) or e
    text = str(orig).splitlines()[0] if str(orig) else ""
    return text or type(e).__name__


class StoreFaults:
    """The current fault (None while the store takes writes) and the last one that ended. Thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self.since: float | None = None  # the first refusal of the current fault
        self.reason = ""  # the last refusal's reason
        self.refused: dict[str, int] = {}  # refusals per figure during the current fault
        self.last: dict[str, Any] | None = None  # the fault before, once a write succeeded again
        self.moved_aside: list[dict[str, Any]] = []  # corrupt files moved aside while running (``Store.renew``)
        self.lost_files: list[dict[str, Any]] = []  # files deleted or replaced under the running store (``renew``)

    def refuse(self, what: str, error: BaseException) -> None:
        """A write of ``what`` (or a read: ``READS``) was refused with ``error``."""
        why = reason(error)
        with self._lock:
            first = self.since is None
            if first:
                self.since = self.clock()
            self.reason = why
            self.refused[what] = self.refused.get(what, 0) + 1
        if first:
            log.warning("the store refuses writes from now on (%s: %s); what it cannot store is counted in /health",
                        what, why)

    def wrote(self) -> None:
        """A write succeeded: a fault in course is over (logged, and kept as ``last``)."""
        if self.since is None:
            return
        with self._lock:
            if self.since is None:
                return
            now = self.clock()
            self.last = {"since": self.since, "until": now, "reason": self.reason, "refused": dict(self.refused)}
            self.since, self.reason, self.refused = None, "", {}
        log.warning("the store takes writes again after %.1f s; refused meanwhile: %s (%s)", now - self.last["since"],
                    ", ".join(f"{n} {k}" for k, n in self.last["refused"].items()), self.last["reason"])

    @property
    def ok(self) -> bool:
        return self.since is None

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return {"ok": self.since is None, "since": self.since, "reason": self.reason or None,
                    "refused": dict(self.refused), "last_fault": self.last, "moved_aside": list(self.moved_aside),
                    "lost_files": list(self.lost_files)}
