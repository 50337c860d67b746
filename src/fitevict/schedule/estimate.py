"""A wait stated up front: how long a queued request will wait for its seat. PURE.

The estimate reads the scheduler as it stands (nothing is planned or changed) and three kinds of figures:

- the request's **position**: the requests of its model ahead of it in fair order (``schedule.fair``), and those
  in flight on its seat;
- the **measured load seconds** of each seat that must load before it is served (its own included), and what is
  left of a load under way;
- the **measured service seconds** per request of each model (the engine's own prompt and decode time, or the
  request's time on its seat), an exponentially weighted mean.

With its seat ready: ``ceil((in flight + ahead + 1 - room) / slots) x service``. Otherwise: what is left of the
turn of each seat the last plan waited for, and of its requests in flight, then for each model placed before it
(earliest deadline first) its load and its queue's service, then its own load and its place in its own queue.
A figure not measured yet is the labelled rule of the scheduler's victim choice (bytes at 1 GiB/s for a load) or
left out and named (a service time): the estimate says which in ``sources``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fitevict.schedule.seats import PLACING, SERVING, SeatStatus
from fitevict.units import GiB

# the scheduler and a queued request (schedule.scheduler.Scheduler, schedule.terms.Waiter): named, not imported,
# since the scheduler builds on this module
Scheduler = Any
Waiter = Any

SMOOTHING = 0.3  # weight of the newest service reading in the mean
ASSUMED_LOAD_RATE = 1.0 * GiB  # bytes/s for a model never loaded here (the scheduler's DEFAULT_RELOAD_RATE)


@dataclass(frozen=True, slots=True)
class Estimate:
    seconds: float
    position: int  # requests of its model ahead of it: in flight on its seat and waiting before it
    placements: int  # loads before it is served (its own included)
    sources: tuple[str, ...] = ()  # what each figure was: "load llama-gqa 1.21 s measured", ...

    def to_json(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "position": self.position, "placements": self.placements,
                "sources": list(self.sources)}


@dataclass(slots=True)
class Measured:
    """Per model: its last measured load seconds and the mean of its measured service seconds per request."""

    load: dict[str, float] = field(default_factory=dict)
    service: dict[str, float] = field(default_factory=dict)

    def loaded(self, key: str, seconds: float) -> None:
        self.load[key] = seconds

    def served(self, key: str, seconds: float) -> None:
        if seconds >= 0 and math.isfinite(seconds):
            old = self.service.get(key)
            self.service[key] = seconds if old is None else (1 - SMOOTHING) * old + SMOOTHING * seconds

    def load_of(self, key: str, nbytes: int) -> tuple[float, str]:
        if key in self.load:
            return self.load[key], f"load {key} {self.load[key]:.2f} s measured"
        seconds = nbytes / ASSUMED_LOAD_RATE
        return seconds, f"load {key} {seconds:.2f} s assumed (never loaded here: its bytes at 1 GiB/s)"

    def service_of(self, key: str) -> tuple[float, str]:
        if key in self.service:
            return self.service[key], f"service {key} {self.service[key]:.3f} s/request measured"
        return 0.0, f"service {key} unavailable, because no request of it has been measured yet (counted 0)"


def estimate(sched: Scheduler, w: Waiter, now: float, *, queued: bool = True) -> Estimate:
    """``w``'s wait from ``now`` (module docstring)."""
    m = sched.measured
    mine = [q for q in sched.queue if q.key == w.key and q is not w]
    ahead = sum(1 for q in mine if not queued or sched.fair.order(q) < sched.fair.order(w))
    svc, svc_src = m.service_of(w.key)
    sources = [svc_src]
    s = sched.table.get(w.key)
    if s is not None and s.status is SeatStatus.READY and sched._serves(s, w):
        rounds = max(0, math.ceil((s.in_flight + ahead + 1 - s.room(sched.policy.engine_queue_depth)) / s.capacity))
        return Estimate(rounds * svc, s.in_flight + ahead, 0, tuple(sources))
    t, placements = 0.0, 1
    placing = s is not None and s.status in PLACING
    if placing:
        load, src = m.load_of(w.key, sum(s.bytes.values()) or _bytes(w))
        t += max(0.0, load - (now - s.since))
        sources.append(src)
    else:
        before = _models_before(sched, w)
        t += _blocked(sched, before[0][1] if before else w, now, sources)
        for key, head, n in before:
            load, src = m.load_of(key, _bytes(head))
            service, s_src = m.service_of(key)
            t += load + math.ceil(n / max(1, head.request.config.n_parallel or 4)) * service
            sources += [src, s_src]
        placements += len(before)
        load, src = m.load_of(w.key, _bytes(w))
        t += load
        sources.append(src)
    slots = max(1, w.request.config.n_parallel or 4)
    t += (ahead // slots) * svc
    return Estimate(t, ahead, placements, tuple(sources))


def _bytes(w: Waiter) -> int:
    """The bytes ``w``'s model is quoted at (0 when it has no quote yet)."""
    q = w.request.quote
    return q.footprint(w.request.config).whole_bytes if q is not None else 0


def _models_before(sched: Scheduler, w: Waiter) -> list[tuple[str, Waiter, int]]:
    """The models placed before ``w``'s, earliest deadline first: (model, its first waiter, its waiters)."""
    heads: dict[str, Waiter] = {}
    counts: dict[str, int] = {}
    for q in sorted(sched.queue, key=sched._due):
        s = sched.table.get(q.key)
        if s is not None and (s.status in PLACING or s.status is SeatStatus.READY and sched._serves(s, q)):
            continue  # served by a seat that is there, or loading
        heads.setdefault(q.key, q)
        counts[q.key] = counts.get(q.key, 0) + 1
    out = []
    for key, head in heads.items():
        if key == w.key:
            break
        out.append((key, head, counts[key]))
    return out


def _blocked(sched: Scheduler, head: Waiter, now: float, sources: list[str]) -> float:
    """What is left of the turns of the seats the last plan for ``head``'s model waited for, and of their requests in
    flight."""
    t = 0.0
    for key in sched.blocked.get(head.key, ()):
        s = sched.table.get(key)
        if s is None or s.status not in SERVING:
            continue
        service, src = sched.measured.service_of(key)
        turn = max(0.0, sched._turn_end(s, head, now) - now) if s.status is SeatStatus.READY else 0.0
        t += turn + math.ceil(s.in_flight / s.capacity) * service
        sources.append(f"turn of {key} {turn:.2f} s left, {s.in_flight} in flight; {src}")
    return t


__all__ = ["Estimate", "Measured", "estimate"]
