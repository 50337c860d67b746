"""The stuck-seat watch (``seat.frozen.watch_frozen``) on real child processes: a seat stuck while a request waits
on it is killed after the stall period, and one stuck inside its own SIGTERM handler (llama-server's can hang on
its task queue's lock) is told apart by the signal mask the kernel shows for the thread running the handler."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from fitevict.host.procmem import signal_mask
from fitevict.seat.frozen import watch_frozen
from fitevict.seat.running import SeatState

from . import fakeparts

STALL_S = 0.6
CATCH_TERM = "signal.signal(signal.SIGTERM, lambda *a: None)"  # a handler installed: SigCgt shows it
BLOCK_TERM = "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})"  # as the kernel does while it runs
ON_USR1 = f"signal.signal(signal.SIGUSR1, lambda *a: {BLOCK_TERM})"


async def _ready(pid: int) -> None:
    """Until the child has installed its SIGUSR1 handler (the last thing it does before it waits)."""
    async with asyncio.timeout(30):
        while not (signal_mask(pid, "SigCgt") or 0) & (1 << (signal.SIGUSR1 - 1)):
            await asyncio.sleep(0.02)


def _stuck(tmp_path: Path, setup: str) -> SeatState:
    """A seat whose process runs ``setup``, then waits for signals using no CPU while a request waits on it; once
    the watch has looked at it, it is sent SIGUSR1. The seat, once the watch killed it."""
    seat = fakeparts.seat(tmp_path)
    seat.seat.in_flight = 1  # a request waits on it, and has had no byte for long (silent_for below)

    async def scenario() -> None:
        await fakeparts.run(seat, f"import signal\n{setup}\n{ON_USR1}\nwhile True: signal.pause()")
        assert seat.pid is not None and seat.proc is not None
        await _ready(seat.pid)
        watch = asyncio.create_task(watch_frozen(seat, STALL_S, lambda s, why: setattr(s, "killed_for", why),
                                                 silent_for=lambda port: 60.0))
        await asyncio.sleep(0)  # the watch's first look, before it waits
        os.kill(seat.pid, signal.SIGUSR1)
        async with asyncio.timeout(30):
            await watch
            await seat.proc.wait()

    asyncio.run(scenario())
    return seat


def test_a_seat_stuck_inside_its_own_sigterm_handler_was_told_to_stop(tmp_path: Path) -> None:
    seat = _stuck(tmp_path, CATCH_TERM)
    assert seat.killed_for is not None and "made no progress" in seat.killed_for
    assert seat.told_by is not None and "its main thread was inside its own SIGTERM handler" in seat.told_by
    assert seat.proc is not None and seat.proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("setup", [f"{CATCH_TERM}\n{BLOCK_TERM}", "pass"],
                         ids=["blocked-from-the-start", "no-handler"])
def test_a_stuck_seat_not_in_a_handler_is_only_stuck(tmp_path: Path, setup: str) -> None:
    """A thread that blocked SIGTERM before the watch ever saw it open (a program that waits for signals on one
    thread), or a process that has no handler for it, is not taken for one told to stop."""
    seat = _stuck(tmp_path, setup)
    assert seat.killed_for is not None and "made no progress" in seat.killed_for
    assert seat.told_by is None
