"""The baseline policies the trace replay compares fitevict's scheduler with: small simulations of how
other servers choose what to load and what to stop. Each drives the same simulated ``Effects`` (``Sim``)
as the real scheduler, so every row is measured by the same code.

- ``CountLRU`` (``--models-max N``, as llama.cpp's router mode and similar servers do it): any number of
  bytes, at most N models; a load that would make N+1 stops the least recently used idle model first.
  Bytes are never looked at, so it can hold more than the budget.
- ``FifoSwap`` (one-at-a-time swapping, as a llama-swap group with ``swap: true`` does it): one model at a
  time, requests served strictly in arrival order; when the oldest request names another model, the
  resident one finishes its requests in flight and is swapped out.
- ``KeepAlive`` (Ollama's order): requests taken in arrival order, and a request whose model is not ready
  holds up the ones behind it; each model stays ``keep_alive`` seconds after its last request; when memory
  is short, the idle model whose keep-alive ends soonest is unloaded, one at a time, until the new one fits.
  Ollama's count cap (``OLLAMA_MAX_LOADED_MODELS``) is not simulated: memory is the only limit.

All three answer a request that waited ``queue_timeout`` seconds with Busy (a lost request), as fitevict does,
and give a seat at most its ``seat_room`` (``n_parallel`` plus ``engine_queue_depth``) requests at once (Ollama: no cap, its runner
queues them). Loads are one at a time for every policy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from fitevict.schedule.errors import Busy, Refused
from fitevict.schedule.scheduler import Waiter
from fitevict.schedule.seats import seat_room

from tracesim import Sim


@dataclass(eq=False, slots=True)
class _Seat:
    key: str
    bytes: int
    phase: str = "loading"  # loading | ready | stopping
    in_flight: int = 0
    last_used: float = 0.0


class _Baseline:
    name = "baseline"

    def __init__(self, sim: Sim, *, queue_timeout: float = 300.0, engine_queue_depth: int | None = None) -> None:
        self.fx = sim
        self.queue_timeout = queue_timeout
        self.depth = engine_queue_depth
        self.queue: list[Waiter] = []
        self.seats: dict[str, _Seat] = {}

    # -- inputs (the simulator's Policy protocol) -------------------------------------------------

    def arrive(self, w: Waiter) -> str | None:
        self.queue.append(w)
        self._pump()
        return None

    def loaded(self, key: str, *, bytes: Mapping[str, int], bytes_source: str, load_seconds: float) -> None:
        s = self.seats[key]
        s.phase, s.last_used = "ready", self.fx.now()
        self._pump()

    def stopped(self, key: str) -> None:
        del self.seats[key]
        self._pump()

    def finished(self, key: str) -> None:
        s = self.seats[key]
        s.in_flight -= 1
        s.last_used = self.fx.now()
        self._pump()

    def tick(self) -> None:
        self._pump()

    # -- the step ---------------------------------------------------------------------------------

    def _pump(self) -> None:
        now = self.fx.now()
        wake = math.inf
        for w in list(self.queue):
            due = w.arrived + self.queue_timeout
            if now >= due:
                self.queue.remove(w)
                self.fx.reject(w, Busy(f"{w.key}: not ready within queue_timeout={self.queue_timeout:g} s",
                                       retry_after=10))
            else:
                wake = min(wake, due)
        self._dispatch(now)
        wake = min(wake, self._expire(now))
        if not any(s.phase != "ready" for s in self.seats.values()):
            self._place(now)
        if wake < math.inf:
            self.fx.wake_at(wake)

    def _room(self, s: _Seat) -> bool:
        cap = seat_room(max(1, self.fx.models[s.key].request.config.n_parallel or 4), self.depth)
        return s.phase == "ready" and s.in_flight < cap

    def _hand(self, w: Waiter, s: _Seat, now: float) -> None:
        self.queue.remove(w)
        s.in_flight += 1
        s.last_used = now
        self.fx.dispatch(w, s.key)

    def _dispatch(self, now: float) -> None:
        """Hand every queued request whose seat is ready and has room (any order)."""
        for w in list(self.queue):
            s = self.seats.get(w.key)
            if s is not None and self._room(s):
                self._hand(w, s, now)

    def _dispatch_in_order(self, now: float) -> None:
        """Strictly in arrival order: stop at the first request that cannot be served now."""
        for w in list(self.queue):
            s = self.seats.get(w.key)
            if s is None or not self._room(s):
                return
            self._hand(w, s, now)

    def _expire(self, now: float) -> float:
        return math.inf

    def _place(self, now: float) -> None:
        raise NotImplementedError

    def _start(self, w: Waiter) -> None:
        self.seats[w.key] = _Seat(w.key, sum(self.fx.models[w.key].bytes.values()))
        self.fx.start(w, None)

    def _stop(self, s: _Seat, event: str, reason: str) -> None:
        s.phase = "stopping"
        self.fx.stop(s.key, event, reason, None)

    def _idle(self) -> list[_Seat]:
        return [s for s in self.seats.values() if s.phase == "ready" and s.in_flight == 0]


class CountLRU(_Baseline):
    def __init__(self, sim: Sim, models_max: int, **kw) -> None:
        super().__init__(sim, **kw)
        self.models_max = models_max
        self.name = f"count-LRU (models-max {models_max})"

    def _place(self, now: float) -> None:
        head = next((w for w in self.queue if w.key not in self.seats), None)
        if head is None:
            return
        if len(self.seats) < self.models_max:
            self._start(head)
            return
        idle = self._idle()
        if idle:
            victim = min(idle, key=lambda s: (s.last_used, s.key))
            self._stop(victim, "evict", f"models-max {self.models_max} reached; least recently used")


class FifoSwap(_Baseline):
    name = "FIFO swap (one at a time)"

    _dispatch = _Baseline._dispatch_in_order

    def _place(self, now: float) -> None:
        if not self.queue or self.queue[0].key in self.seats:
            return
        head = self.queue[0]
        if not self.seats:
            self._start(head)
            return
        for s in self._idle():
            self._stop(s, "evict", f"swapped out for {head.key}")


class KeepAlive(_Baseline):
    def __init__(self, sim: Sim, keep_alive: float = 300.0, **kw) -> None:
        super().__init__(sim, **kw)
        self.keep_alive = keep_alive
        self.name = f"keep-alive order (keep_alive {keep_alive:g} s)"
        self.budget = sum(sim.declared.budget_bytes(d) for d in sim.declared.names)

    def _room(self, s: _Seat) -> bool:
        return s.phase == "ready"  # the runner queues what it cannot run yet

    _dispatch = _Baseline._dispatch_in_order  # a request whose model is not ready holds up the ones behind it

    def _expire(self, now: float) -> float:
        wake = math.inf
        for s in self._idle():
            due = s.last_used + self.keep_alive
            if any(w.key == s.key for w in self.queue):
                continue
            if now >= due:
                self._stop(s, "idle-unload", f"keep-alive {self.keep_alive:g} s ended")
            else:
                wake = min(wake, due)
        return wake

    def _place(self, now: float) -> None:
        if not self.queue or self.queue[0].key in self.seats:
            return
        head = self.queue[0]
        need = sum(self.fx.models[head.key].bytes.values())
        if need > self.budget:
            self.queue.remove(head)
            self.fx.reject(head, Refused(None, f"{head.key} needs {need} B; the budget is {self.budget} B"))
            return
        held = sum(s.bytes for s in self.seats.values())
        if held + need <= self.budget:
            self._start(head)
            return
        idle = self._idle()
        if idle:  # one at a time: the next plan sees what that freed
            victim = min(idle, key=lambda s: (s.last_used + self.keep_alive, s.key))
            self._stop(victim, "evict", f"memory short for {head.key}; keep-alive ends soonest")
