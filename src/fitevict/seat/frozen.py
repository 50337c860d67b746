"""A seat frozen while it runs answers nothing, and every request sent to it would wait for ever. Two kinds are told
apart and killed; the seat's end then gives the reason given here (its crash, or the stop a draining seat drained
for), and the next request loads the model again (a client whose stream was cut is told by the relay, with the
reason given here):

- **stopped**: its process stopped by a signal (``SIGSTOP``, ``SIGTSTP``, ``SIGTTIN``, ``SIGTTOU``: state ``T``), or
  frozen by a cgroup v1 freezer (state ``D``, its ``freezer.state`` ``FROZEN``: it wakes for no signal, so it is
  moved out of that cgroup, which thaws it alone, for the kill to land). The kernel says so the moment it happens,
  so a stopped seat with a request in flight is killed at the first look that sees it: its clients are told at once
  rather than after a stall period. An idle one is given ``engine.stall_seconds`` (a ``SIGCONT`` may come: no one
  waits on it meanwhile). A traced process (state ``t``: a debugger) is left alone.
- **stuck**: alive and asleep (a deadlock, a frozen cgroup) while the front door waits on it, killed after
  ``engine.stall_seconds``. All three must hold for the whole stall period, so that a slow machine is never taken for a stuck seat: a request is in flight on it
  and the front door has waited that long for its next byte (``silent_for``: a slow client that stopped reading is
  not the engine's fault, so a relay blocked on its client does not count); none of its threads ran or waited on
  the disk (no thread in state ``R`` or ``D`` at any look: a starved or paging engine is slow, not stuck); and its
  CPU time did not move by one clock tick. An engine that spins while deadlocked uses CPU time and is not caught.

A stuck seat may be one told to stop by another program whose signal handler never returned: llama-server's
SIGTERM/SIGINT handler takes its task queue's lock, which the thread it interrupted may hold, and then waits for it
for ever, before it logs a word. The kernel blocks a signal on the thread that runs its handler for as long as the
handler runs, so the watch keeps, for each thread, which of SIGTERM and SIGINT it has been seen not blocking while a
request was in flight; a thread that blocks one of them now, in a process that catches it, is inside that handler,
and the seat's end says it was told to stop (a thread that blocks them for good, as a program that waits for
signals on one thread does, is never taken for one).

The same look keeps what the kernel says of the process (its start and memory cgroup: ``host.oomkill``), so that a
SIGKILL can later be told to be the OOM killer's. There is no event for a state change, so /proc is read a few
times per stall period.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from fitevict.host import oomkill
from fitevict.host.procmem import cpu_ticks, proc_tasks, proc_text, process_state, signal_mask
from fitevict.seat.running import SeatState

log = logging.getLogger("fitevict.seat")
FREEZER_ROOT = Path("/sys/fs/cgroup/freezer")  # cgroup v1's freezer hierarchy
BUSY_STATES = frozenset("RD")  # a thread running (or runnable) or waiting on I/O: the engine is not stuck
SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # another program's "stop": a handler that may never return
_SHUTDOWN_BITS = sum(1 << (s - 1) for s in SHUTDOWN_SIGNALS)


def frozen_by_cgroup(pid: int) -> Path | None:
    """The cgroup v1 freezer that holds ``pid`` frozen (its ``freezer.state`` FROZEN or FREEZING), else None."""
    try:
        lines = proc_text(pid, "cgroup").splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if "freezer" in controllers.split(","):
            path = FREEZER_ROOT / rel.lstrip("/")
            try:
                state = (path / "freezer.state").read_text().strip()
            except OSError:
                return None
            return path if state in ("FROZEN", "FREEZING") else None
    return None


def thaw_out(pid: int, icebox: Path) -> None:
    """Move ``pid`` out of the frozen cgroup ``icebox`` into the freezer's root, which thaws it alone (a signal
    reaches it then); a refusal is said in the log, since the kill lands only once it is thawed."""
    try:
        (FREEZER_ROOT / "cgroup.procs").write_text(str(pid))
    except OSError as e:
        log.error("pid %d is frozen by %s and cannot be moved out of it (%s): it dies of the SIGKILL sent to it "
                  "once that cgroup is thawed", pid, icebox, e)


def progress(pid: int) -> tuple[int, bool] | None:
    """``pid``'s CPU time so far (user + system, clock ticks) and whether any of its threads is running or waiting
    on I/O; None when it is gone."""
    ticks = cpu_ticks(pid)
    try:
        tasks = proc_tasks(pid)
    except OSError:
        return None
    if ticks is None:
        return None
    busy = False
    for task in tasks:
        try:
            busy = busy or proc_text(pid, f"task/{task}/stat").rsplit(")", 1)[1].split()[0] in BUSY_STATES
        except (OSError, IndexError):
            continue  # a thread that ended meanwhile
    return ticks, busy


class ShutdownWatch:
    """Which of a process's threads have been seen not blocking SIGTERM or SIGINT (see the module's doc)."""

    def __init__(self) -> None:
        self.opened: dict[str, int] = {}  # thread id -> the shutdown signals' bits it was seen not blocking

    def look(self, pid: int) -> None:
        try:
            tasks = proc_tasks(pid)
        except OSError:
            return
        opened = {}
        for tid in tasks:  # threads that ended are forgotten
            blocked = signal_mask(pid, "SigBlk", tid)
            opened[tid] = self.opened.get(tid, 0) | (~blocked & _SHUTDOWN_BITS if blocked is not None else 0)
        self.opened = opened

    def in_handler(self, pid: int) -> str | None:
        """Words for a thread of ``pid`` inside its own SIGTERM or SIGINT handler now, or None."""
        caught = signal_mask(pid, "SigCgt")
        for tid, opened in self.opened.items():
            blocked = signal_mask(pid, "SigBlk", tid)
            if caught is None or blocked is None or not (hit := opened & blocked & caught):
                continue
            name = signal.Signals(hit.bit_length()).name
            which = "its main thread" if tid == str(pid) else f"its thread {tid}"
            return (f"{which} was inside its own {name} handler ({name} blocked there now, as the kernel blocks a "
                    "signal while its handler runs; open at the watch's earlier looks)")
        return None


class StuckWatch:
    """Since when a seat has made no progress while a request waits on it (see the module's doc)."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.ticks: int | None = None
        self.shutdown = ShutdownWatch()

    def look(self, seat: SeatState, now: float, silent_for: Callable[[int], float | None]) -> float:
        """Seconds the seat has been stuck, as of this look (0 when it is not)."""
        waited = silent_for(seat.port) if seat.seat.in_flight else None
        seen = progress(seat.pid) if seat.pid is not None and waited is not None else None  # idle: nothing read
        if seen is not None and self.since is None:
            self.shutdown.look(seat.pid)  # type: ignore[arg-type]
        if seen is None or seen[1] or seen[0] != self.ticks or waited is None:
            self.since, self.ticks = None, (seen[0] if seen is not None else None)
            return 0.0
        if self.since is None:
            self.since = now
        return min(now - self.since, waited)


async def watch_frozen(seat: SeatState, stall_seconds: float, frozen: Callable[[SeatState, str], None],
                       silent_for: Callable[[int], float | None] = lambda port: None,
                       clock: Callable[[], float] = time.monotonic) -> None:
    """Until ``seat``'s process is gone: when it has been stopped by a signal, or stuck while the front door waits
    on it (``silent_for(port)``: seconds the door has waited for its next byte, None when it waits for none), for
    ``stall_seconds``, say why (``frozen(seat, why)``) and kill its process group. Each look also keeps what the
    kernel says of it (``seat.kernel_seen``)."""
    assert seat.pid is not None
    since: float | None = None
    stuck = StuckWatch()
    stuck.shutdown.look(seat.pid)  # which threads are open to a SIGTERM while it serves
    while (state := process_state(seat.pid)) not in (None, "Z", "X") and not seat.expected_exit:
        now = clock()
        seat.kernel_seen = oomkill.follow(seat.pid, seat.kernel_seen)
        icebox = frozen_by_cgroup(seat.pid) if state == "D" else None
        since = (since if since is not None else now) if state == "T" or icebox is not None else None
        why = None
        if since is not None and seat.seat.in_flight:
            why = (f"was stopped by a signal (state T) with {seat.seat.in_flight} request(s) in flight on it, which it "
                   "cannot answer" if icebox is None else
                   f"was frozen by its cgroup's freezer ({icebox}: FROZEN, state D) with {seat.seat.in_flight} "
                   "request(s) in flight on it, which it cannot answer")
        elif since is not None and now - since >= stall_seconds:
            why = (f"was stopped by a signal (state T) for {now - since:.1f} s" if icebox is None else
                   f"was frozen by its cgroup's freezer ({icebox}: FROZEN, state D) for {now - since:.1f} s")
            why += f" (engine.stall_seconds={stall_seconds:g})"
        elif (quiet := stuck.look(seat, now, silent_for)) >= stall_seconds:
            why = (f"made no progress for {quiet:.1f} s while a request waited on it (state {state}: no CPU time "
                   f"used, no thread running or on I/O, no byte sent) (engine.stall_seconds={stall_seconds:g})")
        if why is not None:
            seat.told_by = stuck.shutdown.in_handler(seat.pid)
            frozen(seat, f"{seat.engine} pid {seat.pid} {why}: killed")
            try:
                os.killpg(seat.pgid or seat.pid, signal.SIGKILL)  # a stopped or frozen process dies of it at once
            except ProcessLookupError:
                pass  # it exited meanwhile: its watcher records that
            if icebox is not None:
                thaw_out(seat.pid, icebox)
            return
        await asyncio.sleep(min(1.0, stall_seconds / 4))
