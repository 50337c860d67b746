"""A wait stated up front: how long a queued request will wait for its seat. PURE.

The estimate reads the scheduler as it stands (nothing is planned or changed) and what the door measured
(``schedule.measured``): load seconds, stop and release seconds, and per-slot generation rates at a concurrency.
The rule:

- **A request's service** is its tokens (its ``max_tokens``, else its model's typical generation) over the per-slot
  rate at the concurrency it will run at: its seat's busy slots when the requests before it are there (at most its
  slots) plus the requests running on the door's other seats (one machine's cores are shared). An answer without
  tokens (an embedding) takes its seconds per request at that concurrency.
- **On a seat**, requests run in order on the first slot that frees (list scheduling): the requests in flight
  first (those on a slot with what is left of their service, their service less their time on a slot so far; those
  queued in the engine with all of it), then those of its model ahead of it in fair order (``schedule.fair``). The
  door hands a request its seat when the seat has room (its slots plus ``engine_queue_depth``): its wait ends at the
  ``k``-th end, ``k = in flight + ahead + 1 - room`` (0 when ``k <= 0``). A request ahead can only delay it: the
  estimate never falls as its position grows.
- **With its seat ready**: that alone. **With its seat loading**: what is left of its measured load, then that.
  **Otherwise**: a load under way for another model ends (one placement at a time) and that seat serves its turn
  until it yields (ended early for a higher class once it has served one request); the seats the last plan waited
  for finish (what is left of their turn, then of their requests in flight) and are stopped (their measured
  release); then each model placed before it (earliest deadline first) loads, serves its queue and is stopped again;
  then its own load and its place in its own queue.

A figure not measured yet says so in ``sources`` (a load never measured: the median of those measured here, else its
bytes at 1 GiB/s; a release or service never measured: 0, named).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fitevict.schedule.fair import cuts_short
from fitevict.schedule.measured import Measured
from fitevict.schedule.seats import PLACING, SERVING, SeatStatus, seat_room

# the scheduler and a queued request (schedule.scheduler.Scheduler, schedule.terms.Waiter): named, not imported,
# since the scheduler builds on this module
Scheduler = Any
Waiter = Any
Seat = Any


@dataclass(frozen=True, slots=True)
class Estimate:
    seconds: float
    position: int  # requests of its model ahead of it: in flight on its seat and waiting before it
    placements: int  # loads before it is served (its own included)
    sources: tuple[str, ...] = ()  # what each figure was: "load llama-gqa 1.21 s measured", ...

    def to_json(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "position": self.position, "placements": self.placements,
                "sources": list(self.sources)}


def ends(slots: int, seconds: Iterable[float]) -> list[float]:
    """When each of a seat's requests ends, in time order: each (its seconds left, in the order handed) starts on the
    first of ``slots`` slots that frees."""
    free, out = [0.0] * max(1, slots), []
    for s in seconds:
        t = heapq.heappop(free) + max(0.0, s)
        heapq.heappush(free, t)
        out.append(t)
    return sorted(out)


def handed_at(slots: int, room: int, running: list[float], ahead: list[float]) -> float:
    """When the door hands the next request its seat: ``running`` (seconds left of each request on the seat, in the
    order handed) and ``ahead`` (the service of each request before it) run on ``slots`` slots, and a request is
    handed once fewer than ``room`` are on the seat. 0 when there is room now."""
    k = len(running) + len(ahead) + 1 - room
    return ends(slots, [*running, *ahead])[k - 1] if k > 0 else 0.0


def estimate(sched: Scheduler, w: Waiter, now: float, *, queued: bool = True) -> Estimate:
    """``w``'s wait from ``now`` (module docstring)."""
    mine = [q for q in sched.queue if q.key == w.key and q is not w]
    ahead = [q for q in mine if not queued or sched.fair.order(q) < sched.fair.order(w)]
    ahead.sort(key=sched.fair.order)
    s = sched.table.get(w.key)
    sources: list[str] = []
    if s is not None and s.status is SeatStatus.READY and sched._serves(s, w):
        t = _on_seat(sched, s, w, s.capacity, ahead, now, sources)
        return Estimate(t, s.in_flight + len(ahead), 0, tuple(sources))
    t, placements = 0.0, 1
    slots = max(1, w.request.config.n_parallel or 4)
    if s is not None and s.status in PLACING:
        load, src = sched.measured.load_of(w.key, sum(s.bytes.values()) or _bytes(w))
        t += max(0.0, load - (now - s.since))
        sources.append(src)
    else:
        before = _models_before(sched, w)
        t += _placing(sched, w, now, sources)
        t += _blocked(sched, before[0][1] if before else w, now, sources)
        for key, head, n in before:
            t += _turn_of(sched.measured, key, head, n, sources)
        placements += len(before)
        load, src = sched.measured.load_of(w.key, _bytes(w))
        t += load
        sources.append(src)
    t += _on_seat(sched, None, w, slots, ahead, now, sources)
    return Estimate(t, len(ahead), placements, tuple(sources))


