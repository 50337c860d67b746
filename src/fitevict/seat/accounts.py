"""What a seat's events say about it, beyond its figures: the strategy it loaded with, the engine's own timings, how
its process ended on its own (a crash, or a death while it drained), the leak check on its way out, the engine's own
account of a failed load, and its file's bytes for the guard."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fitevict import planner as pl
from fitevict.engines import Engine
from fitevict.host.oomkill import oom_evidence
from fitevict.store.records import Event
from fitevict.seat.crash import exit_cause, exit_words
from fitevict.seat.release import StopResult
from fitevict.seat.running import SeatState, file_changed, log_tail


def leak_check(report: dict | None, res: StopResult) -> str:
    """What a transformers seat's leak breaker said on its way out: "clean", how many tensors it found alive, or
    that it did not run and why (a missing report is never "no leak")."""
    if report is None:
        return (f"did not run: the seat wrote no teardown report before it exited ({res.note}; exit after "
                f"{res.exit_seconds:.2f} s: killed after the grace period, or its teardown failed; see its log)")
    leaks = report.get("leaks") or []
    return f"{len(leaks)} tensor(s) still alive after the model was deleted" if leaks else "clean"


def timings(seat: SeatState) -> dict:
    """The engine's own timings over the seat's answers, for the event that ends it (nothing if none had any)."""
    t = seat.timings.to_json()
    return {"engine_timings": t} if t is not None else {}


async def died(seat: SeatState, code: int | None, engine: Engine) -> tuple[str, dict[str, Any]]:
    """How ``seat``'s process ended on its own (``code``: its exit code), in words and as an event's details: killed
    by fitevict's stuck-seat watch (``seat.killed_for``), or its exit code read as a cause (the kernel asked whether a
    SIGKILL was its OOM killer's), after the engine said it was shutting down or was caught in its handler for a
    SIGTERM or SIGINT that was not fitevict's (``told_to_stop``), with a model file changed under it and its log's
    tail."""
    frozen = seat.killed_for
    oom = await asyncio.to_thread(oom_evidence, seat.pid, seat.kernel_seen) if code == -9 and not frozen else None
    changed = file_changed(seat)  # a seat whose mapped file was cut short dies of SIGBUS: say so
    tail = log_tail(seat.log_path, 40)  # the engine's last words (its shutdown line, with what it printed after)
    line = engine.shutting_down(tail)
    told = told_to_stop(seat.engine, f"its log: {line!r}" if line is not None else seat.told_by)
    words = (told or "") + (frozen or exit_words(seat.engine, code, oom)) + (f"; {changed}" if changed else "")
    cause = "told-to-stop" if told else "frozen" if frozen else exit_cause(code, oom)
    return words, {"exit_code": code, "cause": cause, "oom": oom, "file_changed": changed,
                   "log_tail": "\n".join(tail.splitlines()[-10:])}


def told_to_stop(engine: str, evidence: str | None) -> str | None:
    """The first words of an end that began with the engine shutting down on its own, or None. ``evidence``: its
    log's line saying so, or what the stuck-seat watch saw (a thread inside its SIGTERM or SIGINT handler).
    fitevict's own stops never reach here: another program sent it a SIGTERM or SIGINT (or asked a torch seat's
    /unload)."""
    if evidence is None:
        return None
    return f"{engine} was told to stop by another program, not by fitevict ({evidence}), then: "


def engine_failure(engine: Engine, log_path: Path) -> str | None:
    """A failed load's reason as the engine logged it (None: it logged none, or its log cannot be read)."""
    try:
        return engine.failure(log_path.read_text(errors="replace"))
    except OSError:
        return None


def file_bytes(path: Path) -> int | None:
    """The model's bytes on disk, or None when they cannot be read (the guard then says its file check could not
    run; never a 0 that turns the check off)."""
    try:
        return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    except OSError:
        return None


def strategy(plan: pl.Plan) -> str:
    c = plan.config
    base = {"load": "full", "partial": "partial", "ram": "ram-only"}.get(plan.action, plan.action)
    if c is None:
        return base
    return f"{base} (ngl={c.n_gpu_layers}, n_cpu_moe={c.n_cpu_moe}, ctx={c.n_ctx})"


def leak_event(seat: SeatState, report: dict | None, request_id: str | None, now: float) -> Event | None:
    """A seat's leak breaker reports on its way out: every tensor still alive after its model was deleted is named
    as this model's leak (memory glibc kept, with every tensor gone, is retention, not a leak). None: no leak."""
    if not report or not report.get("leaks"):
        return None
    leaks = report["leaks"]
    held = sum(int(x.get("bytes") or 0) for x in leaks)
    names = ", ".join(f"{x.get('path')} ({x.get('bytes')} B)" for x in leaks[:8])
    return Event(time=now, event="leak", model=seat.key, engine=seat.engine, host_bytes=held,
                 reason=f"{len(leaks)} tensor(s) still alive after the model was deleted: {names}",
                 request_id=request_id,
                 details={"teardown": report, "host_source": "measured: the leak breaker's weakrefs"})
