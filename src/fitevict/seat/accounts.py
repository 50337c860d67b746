"""What a seat's events say about it, beyond its figures: the strategy it loaded with, the engine's own timings, the
leak check on its way out, the engine's own account of a failed load, and its file's bytes for the guard."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fitevict import planner as pl
from fitevict.engines import Engine
from fitevict.store.records import Event
from fitevict.seat.release import StopResult
from fitevict.seat.running import SeatState


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