def _on_seat(sched: Scheduler, s: Seat | None, w: Waiter, slots: int, ahead: list[Waiter], now: float,
             sources: list[str]) -> float:
    """When ``w``'s seat ``s`` (None: a seat still to load) has room for it after ``ahead`` (its class's room:
    ``seat_room``)."""
    key, rank = w.key, w.share.rank
    m = sched.measured
    running = list(m.running.get(key, {}).items()) if s is not None else []
    busy = min(slots, len(running) + len(ahead) + 1) + _others(sched, key)
    left = _left(m, key, running, busy, now)
    services = [m.service_of(key, m.tokens_of(key, q), busy)[0] for q in ahead]
    sources.append(m.service_of(key, m.tokens_of(key, (ahead or [q for q, _t in running] or [None])[0]), busy)[1])
    return handed_at(slots, seat_room(slots, sched.policy.engine_queue_depth, rank), left, services)


def _left(m: Measured, key: str, running: list[tuple[Waiter, float | None]], busy: int, now: float) -> list[float]:
    """Seconds left of each request on ``key``'s seat (``running``: each with when it took a slot, None: queued in
    the engine): on a slot, its service less its time there; queued in the engine, all of it."""
    out = []
    for q, since in running:
        service = m.service_of(key, m.tokens_of(key, q), busy)[0]
        out.append(service - (now - since) if since is not None else service)
    return out


def running(sched: Scheduler, but: str | None = None) -> int:
    """Requests running on the door's serving seats (but ``but``'s) now: in flight, at most each seat's slots. The
    concurrency a request is measured and estimated at (one machine's cores are shared by its seats)."""
    return sum(min(x.in_flight, x.capacity) for x in sched.table.values() if x.key != but and x.status in SERVING)


def _others(sched: Scheduler, key: str) -> int:
    return running(sched, but=key)


def _placing(sched: Scheduler, w: Waiter, now: float, sources: list[str]) -> float:
    """What is left of a load under way for another model (one placement at a time: the next waits for it), then the
    turn that seat serves before it yields to ``w`` (``_yields``)."""
    t = 0.0
    for s in sched.table.values():
        if s.status in PLACING and s.key != w.key:
            load, src = sched.measured.load_of(s.key, sum(s.bytes.values()))
            left = max(0.0, load - (now - s.since))
            t = max(t, left + _yields(sched, s, w, now + left, load, sources))
            sources.append(f"under way: {src}")
    return t


def _yields(sched: Scheduler, s: Seat, w: Waiter, ready: float, load: float, sources: list[str]) -> float:
    """A seat still loading for its waiters serves them from ``ready`` until it yields to ``w``, then is stopped (its
    measured release). A higher class than all of them ends its turn once it has served one request, after the
    longer of its minimum residency (at most its load) and one request's service (``fair.cuts_short``: the seat is
    handed nothing more); else it serves them, round by round on its slots, until ``w``'s class bound or its
    ``max_turn_seconds``, and finishes the round on its slots."""
    m, p = sched.measured, sched.policy
    mine = [q for q in sched.queue if q.key == s.key]
    service, s_src = m.service_of(s.key, m.tokens_of(s.key, mine[0] if mine else None),
                                  min(s.capacity, max(1, len(mine))))
    release, r_src = m.release_of(s.key)
    sources += [f"turn of {s.key}: {s_src}", r_src]
    if cuts_short(w, 1, None, mine, ready, p.max_wait_seconds):
        return max(min(p.min_residency_seconds, load), service) + release
    rounds = math.ceil(len(mine) / s.capacity) * service
    return min(rounds, max(0.0, min(p.max_turn_seconds, sched._due(w) - ready)) + service) + release


def _turn_of(m: Measured, key: str, head: Waiter, n: int, sources: list[str]) -> float:
    """A model placed before: its load, its ``n`` waiters' service on its slots, and its stop and release."""
    slots = max(1, head.request.config.n_parallel or 4)
    load, l_src = m.load_of(key, _bytes(head))
    service, s_src = m.service_of(key, m.tokens_of(key, head), min(slots, n))
    release, r_src = m.release_of(key)
    sources += [l_src, s_src, r_src]
    return load + math.ceil(n / slots) * service + release


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
    """Until the seats the last plan for ``head``'s model waited for are gone: what is left of their turns (a turn
    that goes on serves its queue: one more round of service), of their requests in flight, and their release."""
    m, t = sched.measured, 0.0
    for key in sched.blocked.get(head.key, ()):
        s = sched.table.get(key)
        if s is None or s.status not in SERVING | {SeatStatus.STOPPING}:
            continue
        release, r_src = m.release_of(key)
        if s.status is SeatStatus.STOPPING:
            t = max(t, release - (now - m.stopping.get(key, now)))
            sources.append(r_src)
            continue
        busy = min(s.capacity, max(1, s.in_flight)) + _others(sched, key)
        turn = max(0.0, sched._turn_end(s, head, now) - now) if s.status is SeatStatus.READY else 0.0
        left = _left(m, key, list(m.running.get(key, {}).items()), busy, now)
        queued = [q for q in sched.queue if q.key == key]
        more = m.service_of(key, m.tokens_of(key, queued[0]), busy)[0] if turn > 0 and queued else 0.0
        t = max(t, turn + more + max(ends(s.capacity, left), default=0.0) + release)
        sources.append(f"turn of {key} {turn:.2f} s left, {s.in_flight} in flight; {r_src}")
    return t


__all__ = ["Estimate", "Measured", "ends", "estimate", "handed_at", "running"]
