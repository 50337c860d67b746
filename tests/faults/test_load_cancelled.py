"""A load cancelled before its engine starts: while its seat logs are pruned, or while it is priced (the seat's
prediction, which for a GPU placement runs the engine's dry run first and may take minutes), every client of the load
hangs up, or fitevict shuts down.

The loader (``supervisor.loading.Loader``) runs under the real scheduler, whose effects are wired as the server's
(``effects.LiveEffects``: a stop of a load not ready yet cancels it), with a real history in a real SQLite store; the
step is held until the cancel, and the next load starts a real process. A front door cannot be held there on a
machine without a GPU (a CPU placement runs no dry run in its load), so the loader is driven alone.

For each: the scheduler is told the load stopped (no record of the model is left placing or stopping), history has the
load's ``unload`` naming the step it was cut at, and the next request for the model loads it and is served.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from faultrows import FaultSeen

from fitevict.budget import Budget
from fitevict.schedule.errors import Busy
from fitevict.pricing.footprint import HOST
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.schedule.scheduler import Scheduler, Waiter
from fitevict.schedule.seats import SeatStatus
from fitevict.store import Store
from fitevict.supervisor.history import History
from fitevict.seat.loading import Loader
from fitevict.seat.running import SeatState

TESTS = str(Path(__file__).resolve().parent.parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from seat import fakeparts  # noqa: E402

pytestmark = pytest.mark.timeout(60)
LEFT = "no one waiting: every request for this load left before it finished"
SHUTDOWN = "fitevict is shutting down: load cancelled"


class Step:
    """A step of the load held on its first run (until the load is cancelled), quick on every later one."""

    def __init__(self, held: bool) -> None:
        self.held, self.entered = held, asyncio.Event()

    async def run(self) -> None:
        if self.held:
            self.held = False
            self.entered.set()
            await asyncio.get_running_loop().create_future()  # never done: only a cancel ends it


class Launcher:
    """Starts the seat's engine: a real process, attached to the scheduler's record of the seat (the record is told
    it runs); it answers at once. Its log pruning is the ``prune`` step."""

    def __init__(self, tmp: Path, prune: Step) -> None:
        self.tmp, self.prune, self.scheduler = tmp, prune, None
        self.seats: list[SeatState] = []

    async def prune_logs(self) -> None:
        await self.prune.run()

    async def launch(self, attempt, entry, cfg, path, predicted, plan):
        seat = attempt.seat = fakeparts.seat(self.tmp, status=SeatStatus.STARTING, port=len(self.seats) + 1)
        attempt.spec, attempt.config = SimpleNamespace(argv=(sys.executable,), notes=()), cfg
        record = self.scheduler.table.get(plan.key)
        seat.seat = record
        await fakeparts.run(seat, "import time; time.sleep(600)")
        self.scheduler.table.attach(record, seat)
        self.scheduler.spawned(plan.key, cfg)
        self.seats.append(seat)
        return None


class Effects:
    """The scheduler's effects as the server wires them: a start goes to the loader; a stop of a load not ready yet
    cancels it (else the seat is gone); a waiter gets its seat, or its refusal, through its future."""

    def __init__(self) -> None:
        self.loader: Loader | None = None
        self.scheduler: Scheduler | None = None
        self.futures: dict[Waiter, asyncio.Future] = {}

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def budget(self) -> Budget:
        return Budget.declared({HOST: {"total": 1 << 30}})

    def prices(self, request):
        return lambda key, cfg: fakeparts.PRICE

    def start(self, waiter: Waiter, plan) -> None:
        self.loader.start(waiter, plan)

    def stop(self, key: str, event: str, reason: str, request_id: str | None) -> None:
        if not self.loader.cancel(key, f"{event}: {reason}"):
            self.scheduler.stopped(key)

    def dispatch(self, waiter: Waiter, key: str) -> None:
        self.futures.pop(waiter).set_result(key)

    def reject(self, waiter: Waiter, error) -> None:
        self.futures.pop(waiter).set_exception(error)

    def wake_at(self, when: float) -> None:
        pass

    def prefetch(self, path: str) -> None:
        pass  # no file to read: page cache is none of this test's business


def request(fx: Effects, n: int) -> Waiter:
    from fitevict import planner as pl

    w = Waiter(pl.PlanRequest(key="m", config=LoadConfig(n_ctx=2048, n_parallel=1), alloc_mode="max-gpu",
                              fixed=frozenset()), fx.now(), f"req-{n}")
    fx.futures[w] = asyncio.get_running_loop().create_future()
    fx.scheduler.submit(w)
    return w


def cancelled_load(tmp: Path, held: str, how: str):
    """A load of ``m`` whose ``held`` step ("prune" or "price") is held until ``how`` ("left": its one client hangs
    up, then a second request for ``m``; "shutdown": the scheduler closed, as the server's shutdown does). What the
    scheduler, the history, the ending and the clients saw."""
    store = Store.open(f"sqlite:///{tmp / 'fitevict.db'}")
    prune, price = Step(held == "prune"), Step(held == "price")
    closed = False

    async def predicted(waiter, entry, cfg, path):
        await price.run()
        return fakeparts.PRICE

    async def scenario():
        nonlocal closed
        loop = asyncio.get_running_loop()
        fx, ending, launcher = Effects(), fakeparts.Ending(), Launcher(tmp, prune)
        fx.scheduler = launcher.scheduler = Scheduler(fx)
        fx.loader = Loader(
            loop.time, History(store),
            SimpleNamespace(done_with_log=lambda path: None, engine_name=lambda key: "llama-server"),  # type: ignore
            fx.scheduler, prices=SimpleNamespace(asked=lambda w: (fakeparts.entry(), tmp / "m.gguf"),
                                                 predicted=predicted),  # type: ignore[arg-type]
            launcher=launcher, ending=ending,  # type: ignore[arg-type]
            readiness=SimpleNamespace(ready=lambda seat, crash: asyncio.sleep(0)),  # type: ignore[arg-type]
            meter=SimpleNamespace(read=lambda seat: None),  # type: ignore[arg-type]
            recorder=SimpleNamespace(record=lambda *a: asyncio.sleep(0)),  # type: ignore[arg-type]
            watch=SimpleNamespace(watch=lambda seat: None),  # type: ignore[arg-type]
            spawn=lambda coro, name: asyncio.create_task(coro, name=name), closed=lambda: closed,
            handed=lambda: 0, recording=set())
        first = request(fx, 1)
        task = fx.loader.loads["m"]
        await asyncio.wait_for((prune if held == "prune" else price).entered.wait(), 10)
        status = fx.scheduler.seats["m"].status
        told = fx.futures[first]
        if how == "left":
            fx.futures.pop(first).cancel()
            assert fx.scheduler.cancel(first)
        else:  # as the server's shutdown: its queue answered busy, its loads cancelled
            closed = True
            fx.scheduler.close("shutting down")
        await asyncio.wait_for(task, 10)
        got = SimpleNamespace(status=status, after=fx.scheduler.seats.get("m"), told=told, calls=list(ending.calls),
                              unloads=store.events(event="unload"), served=None, ready=None)
        if how == "left":
            second = request(fx, 2)
            got.served = await asyncio.wait_for(fx.futures[second], 10)
            got.ready = fx.scheduler.seats["m"].status
        for seat in launcher.seats:
            await fakeparts.Ending().end(seat)
        got.seats = list(launcher.seats)
        return got

    try:
        return asyncio.run(scenario())
    finally:
        store.close()


@pytest.mark.fault(
    fault="a load's one client hangs up while its seat logs are pruned, before its engine starts (the pruning held)",
    kind="collaborator with stand-ins")
def test_a_load_cancelled_while_its_logs_are_pruned(tmp_path: Path, fault_seen: FaultSeen) -> None:
    got = cancelled_load(tmp_path, "prune", "left")
    # told: nothing placing or stopping is left
    assert got.status is SeatStatus.STARTING and fault_seen.running(got.after, "the scheduler's record of m") is None
    (ev,) = got.unloads
    assert fault_seen.history(ev.reason, "`unload`") == LEFT and ev.request_id == "req-1" and ev.model == "m"
    assert fault_seen.history(ev.details["cancelled_at"], "cancelled_at") == "pruning the seat logs"
    assert fault_seen.history(ev.details["engine_started"], "engine_started") is False
    assert ev.details["note"] == f"unload: {LEFT}" and ev.freed_bytes is None
    # no engine for the cancelled load; one for the next
    assert got.calls == [] and fault_seen.running(len(got.seats), "engines started (the next load's)") == 1
    assert fault_seen.client(got.served, "the next request's seat (in the process)") == "m"
    assert fault_seen.running(got.ready, "its status") is SeatStatus.READY


@pytest.mark.fault(
    fault="a load's one client hangs up while the seat is priced (its prediction held, as a GPU placement's dry run "
          "holds it), before its engine starts",
    kind="collaborator with stand-ins")
def test_a_load_cancelled_while_it_is_priced(tmp_path: Path, fault_seen: FaultSeen) -> None:
    got = cancelled_load(tmp_path, "price", "left")
    assert got.status is SeatStatus.STARTING and fault_seen.running(got.after, "the scheduler's record of m") is None
    (ev,) = got.unloads
    assert fault_seen.history(ev.reason, "`unload`") == LEFT
    assert fault_seen.history(ev.details["cancelled_at"], "cancelled_at").startswith("pricing the seat")
    assert fault_seen.history(ev.details["engine_started"], "engine_started") is False and got.calls == []
    assert fault_seen.running(len(got.seats), "engines started (the next load's)") == 1
    assert fault_seen.client(got.served, "the next request's seat (in the process)") == "m"
    assert fault_seen.running(got.ready, "its status") is SeatStatus.READY


@pytest.mark.fault(
    fault="fitevict shuts down while a load is priced (its prediction held), before its engine starts",
    kind="collaborator with stand-ins")
def test_a_load_cut_by_shutdown_while_it_is_priced(tmp_path: Path, fault_seen: FaultSeen) -> None:
    got = cancelled_load(tmp_path, "price", "shutdown")
    assert got.status is SeatStatus.STARTING and fault_seen.running(got.after, "the scheduler's record of m") is None
    told = fault_seen.client(got.told.exception(), "its waiting request's future, in the process (no HTTP)")
    assert isinstance(told, Busy) and "shutting down" in str(told)
    (ev,) = got.unloads
    assert fault_seen.history(ev.reason, "`unload`") == SHUTDOWN
    assert fault_seen.history(ev.details["cancelled_at"], "cancelled_at").startswith("pricing the seat")
    assert ev.details["note"] == f"unload: {SHUTDOWN}" and ev.details["engine_started"] is False
    assert got.calls == [] and fault_seen.running(got.seats, "engines started") == []
