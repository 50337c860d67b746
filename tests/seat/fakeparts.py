"""Small stand-ins for the supervisor's parts, for tests that build one collaborator of the live effects alone: a
seat on a real child process, a store's seat records that remember what they were told, an ending that stops the
process group and says what it freed, and a history over a real SQLite store."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

from fitevict.engines.base import LaunchSpec
from fitevict.pricing.footprint import HOST, DeviceFootprint, Footprint, Term
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.schedule.seats import Seat, SeatStatus
from fitevict.seat.release import StopResult
from fitevict.seat.running import SeatState, spawn
from fitevict.units import MiB

PRICE = Footprint((DeviceFootprint(HOST, Term(60 * MiB, "formula"), Term(20 * MiB, "formula")),),
                  host_mapped_bytes=60 * MiB, host_committed_bytes=40 * MiB, host_source="formula")
FREED = 77 * MiB


def entry(key: str = "m") -> SimpleNamespace:
    """The catalog entry fields a seat's collaborators read."""
    return SimpleNamespace(key=key, engine="llama-server", mmproj=None)


def seat(tmp: Path, *, status: SeatStatus = SeatStatus.READY, key: str = "m", port: int = 1,
         config: LoadConfig = LoadConfig(n_ctx=2048, n_parallel=1)) -> SeatState:
    record = Seat(key, config, key, 0.0, status)
    log = tmp / f"{key}-{port}.log"
    log.touch()
    s = SeatState(id=f"id-{port}", seat=record, entry=entry(key), engine="llama-server",  # type: ignore[arg-type]
                  model_path=tmp / "m.gguf", port=port, log_path=log, started_at=0.0, predicted=PRICE,
                  signature="sig", strategy="load")
    record.process = s
    return s


def engine_binary(tmp: Path) -> Path:
    """A llama-server build that answers ``--help`` with its flags (the engine probes them): what is learned of an
    engine is keyed by its build."""
    binary = tmp / "engine" / "llama-server"
    binary.parent.mkdir(exist_ok=True)
    binary.write_text("#!/bin/sh\necho 'usage: llama-server --fit --cache-ram --no-webui --log-verbosity'\n")
    binary.chmod(0o755)
    return binary


async def run(s: SeatState, code: str) -> None:
    """``s``'s process: ``python -c code``, in its own group, its output in its log."""
    await spawn(s, LaunchSpec((sys.executable, "-c", code), dict(os.environ), s.port, "/health"))


def stop_result(key: str, freed: int | None = FREED, exited: int | None = None) -> StopResult:
    """What the ending says: ``exited``, the exit code of a process that had exited before the stop."""
    ended = ("exited", f"it had already exited (exit code {exited}) before the stop") if exited is not None else ()
    return StopResult(key, {HOST: freed}, freed, {HOST: freed or 0}, 0.01, 0.02, freed is not None,
                      "test: what the ending said", exited, *ended)


class Records:
    """The store's seat records, as told: ``(seat id, state)`` kept, seat ids forgotten."""

    def __init__(self, log: list | None = None) -> None:
        self.kept: list[tuple[str, str | None]] = []
        self.forgotten: list[str] = []
        self.log = log if log is not None else []

    def keep(self, seat: SeatState, state: str | None = None) -> None:
        self.kept.append((seat.id, state))

    async def forget(self, seat: SeatState) -> None:
        self.forgotten.append(seat.id)
        self.log.append("forget")


class Ending:
    """Ends a seat as the real one does to its process (its group killed) and says it freed ``FREED`` bytes;
    ``calls`` lists ``(seat id, free_slot)``."""

    def __init__(self, log: list | None = None) -> None:
        self.calls: list[tuple[str, bool]] = []
        self.log = log if log is not None else []

    def read_before(self, s: SeatState):
        """The reading before the stop, begun: said in the log, and done at once."""
        import asyncio

        self.log.append("read before")
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    async def end(self, s: SeatState, *, free_slot: bool = False, forget: bool = True, before=None) -> StopResult:
        s.expected_exit = True
        exited = s.proc.returncode if s.proc is not None else None  # it ended before the stop
        self.calls.append((s.id, free_slot))
        if before is not None:
            await before
        self.log.append("end" if before is None else "end after the reading")
        if s.pgid is not None:
            try:
                os.killpg(s.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if s.proc is not None:
            await s.proc.wait()
        return stop_result(s.key, exited=exited)

    async def forget(self, s: SeatState) -> None:
        self.log.append("forget")
