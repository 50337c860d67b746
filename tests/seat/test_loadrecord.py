"""A finished load's record (``seat.loadrecord.LoadRecorder``), over a real history in a real SQLite store: what the
load taught is learned first, then one ``load`` event, dated when the seat became ready (not when it was written),
with its figures (predicted, engine-reported, what the history counts on GPUs and spilled to RAM), its load report
and where the request came from; a measurement the guard rejected makes it a ``reject`` whose reason names the
check; a retry without repacking says so beside the plan's reason."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from fitevict import planner as pl
from fitevict.guard import Verdict
from fitevict.pricing.footprint import HOST, DeviceFootprint, Footprint, Term
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.schedule.scheduler import Waiter
from fitevict.seat.crash import RepackCrash
from fitevict.seat.learning import Learned
from fitevict.seat.loadrecord import LoadRecorder
from fitevict.store import Store
from fitevict.supervisor.history import History
from fitevict.units import MiB

from . import fakeparts

CFG = LoadConfig(n_ctx=2048, n_parallel=1)
PLAN = pl.Plan(action="load", key="m", alloc_mode="max-ram", config=CFG, reason="fits beside b")
ACCEPTED = Verdict(True, None, "plausible")
REJECTED = Verdict(False, "collapse", "collapse: 40 MiB is under half the last 100 MiB")
REPORT = {"model": "m", "base_hit": False, "notes": ["the base was not resident: loaded m in 2.000 s"]}


class Learning:
    """What the load taught: ``verdict`` and a detail of its own; ``order`` says when it was asked."""

    def __init__(self, verdict: Verdict, order: list[str]) -> None:
        self.verdict, self.order = verdict, order

    async def learn(self, seat) -> Learned:
        self.order.append("learn")
        return Learned(self.verdict, {"guard": {"accepted": self.verdict.accepted}, "machine": "build@cpu"})


def _record(tmp_path: Path, verdict: Verdict = ACCEPTED, *, crash: RepackCrash | None = None):
    store = Store.open(f"sqlite:///{tmp_path / 'fitevict.db'}")
    order: list[str] = []
    seat = fakeparts.seat(tmp_path)
    seat.seat.ready_at, seat.seat.reload_seconds, seat.pid = 42.0, 2.0, 4242
    seat.measured = Footprint((DeviceFootprint(HOST, Term(30 * MiB, "measured"), Term(10 * MiB, "measured")),),
                              host_mapped_bytes=30 * MiB, host_committed_bytes=10 * MiB, host_source="measured")
    seat.repack_crash = crash
    figures = SimpleNamespace(gpu_figure=lambda s: 7 * MiB, spilled=lambda s: 3 * MiB)
    waiter = Waiter(request=SimpleNamespace(key="m"), arrived=0.0, request_id="req-1",  # type: ignore[arg-type]
                    origin={"route": "/v1/chat/completions"})
    reported: list = []

    def report(s, plan, request_id) -> dict:
        reported.append((s, plan))
        return REPORT

    async def scenario() -> None:
        history = History(store)
        history.on_event.append(lambda ev: order.append(f"event:{ev.event}"))
        recorder = LoadRecorder(lambda: 99.0, history, figures, learning=Learning(verdict, order), report=report)
        await recorder.record(seat, PLAN, waiter, ["spawned on port 1"])

    try:
        asyncio.run(scenario())
        return SimpleNamespace(events=store.events(), order=order, seat=seat, reported=reported)
    finally:
        store.close()


def test_a_load_is_recorded_with_its_figures_report_and_origin_once_learned(tmp_path: Path) -> None:
    got = _record(tmp_path)
    assert got.order == ["learn", "event:load"]  # learned before the record, which carries what it learned
    [ev] = got.events
    assert ev.event == "load" and ev.model == "m" and ev.request_id == "req-1"
    assert ev.time == 42.0 and ev.seconds == 2.0  # dated when the seat became ready, not when written (99.0)
    assert ev.predicted_bytes == fakeparts.PRICE.whole_bytes and ev.buffers_predicted_bytes == 80 * MiB
    assert ev.engine_reported_bytes == 40 * MiB
    assert (ev.vram_bytes, ev.offloaded_bytes, ev.host_bytes) == (7 * MiB, 3 * MiB, got.seat.bytes_on(HOST))
    assert ev.strategy == "full (ngl=0, n_cpu_moe=0, ctx=2048)" and ev.reason == "fits beside b"
    assert ev.details["load_report"] == REPORT and got.reported == [(got.seat, PLAN)]
    assert ev.details["origin"] == {"route": "/v1/chat/completions"} and ev.details["machine"] == "build@cpu"
    assert ev.details["measured"]["total_bytes"] == 40 * MiB and ev.details["pid"] == 4242
    assert ev.details["notes"] == ["spawned on port 1"]


def test_a_rejected_measurement_is_recorded_as_a_reject_naming_the_check(tmp_path: Path) -> None:
    [ev] = _record(tmp_path, REJECTED).events
    assert ev.event == "reject"
    assert ev.reason.startswith("loaded, but its measurement was rejected by the collapse check and not stored")
    assert REJECTED.reason in ev.reason


def test_a_retry_without_repacking_says_so_beside_the_plans_reason(tmp_path: Path) -> None:
    crash = RepackCrash("SIGSEGV", 1.5, "/tmp/first.log", 80 * MiB, 60 * MiB, "CPU_REPACK")
    [ev] = _record(tmp_path, crash=crash).events
    assert ev.reason == f"{crash.reason('m')}; fits beside b"
