"""A finished load's record in the history: one ``load`` event (``reject`` when the guard rejected its
measurement), dated when the seat became ready, with its figures (predicted, engine-reported, what its process and
GPUs held), its load report (``report``: the supervisor's ``loadreport.seat_load_report``), what it taught
(``learning.Learning``) and why it loaded as it did (the plan's reason; a retry without repacking; a rejected
measurement).

``LoadRecorder`` works with three parts: the clock, the history and the planning part (GPU figures); and with
``report``, the seat's load report as JSON (against the budget of the last plan and what the running seats hold).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fitevict import planner as pl
from fitevict.pricing.footprint import HOST
from fitevict.schedule.scheduler import Waiter
from fitevict.store.records import Event
from fitevict.seat.accounts import strategy
from fitevict.seat.learning import Learning
from fitevict.seat.measure import mem_json
from fitevict.seat.running import SeatState
from fitevict.seat.parts import EventLog, SeatFigures


class LoadRecorder:
    def __init__(self, clock: Callable[[], float], history: EventLog, planning: SeatFigures, *, learning: Learning,
                 report: Callable[[SeatState, pl.Plan, str | None], dict[str, Any]]) -> None:
        self.clock, self.history, self.planning, self.learning, self.report = clock, history, planning, learning, report

    async def record(self, seat: SeatState, plan: pl.Plan, waiter: Waiter, notes: Any) -> None:
        """Learn from the load (``Learning``), then record a ``load`` (or ``reject``)."""
        learned = await self.learning.learn(seat)
        verdict = learned.verdict
        measured_total = seat.measured.total_bytes if seat.measured else None
        details: dict[str, Any] = {
            "port": seat.port, "pid": seat.pid, "log": str(seat.log_path), "config": seat.config.to_json(),
            "predicted": seat.predicted.to_json(),
            "measured": seat.measured.to_json() if seat.measured else seat.measured_note,
            "host_pss": mem_json(seat.load_mem), "notes": list(notes),
            "load_report": self.report(seat, plan, waiter.request_id),
            **({"origin": dict(waiter.origin)} if waiter.origin else {}), **learned.details,
        }
        reason = plan.reason or None
        if seat.repack_crash is not None:
            reason = "; ".join(r for r in (seat.repack_crash.reason(seat.key), reason) if r)
        if not verdict.accepted:
            reason = (f"loaded, but its measurement was rejected by the {verdict.check} check and not stored: "
                      f"{verdict.reason}")
        await self.history.record(Event(  # dated when the seat became ready, not when this record was written
            time=seat.ready_at or self.clock(), event="load" if verdict.accepted else "reject", model=seat.key,
            engine=seat.engine, seconds=seat.load_seconds, vram_bytes=self.planning.gpu_figure(seat),
            host_bytes=seat.bytes_on(HOST), offloaded_bytes=self.planning.spilled(seat), strategy=strategy(plan),
            request_id=waiter.request_id, reason=reason, predicted_bytes=seat.predicted.whole_bytes,
            buffers_predicted_bytes=seat.predicted.total_bytes, engine_reported_bytes=measured_total,
            details=details))
