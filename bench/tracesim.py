"""A discrete-event simulator that replays request traces through a scheduling policy.

The simulated world: a virtual clock and an event heap; seats that take their model's load time to become
ready and its release time to give their bytes back; engines that serve ``n_parallel`` requests at once,
each for the request's service time, and queue the rest. ``Sim`` implements the scheduler's ``Effects``
protocol (``now``, ``plan``, ``start``, ``stop``, ``dispatch``, ``reject``, ``wake_at``), so fitevict's rows
run the real ``fitevict.schedule.scheduler.Scheduler`` and the real planner (``fitevict.planner.plan``)
over a declared budget; the baselines in ``baselines.py`` drive the same ``Effects`` and are measured by the
same code.

What is counted: every load (a "swap"), the bytes it brings in (all of them, and those of models loaded
before: reload bytes), each served request's wait (arrival to the start of its service, load waits
included), lost requests (rejected, timed out, or cut by a stop), resident bytes (a seat's bytes count from
the start of its load until its release ends) against the budget, and evictions of seats that served
nothing since their load (thrash). A policy that breaks the simulated world's rules (a start of a seat that
is already there, a dispatch to a seat that is not ready, a stop of a seat with requests in it) is recorded
as an anomaly, never ignored.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fitevict import planner as pl
from fitevict.budget import Budget
from fitevict.config.records import PolicyConfig, default
from fitevict.pricing.footprint import Footprint
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.schedule.errors import SupervisorError
from fitevict.schedule.scheduler import SchedPolicy, Scheduler, Waiter

EXCLUSIVE_FRACTION = default(PolicyConfig, "exclusive_fraction")  # the configuration's
MAX_EVENTS = 5_000_000  # a policy that keeps waking itself without progress stops the run here


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model as the simulator knows it: what a request for it asks, what it holds, how long it takes."""

    key: str
    request: pl.PlanRequest
    config: LoadConfig  # the configuration priced: the one the planner chooses under a host-only budget
    footprint: Footprint  # its price
    bytes: Mapping[str, int]  # per budget device, from ``footprint``
    bytes_source: str
    load_seconds: float
    release_seconds: float
    time_source: str


@dataclass(frozen=True, slots=True)
class Req:
    """One request of an open-loop trace."""

    t: float
    key: str
    service: float


@dataclass(frozen=True, slots=True)
class Trace:
    """Open-loop arrivals, closed-loop clients (each sends its next request when the previous is answered,
    after ``think`` seconds), or both."""

    name: str
    arrivals: tuple[Req, ...] = ()
    clients: tuple[tuple[str, ...], ...] = ()
    service: float = 0.0  # service seconds of a closed-loop client's request
    think: float = 0.0
    about: str = ""

    @property
    def requests(self) -> int:
        return len(self.arrivals) + sum(len(c) for c in self.clients)


