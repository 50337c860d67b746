"""A seat frozen while it runs: its process stopped by a signal (``SIGSTOP``, ``SIGTSTP``, ``SIGTTIN``, ``SIGTTOU``:
state ``T`` in /proc) answers nothing, and every request sent to it waits for ever. A seat stopped for
``engine.stall_seconds`` is killed; its watcher then records the crash with this reason and the next request loads
the model again (a client whose stream was cut is told by the relay). A traced process (state ``t``: a debugger) is
left alone. There is no event for a state change, so /proc is read a few times per stall period."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable

from fitevict.supervisor.seat import SeatState


def process_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (``R``, ``S``, ``T``, ``Z``, ...), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


async def watch_frozen(seat: SeatState, stall_seconds: float, frozen: Callable[[SeatState, str], None],
                       clock: Callable[[], float] = time.monotonic) -> None:
    """Until ``seat``'s process is gone: when it has been stopped by a signal for ``stall_seconds``, say why
    (``frozen(seat, why)``) and kill its process group."""
    assert seat.pid is not None
    since: float | None = None
    while (state := process_state(seat.pid)) not in (None, "Z", "X") and not seat.expected_exit:
        now = clock()
        since = (since if since is not None else now) if state == "T" else None
        if since is not None and now - since >= stall_seconds:
            frozen(seat, f"{seat.engine} pid {seat.pid} was stopped by a signal (state T) for {now - since:.1f} s "
                         f"(engine.stall_seconds={stall_seconds:g}): killed; the next request loads it again")
            try:
                os.killpg(seat.pgid or seat.pid, signal.SIGKILL)  # a stopped process dies of SIGKILL at once
            except ProcessLookupError:
                pass  # it exited meanwhile: its watcher records that
            return
        await asyncio.sleep(min(1.0, stall_seconds / 4))
