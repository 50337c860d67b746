"""A recording fake of the scheduler's ``Effects`` and a small discrete-event world around it.

``Recorder`` only records what the scheduler asked for (and plans with the real planner over a declared
budget); a test answers the calls itself. ``World`` answers them on a virtual clock: loads finish after a
load time, stops after a release time, and each seat serves its requests on its own slots one after
another, like llama-server does. No processes, sockets or sleeps: a whole run takes milliseconds.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from fitevict import planner as pl
from fitevict.budget import Budget
from fitevict.pricing.footprint import HOST, DeviceFootprint, Footprint, Term
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.schedule.errors import SupervisorError
from fitevict.schedule.fair import Share
from fitevict.schedule.scheduler import SchedPolicy, Scheduler, Waiter


def footprint(n: int) -> Footprint:
    return Footprint((DeviceFootprint(HOST, Term(n, "declared"), Term(0, "declared")),), host_mapped_bytes=n)


def request(key: str, *, parallel: int = 1, ctx: int = 4096, fixed: frozenset[str] | None = frozenset(),
            pinned: bool = False, path: str = "") -> pl.PlanRequest:
    return pl.PlanRequest(key=key, config=LoadConfig(n_ctx=ctx, n_parallel=parallel), alloc_mode="max-gpu",
                          fixed=fixed, pinned=pinned, path=path)


class Recorder:
    """The recording fake: every effect is appended to ``calls``; the scheduler plans with the real planner over a
    declared budget and one price per model."""

    def __init__(self, sizes: dict[str, int], budget: int) -> None:
        self.sizes = sizes
        self.declared = Budget.declared({HOST: {"total": budget}})
        self.t = 0.0
        self.calls: list[tuple] = []
        self.answers: dict[Waiter, object] = {}
        self.wake: float | None = None

    def now(self) -> float:
        return self.t

    def budget(self) -> Budget:
        return self.declared

    def prices(self, request: pl.PlanRequest) -> pl.FootprintFn:
        return lambda key, _cfg: footprint(self.sizes[key])

    def start(self, waiter: Waiter, plan: pl.Plan) -> None:
        self.calls.append(("start", waiter.key))

    def stop(self, key: str, event: str, reason: str, request_id: str | None) -> None:
        self.calls.append(("stop", key, event, reason))

    def dispatch(self, waiter: Waiter, key: str) -> None:
        self.calls.append(("dispatch", waiter.request_id, key))
        self.answers[waiter] = key

    def reject(self, waiter: Waiter, error: SupervisorError) -> None:
        self.calls.append(("reject", waiter.request_id, type(error).__name__))
        self.answers[waiter] = error

    def wake_at(self, when: float) -> None:
        self.wake = when

    def prefetch(self, path: str) -> None:
        self.calls.append(("prefetch", path))

    def kinds(self, kind: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == kind]


@dataclass
class Served:
    rid: str
    key: str
    arrived: float
    handed: float | None = None  # when the scheduler gave it a seat
    done: float | None = None
    rejected: str | None = None
    share: Share = Share()
    estimate: float | None = None  # the wait stated when it was queued (None: handed at once)
    retry_after: int | None = None


@dataclass
class World:
    """Answers the scheduler's effects on a virtual clock, and checks the budget at every instant."""

    sizes: dict[str, int]
    budget_bytes: int
    load_s: dict[str, float]
    release_s: float = 0.05
    service_s: Callable[[str], float] = lambda key: 0.1
    policy: SchedPolicy = SchedPolicy()
    eviction: str = "cost"
    t: float = 0.0
    requests: dict[str, Served] = field(default_factory=dict)
    events: list[tuple] = field(default_factory=list)  # (time, what, key)
    peak_over: int = 0
    _heap: list = field(default_factory=list)
    _seq: itertools.count = field(default_factory=itertools.count)
    _held: dict[str, int] = field(default_factory=dict)  # bytes held per seat (loading seats hold their price)
    _engine: dict[str, list] = field(default_factory=dict)  # per seat: [busy slots, FIFO of (rid)]
    _wake: float | None = None
    on_stop: Callable[[World, str, str], None] | None = None
    _after: dict[str, Callable[[], None]] = field(default_factory=dict)
    _waiters: dict[str, Waiter] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.plans = Recorder(self.sizes, self.budget_bytes)
        self.sched = Scheduler(self, replace(self.policy, eviction=self.eviction))

    # -- Effects --------------------------------------------------------------------------------

    def now(self) -> float:
        return self.t

    def budget(self) -> Budget:
        return self.plans.budget()

    def prices(self, request: pl.PlanRequest) -> pl.FootprintFn:
        return self.plans.prices(request)

    def start(self, waiter: Waiter, plan: pl.Plan) -> None:
        self._held[waiter.key] = self.sizes[waiter.key]
        self.peak_over = max(self.peak_over, sum(self._held.values()) - self.budget_bytes)
        self.events.append((self.t, "load", waiter.key))
        slots = plan.config.n_parallel or 4 if plan.config is not None else 1
        self._engine[waiter.key] = [0, [], slots]
        self.at(self.t + self.load_s[waiter.key], lambda k=waiter.key: self.sched.loaded(
            k, bytes={HOST: self.sizes[k]}, bytes_source="measured", load_seconds=self.load_s[k]))

    def stop(self, key: str, event: str, reason: str, request_id: str | None) -> None:
        self.events.append((self.t, event, key))
        if self.on_stop is not None:
            self.on_stop(self, key, event)

        def gone(k: str = key) -> None:
            self.events.append((self.t, "gone", k))
            self._held.pop(k, None)
            self._engine.pop(k, None)
            self.sched.stopped(k)
        self.at(self.t + self.release_s, gone)

    def dispatch(self, waiter: Waiter, key: str) -> None:
        r = self.requests[waiter.request_id]
        r.handed = self.t
        self._waiters[r.rid] = waiter
        if not waiter.hold:
            return
        eng = self._engine[key]
        eng[1].append(r.rid)
        self._run(key)

    def reject(self, waiter: Waiter, error: SupervisorError) -> None:
        self.requests[waiter.request_id].rejected = type(error).__name__
        self.requests[waiter.request_id].retry_after = getattr(error, "retry_after", None)
        after = self._after.pop(waiter.request_id, None)
        if after is not None:
            self.at(self.t, after)

    def prefetch(self, path: str) -> None:
        self.events.append((self.t, "prefetch", path))  # page cache: reclaimable, so no bytes held against the budget

    def wake_at(self, when: float) -> None:
        if self._wake is not None and self._wake <= when and self._wake > self.t:
            return
        self._wake = when
        self.at(when, self._tick)

    # -- the world ------------------------------------------------------------------------------

    def _tick(self) -> None:
        if self._wake is not None and self._wake <= self.t:
            self._wake = None
        self.sched.tick()

    def _run(self, key: str) -> None:
        eng = self._engine.get(key)
        if eng is None:
            return
        while eng[0] < eng[2] and eng[1]:
            rid = eng[1].pop(0)
            eng[0] += 1

            def finish(rid: str = rid, k: str = key) -> None:
                self.requests[rid].done = self.t
                after = self._after.pop(rid, None)
                if after is not None:
                    after()
                e = self._engine.get(k)
                if e is not None:
                    e[0] -= 1
                self.sched.measured.served(k, self.service_s(k))
                self.sched.finished(k, self._waiters.pop(rid, None))
                self._run(k)
            self.at(self.t + self.service_s(key), finish)

    def at(self, when: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (when, next(self._seq), fn))

    def submit(self, rid: str, key: str, when: float, *, on_done: Callable[[], None] | None = None,
               req: pl.PlanRequest | None = None, share: Share = Share()) -> None:
        if on_done is not None:
            self._after[rid] = on_done

        def arrive() -> None:
            self.requests[rid] = r = Served(rid, key, self.t, share=share)
            w = Waiter(req or request(key), self.t, rid, share=share)
            self.sched.submit(w)
            if w in self.sched.queue:
                r.estimate = self.sched.estimate(w).seconds
        self.at(when, arrive)

    def client(self, cid: str, keys: list[str], start: float = 0.0, think: float = 0.0) -> None:
        """A closed-loop client: sends ``keys`` in order, each when the previous one was answered."""
        def send(i: int, when: float) -> None:
            if i >= len(keys):
                return
            self.submit(f"{cid}-{i}", keys[i], when, on_done=lambda: send(i + 1, self.t + think))
        send(0, start)

    def run(self, until: float = math.inf, max_events: int = 200_000) -> None:
        n = 0
        while self._heap and n < max_events:
            when, _, fn = heapq.heappop(self._heap)
            if when > until:
                heapq.heappush(self._heap, (when, next(self._seq), fn))
                break
            self.t = max(self.t, when)
            fn()
            n += 1

    def waits(self) -> dict[str, float]:
        return {r.rid: r.handed - r.arrived for r in self.requests.values() if r.handed is not None}

    def loads(self) -> list[str]:
        return [k for _t, what, k in self.events if what == "load"]
