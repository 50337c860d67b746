"""Phase marks of a swap, for the bench that splits one (``bench/swap_phases.py``): at DEBUG on the
``fitevict.phase`` logger (``FITEVICT_PHASE_MARKS=1`` turns it on whatever the log level), one line per mark,
``phase <model> <mark> <CLOCK_MONOTONIC seconds>``. The clock is the machine's, so a client on the same machine places
each mark on its own timeline. Off (one level check) otherwise."""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("fitevict.phase")
if os.environ.get("FITEVICT_PHASE_MARKS") == "1":
    log.setLevel(logging.DEBUG)


def mark(model: str, what: str) -> None:
    if log.isEnabledFor(logging.DEBUG):
        log.debug("phase %s %s %.6f", model, what, time.monotonic())
