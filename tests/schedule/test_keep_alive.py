"""The scheduler honours a request's keep_alive per seat (pure: a recording fake at the Effects seam, a fake clock)."""

from __future__ import annotations

import math

from fitevict import planner as pl
from fitevict.budget import Budget
from fitevict.pricing.footprint import HOST
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.schedule.scheduler import Scheduler, Waiter
from fitevict.units import GiB

from .schedsim import footprint


class Recorder:
    """The Effects seam: records stops and hand-overs; time is whatever the test says."""

    def __init__(self) -> None:
        self.t = 0.0
        self.stops: list[tuple[str, str, str]] = []
        self.handed: list[str] = []

    def now(self) -> float:
        return self.t

    def budget(self) -> Budget:
        return Budget.declared({HOST: {"total": 64 * GiB}})  # room for every seat: each request loads at once

    def prices(self, request: pl.PlanRequest) -> pl.FootprintFn:
        return lambda _key, _cfg: footprint(1 * GiB)

    def start(self, waiter: Waiter, plan: pl.Plan) -> None:
        pass  # the test answers with Scheduler.loaded

    def stop(self, key: str, event: str, reason: str, request_id) -> None:
        self.stops.append((key, event, reason))

    def dispatch(self, waiter: Waiter, key: str) -> None:
        self.handed.append(key)

    def reject(self, waiter: Waiter, error) -> None:
        raise AssertionError(f"rejected: {error}")

    def wake_at(self, when: float) -> None:
        pass

    def prefetch(self, path: str) -> None:
        pass  # no file to read: page cache is none of this test's business


def serve_one(s: Scheduler, fx: Recorder, key: str, keep_alive: float | None) -> None:
    req = pl.PlanRequest(key=key, config=LoadConfig(n_ctx=512), alloc_mode="max-gpu", n_layer=4, n_moe_layers=0,
                         n_ctx_train=4096, fixed=frozenset())
    w = Waiter(req, fx.now(), keep_alive=keep_alive)
    if s.fast(w) is None:
        s.submit(w)
        if key in s.seats and s.seats[key].ready_at is None:
            s.loaded(key, bytes={"CPU": 1}, bytes_source="measured", load_seconds=1.0)
    s.finished(key)


def test_keep_alive_0_unloads_when_the_request_ends() -> None:
    fx = Recorder()
    s = Scheduler(fx, idle_unload_seconds=1800)
    serve_one(s, fx, "a", 0.0)
    assert fx.stops == [("a", "idle-unload", "idle for 0 s (keep-alive 0 s)")]


def test_keep_alive_forever_outlives_the_policy_and_a_later_request_resets_it() -> None:
    fx = Recorder()
    s = Scheduler(fx, idle_unload_seconds=2)
    serve_one(s, fx, "a", math.inf)
    serve_one(s, fx, "b", None)
    assert s.idle_due_at(s.seats["a"]) is None and s.idle_due_at(s.seats["b"]) == 2.0
    fx.t = 3600.0
    s.tick()
    assert [k for k, ev, _ in fx.stops if ev == "idle-unload"] == ["b"]
    serve_one(s, fx, "a", 5.0)  # the next request's keep_alive replaces the seat's
    assert s.idle_due_at(s.seats["a"]) == 3605.0
