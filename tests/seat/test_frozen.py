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


def _stopped(tmp_path: Path, in_flight: int, stall_s: float) -> SeatState:
    """A seat whose process is stopped by SIGSTOP, with ``in_flight`` requests on it; the seat once the watch killed
    it."""
    seat = fakeparts.seat(tmp_path)
    seat.seat.in_flight = in_flight

    async def scenario() -> None:
        await fakeparts.run(seat, "import signal\nwhile True: signal.pause()")
        assert seat.pid is not None and seat.proc is not None
        os.kill(seat.pid, signal.SIGSTOP)
        async with asyncio.timeout(30):
            await watch_frozen(seat, stall_s, lambda s, why: setattr(s, "killed_for", why))
            await seat.proc.wait()

    asyncio.run(scenario())
    return seat


def test_a_stopped_seat_with_a_request_in_flight_is_killed_at_once(tmp_path: Path) -> None:
    """Its clients wait on a process that cannot answer: they are told at the first look, not after the stall
    period (an hour here: the watch returns only because it acted at once)."""
    seat = _stopped(tmp_path, in_flight=1, stall_s=3600.0)
    assert seat.killed_for is not None, "the watch returned without killing it"
    assert "stopped by a signal (state T) with 1 request(s) in flight on it, which it cannot answer" in seat.killed_for
    assert "stall_seconds" not in seat.killed_for
    assert seat.proc is not None and seat.proc.returncode == -signal.SIGKILL


def test_an_idle_stopped_seat_is_given_the_stall_period(tmp_path: Path) -> None:
    """No one waits on it: a SIGCONT may come, so it is killed only once stopped for ``stall_seconds``."""
    seat = _stopped(tmp_path, in_flight=0, stall_s=STALL_S)
    assert seat.killed_for is not None and "was stopped by a signal (state T) for" in seat.killed_for
    assert f"(engine.stall_seconds={STALL_S:g})" in seat.killed_for and "in flight" not in seat.killed_for