class Policy(Protocol):
    """What the simulator calls: the scheduler's inputs. ``arrive`` returns a ready seat's key when the
    request was handed one at once (fitevict's fast path), else None (it was queued)."""

    name: str

    def arrive(self, w: Waiter) -> str | None: ...

    def loaded(self, key: str, *, bytes: Mapping[str, int], bytes_source: str, load_seconds: float) -> None: ...

    def stopped(self, key: str) -> None: ...

    def finished(self, key: str) -> None: ...

    def tick(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Result:
    policy: str
    trace: str
    requests: int
    served: int
    lost: int
    lost_by: Mapping[str, int]
    loads: int
    cancelled_loads: int
    loaded_bytes: int
    reload_bytes: int
    load_seconds: float  # simulated seconds spent loading, all loads together
    wait_p50: float
    wait_p99: float
    wait_max: float
    budget_bytes: int
    peak_resident_bytes: int
    over_budget_bytes: int  # peak of resident minus budget, 0 when never over
    evicted_unserved: int  # seats stopped before serving one request since their load
    makespan: float  # when the last request was answered
    anomalies: tuple[str, ...]


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1); nan for no data."""
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


@dataclass(eq=False, slots=True)
class _Seat:
    key: str
    bytes: Mapping[str, int]
    phase: str = "loading"  # loading | ready | stopping
    serving: int = 0
    engine_queue: deque = field(default_factory=deque)
    served: int = 0
    load_event: list | None = None


@dataclass(frozen=True, slots=True)
class _Process:
    """A simulated seat's process as the scheduler's seat record reads it (``schedule.seats.Holds``): its price while
    it loads, what it holds once ready."""

    sim: Sim
    key: str
    outgrowing: bool = False  # a simulated seat holds what it was priced at

    def held(self) -> tuple[Mapping[str, int], str]:
        s = self.sim.seats.get(self.key)
        return self.sim.held(self.key), ("measured" if s is not None and s.phase == "ready" else "predicted")


@dataclass(eq=False, slots=True)
class _Job:
    arrived: float
    service: float
    client: int | None


class Clocked:
    """A simulated clock's event heap (``t``, ``_seq``, ``_heap``) and its load tally (``loads``, ``loaded_bytes``,
    ``reload_bytes``, ``ever_loaded``): shared by the one-node and the cluster simulations."""

    t: float
    _seq: int
    _heap: list
    loads: int
    loaded_bytes: int
    reload_bytes: int
    ever_loaded: set[str]

    def at(self, when: float, fn: Callable[..., Any], *args: Any) -> list:
        ev = [max(when, self.t), self._seq, fn, args, True]
        self._seq += 1
        heapq.heappush(self._heap, ev)
        return ev

    def run_events(self, limit: int, anomalies: list[str]) -> None:
        """Run the heap's events in time order until none is left, or ``limit`` of them (said in ``anomalies``:
        a policy that keeps waking itself without progress stops there)."""
        n = 0
        while self._heap:
            ev = heapq.heappop(self._heap)
            if not ev[4]:
                continue
            n += 1
            if n > limit:
                anomalies.append(f"stopped after {limit} events at t={self.t:.3f} s")
                break
            self.t = ev[0]
            ev[2](*ev[3])

    def count_load(self, model: str, n: int) -> None:
        """One load of ``n`` bytes: a reload when the model was loaded before."""
        self.loads += 1
        self.loaded_bytes += n
        if model in self.ever_loaded:
            self.reload_bytes += n
        self.ever_loaded.add(model)


class Sim(Clocked):
    """The simulated world; implements ``fitevict.schedule.scheduler.Effects``."""

    def __init__(self, models: Mapping[str, ModelSpec], budget: Budget, *, eviction: str = "cost",
                 exclusive_fraction: float = EXCLUSIVE_FRACTION) -> None:
        self.models = dict(models)
        self.declared = budget
        self.plan_policy = pl.Policy(exclusive_fraction=exclusive_fraction, eviction=eviction)  # type: ignore[arg-type]
        self.t = 0.0
        self._heap: list[list] = []
        self._seq = 0
        self._wake: list | None = None
        self.policy: Policy | None = None
        self.seats: dict[str, _Seat] = {}
        self.jobs: dict[Waiter, _Job] = {}
        self.resident: Counter = Counter()
        self.peak_resident = 0
        self.over_budget = 0
        self.loads = self.cancelled = self.loaded_bytes = self.reload_bytes = self.evicted_unserved = 0
        self.load_seconds = 0.0
        self.ever_loaded: set[str] = set()
        self.waits: list[float] = []
        self.lost: Counter = Counter()
        self.served = 0
        self.last_answer = 0.0
        self.anomalies: list[str] = []
        self.resident_trace: list[tuple[float, int]] = []  # (time, resident bytes on the host) at each change
        self._clients: list[deque[str]] = []
        self._trace: Trace | None = None
        self._n = 0


    def run(self, policy: Policy, trace: Trace) -> Result:
        self.policy, self._trace = policy, trace
        for r in trace.arrivals:
            self.at(r.t, self._arrive, r.key, r.service, None)
        self._clients = [deque(seq) for seq in trace.clients]
        for i in range(len(self._clients)):
            self._next(i)
        self.run_events(MAX_EVENTS, self.anomalies)
        for w in self.jobs:
            self.anomalies.append(f"request for {w.key} (arrived {self.jobs[w].arrived:.3f} s) never answered")
            self.lost["never answered"] += 1
        return self.result(policy.name, trace)

    def result(self, name: str, trace: Trace) -> Result:
        budget = sum(self.declared.budget_bytes(d) for d in self.declared.names)
        return Result(
            policy=name, trace=trace.name, requests=trace.requests, served=self.served,
            lost=sum(self.lost.values()), lost_by=dict(self.lost), loads=self.loads, cancelled_loads=self.cancelled,
            loaded_bytes=self.loaded_bytes, reload_bytes=self.reload_bytes, load_seconds=self.load_seconds,
            wait_p50=percentile(self.waits, 0.50), wait_p99=percentile(self.waits, 0.99),
            wait_max=max(self.waits, default=math.nan), budget_bytes=budget,
            peak_resident_bytes=self.peak_resident, over_budget_bytes=self.over_budget,
            evicted_unserved=self.evicted_unserved, makespan=self.last_answer, anomalies=tuple(self.anomalies))

    # -- requests ---------------------------------------------------------------------------------

    def _next(self, client: int) -> None:
        q = self._clients[client]
        if q:
            assert self._trace is not None
            self.at(self.t + self._trace.think, self._arrive, q.popleft(), self._trace.service, client)

    def _arrive(self, key: str, service: float, client: int | None) -> None:
        assert self.policy is not None
        self._n += 1
        w = Waiter(self.models[key].request, self.t, request_id=f"r{self._n}")
        self.jobs[w] = _Job(self.t, service, client)
        got = self.policy.arrive(w)
        if got is not None:
            self._hand(w, got)

    def _hand(self, w: Waiter, key: str) -> None:
        s = self.seats.get(key)
        if s is None or s.phase != "ready":
            self.anomalies.append(f"t={self.t:.3f}: request handed to {key}, which is "
                                  f"{'absent' if s is None else s.phase}")
            self._answer(w, lost="handed to a seat that was not ready")
            return
        s.engine_queue.append(w)
        self._serve(s)

    def _serve(self, s: _Seat) -> None:
        cap = max(1, self.models[s.key].request.config.n_parallel or 4)
        while s.serving < cap and s.engine_queue:
            w = s.engine_queue.popleft()
            job = self.jobs[w]
            s.serving += 1
            self.waits.append(self.t - job.arrived)
            self.at(self.t + job.service, self._done, s, w)

    def _done(self, s: _Seat, w: Waiter) -> None:
        assert self.policy is not None
        s.serving -= 1
        s.served += 1
        self.served += 1
        self._answer(w)
        self._serve(s)
        self.policy.finished(s.key)

    def _answer(self, w: Waiter, lost: str | None = None) -> None:
        job = self.jobs.pop(w)
        self.last_answer = self.t
        if lost is not None:
            self.lost[lost] += 1
        if job.client is not None:
            self._next(job.client)

    # -- Effects ----------------------------------------------------------------------------------

    def now(self) -> float:
        return self.t

    def budget(self) -> Budget:
        return self.declared

    def prices(self, request: pl.PlanRequest) -> pl.FootprintFn:
        spec = self.models[request.key]

        def price(_key: str, cfg: LoadConfig) -> Footprint:
            if cfg != spec.config:
                raise ValueError(f"{request.key}: the simulator holds the price of one configuration only "
                                 f"({spec.config}); the planner asked for {cfg}")
            return spec.footprint

        return price

    def held(self, key: str) -> Mapping[str, int]:
        """What seat ``key`` holds now (a loading seat its price, from the start of its load until it is gone)."""
        s = self.seats.get(key)
        return dict(s.bytes) if s is not None else {}

    def start(self, waiter: Waiter, plan: pl.Plan | None) -> None:
        key = waiter.key
        if key in self.seats:
            self.anomalies.append(f"t={self.t:.3f}: start of {key}, which is already {self.seats[key].phase}")
            return
        spec = self.models[key]
        s = self.seats[key] = _Seat(key, spec.bytes)
        sched = getattr(self.policy, "sched", None)  # fitevict's own: its seat record reads the process, as live
        if sched is not None and (seat := sched.table.get(key)) is not None:
            sched.table.attach(seat, _Process(self, key))
        self.count_load(key, sum(spec.bytes.values()))
        self.load_seconds += spec.load_seconds
        self._hold(spec.bytes, +1)
        s.load_event = self.at(self.t + spec.load_seconds, self._loaded, s)

    def _loaded(self, s: _Seat) -> None:
        assert self.policy is not None
        s.phase, s.load_event = "ready", None
        spec = self.models[s.key]
        self.policy.loaded(s.key, bytes=spec.bytes, bytes_source=spec.bytes_source, load_seconds=spec.load_seconds)

    def stop(self, key: str, event: str, reason: str, request_id: str | None) -> None:
        s = self.seats.get(key)
        if s is None or s.phase == "stopping":
            self.anomalies.append(f"t={self.t:.3f}: stop ({event}) of {key}, which is "
                                  f"{'absent' if s is None else 'already stopping'}")
            return
        if s.phase == "loading":
            assert s.load_event is not None
            s.load_event[4] = False
            self.cancelled += 1
        elif s.served == 0 and event == "evict":
            self.evicted_unserved += 1
        cut = [*s.engine_queue]
        if s.serving or cut:
            self.anomalies.append(f"t={self.t:.3f}: {event} of {key} with {s.serving} request(s) being served "
                                  f"and {len(cut)} queued in the engine")
            for ev in self._heap:  # the requests being served are cut: their completions never come
                if ev[4] and ev[2] == self._done and ev[3][0] is s:
                    ev[4] = False
                    cut.append(ev[3][1])
            s.engine_queue.clear()
            s.serving = 0
            for w in cut:
                self._answer(w, lost="cut by a stop")
        s.phase = "stopping"
        self.at(self.t + self.models[key].release_seconds, self._stopped, s)

    def _stopped(self, s: _Seat) -> None:
        assert self.policy is not None
        self._hold(s.bytes, -1)
        del self.seats[s.key]
        self.policy.stopped(s.key)

    def dispatch(self, waiter: Waiter, key: str) -> None:
        if waiter.hold:
            self._hand(waiter, key)

    def reject(self, waiter: Waiter, error: SupervisorError) -> None:
        self._answer(waiter, lost=type(error).__name__)

    def wake_at(self, when: float) -> None:
        if self._wake is not None:
            self._wake[4] = False
        self._wake = self.at(when, self._tick)

    def prefetch(self, path: str) -> None:
        pass  # the trace's models are priced, not read: a read ahead changes nothing the replay measures

    def _tick(self) -> None:
        assert self.policy is not None
        self._wake = None
        self.policy.tick()

    # -- bytes ------------------------------------------------------------------------------------

    def _hold(self, bytes: Mapping[str, int], sign: int) -> None:
        for d, n in bytes.items():
            self.resident[d] += sign * n
        total = sum(self.resident.values())
        self.peak_resident = max(self.peak_resident, total)
        for d in self.declared.names:
            self.over_budget = max(self.over_budget, self.resident[d] - self.declared.budget_bytes(d))
        self.resident_trace.append((self.t, total))


class FitevictPolicy:
    """fitevict's scheduler, the real class, with the supervisor's two entry points for a request: the fast
    path first, then the queue."""

    def __init__(self, sim: Sim, policy: SchedPolicy, *, idle_unload_seconds: float = 0.0,
                 name: str | None = None) -> None:
        self.sched = Scheduler(sim, policy, idle_unload_seconds=idle_unload_seconds, planning=sim.plan_policy)
        self.name = name or f"fitevict eviction={policy.eviction}"

    def arrive(self, w: Waiter) -> str | None:
        key = self.sched.fast(w)
        if key is None:
            self.sched.submit(w)
        return key

    def loaded(self, key: str, *, bytes: Mapping[str, int], bytes_source: str, load_seconds: float) -> None:
        self.sched.loaded(key, bytes=bytes, bytes_source=bytes_source, load_seconds=load_seconds)

    def stopped(self, key: str) -> None:
        self.sched.stopped(key)

    def finished(self, key: str) -> None:
        self.sched.finished(key)

    def tick(self) -> None:
        self.sched.tick()


def replay(models: Mapping[str, ModelSpec], budget: Budget, trace: Trace,
           make: Callable[[Sim], Policy], *, eviction: str = "cost",
           exclusive_fraction: float = EXCLUSIVE_FRACTION) -> Result:
    """Run ``trace`` once through the policy ``make`` builds over a fresh ``Sim``."""
    sim = Sim(models, budget, eviction=eviction, exclusive_fraction=exclusive_fraction)
    return sim.run(make(sim), trace)
