"""The scheduler: which waiting request runs next, which seat to start, and which to stop.

PURE: no processes, sockets, files, logging or clock reads. Time comes from ``Effects.now()``, and every action goes
out through the narrow ``Effects`` protocol (the "syscall table"): start a seat, stop a seat with a reason, hand a
seat to a request, reject a request, wake me at, read a load's file ahead while its victims stop; and the world's
two readings that a plan needs, the budget now and the prices of the request's file. The scheduler plans itself,
with the pure planner (``plan``), over its own seats as residents. Inputs come in as method calls (a request arrives
or leaves, a load finished or failed, a stop finished, a request finished, a timer fired, the machine's memory was
read again). Tests drive it with a recording fake and a fake clock, in milliseconds.

The rules (docs/scheduling.md says the same in prose):

- **One queue, in fair order.** A request for a ready, compatible seat is handed to it at once, up to its room (its
  slots, plus ``engine_queue_depth`` for the top class); the rest wait here, each model's in fair order (priority
  classes, then a weighted share per key: ``schedule.fair``), so a hung-up client leaves at once.
- **One placement at a time**, so load time and memory are attributable to one model.
- **Turns.** A seat loaded for waiting requests serves them (handed over in the step that marks it ready) and those
  that arrive during its turn, until ``max_turn_seconds`` or until the first request of another model, earliest
  deadline first, has waited its class's bound; a higher class may end a lower class's turn at once when it has
  served a request. Then it drains (takes nothing new, finishes what it has) and may be evicted. ABCABC: AABBCC.
- **Minimum residency.** No eviction within ``min_residency_seconds`` of becoming ready; once it has served a
  request, not longer than its own load took (a guard against thrash, not a tax on every request).
- **Victims** come from the planner, by GreedyDual-Size priority (``cost``) or recency (``lru``); pinned seats, seats
  with requests in flight and seats within their turn are never victims.
- **Nobody waits for a ghost.** A request that leaves is forgotten at once; a load nobody waits for is cancelled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from fitevict import planner as pl
from fitevict.config import EVICTION_POLICIES
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.pages import Holder, carriers
from fitevict.schedule.errors import Busy, Refused, SupervisorError
from fitevict.schedule.estimate import Estimate, estimate
from fitevict.schedule.measured import Measured
from fitevict.schedule.fair import Fairness, cuts_short, deadline, over_queue
from fitevict.schedule.seats import PLACING, SERVING, Exit, Seat, SeatStatus, SeatTable, SeatView
from fitevict.schedule.terms import Effects, Eviction, SchedPolicy, Waiter, stop_words
from fitevict.units import GiB

S = SeatStatus
DEFAULT_RELOAD_RATE = 1.0 * GiB  # bytes/s assumed for a seat never loaded here (reload cost before measuring)
USE_HALF_LIFE = 600.0  # seconds: a model's use counts half this long after it (GreedyDual-Size's frequency)


class Scheduler:
    def __init__(self, effects: Effects, policy: SchedPolicy = SchedPolicy(), *,
                 idle_unload_seconds: float = 0.0, table: SeatTable | None = None,
                 planning: pl.Policy | None = None) -> None:
        self.fx = effects
        self.policy = policy
        self.planning = planning if planning is not None else pl.Policy(eviction=policy.eviction)  # the planner's
        self.idle_unload_seconds = idle_unload_seconds  # 0: never unload for idleness
        self.queue: list[Waiter] = []
        self.table = table if table is not None else SeatTable()  # the seats: changed here, read through seats
        self.closed: str | None = None
        self.inflation = 0.0  # GreedyDual-Size's L: the priority of the last victim
        self.uses: dict[str, tuple[float, float]] = {}  # per model: (decayed count of requests handed, when)
        self.fair = Fairness()  # virtual time per model, finish tags per flow, requests in flight per client
        self.measured = Measured()  # the wait estimate's measured inputs (schedule.measured): the door records them
        self.blocked: dict[str, tuple[str, ...]] = {}  # per model: the seats its last plan waited for
        self._pumping = False
        self._again = False

    @property
    def seats(self) -> Mapping[str, SeatView]:
        """Every seat, read-only (the table's view)."""
        return self.table.view()

    # -- inputs ---------------------------------------------------------------------------------

    def submit(self, w: Waiter) -> None:
        if self.closed is not None:
            self.fx.reject(w, Busy(f"{w.key}: fitevict is {self.closed}; retry later", retry_after=5))
            return
        waiting = sum(1 for q in self.queue if q.key == w.key)
        if waiting >= self.policy.max_queue:
            self.fx.reject(w, Busy(f"{w.key}: {waiting} requests already wait for this model "
                                   f"(policy.max_queue={self.policy.max_queue}); retry later or raise "
                                   f"policy.max_queue", retry_after=5))
            return
        self.fair.stamp(w)
        self.queue.append(w)
        self._pump()
        self._cap_queue(w)

    def _cap_queue(self, w: Waiter) -> None:
        """``w`` waits (no seat at once): refused when its client has more waiting than its key allows (``max_queue``),
        told to retry after its estimated wait; a load started for it alone is cancelled (``cancel``)."""
        if w.share.max_queue is None or w not in self.queue or (
                waiting := sum(1 for q in self.queue if q.share.client == w.share.client)) <= w.share.max_queue:
            return
        wait = self.estimate(w).seconds
        self.cancel(w)
        self.fx.reject(w, over_queue(w, waiting - 1, self.fair.in_flight[w.share.client], wait))

    def fast(self, w: Waiter) -> str | None:
        """The hot path: hand ``w`` its ready seat at once when it has room and nothing of its model queues
        ahead. Returns the seat's key (counted in flight), or None: then ``submit`` it."""
        if self.closed is not None or not w.hold:
            return None
        s = self.table.get(w.key)
        if s is None or s.status is not S.READY or s.in_flight >= s.room(self.policy.engine_queue_depth, w.share.rank):
            return None
        if not self._serves(s, w) or self.fair.capped(w) or any(q.key == w.key for q in self.queue):
            return None
        self.fair.stamp(w)
        self._hand(s, w, self.fx.now())
        return s.key

    def cancel(self, w: Waiter) -> bool:
        """``w`` left (hung up, timed out on its side). Returns False when it was no longer queued."""
        if w not in self.queue:
            return False
        self.queue.remove(w)
        s = self.table.get(w.key)
        if s is not None and s.status in PLACING and not any(self._serves(s, q) for q in self.queue):
            self._stop(s, "unload", "no one waiting: every request for this load left before it finished",
                       w.request_id)
        self._pump()
        return True

    def loaded(self, key: str, *, bytes: Mapping[str, int], bytes_source: str, load_seconds: float,
               config: LoadConfig | None = None) -> None:
        s = self.table.get(key)
        if s is None or s.status not in PLACING:
            return  # cancelled meanwhile: its stop is under way
        now = self.fx.now()
        self.spawned(key)  # a load that finished ran its process, whether or not it said so
        self.table.move(s, S.READY)
        s.ready_at, s.turn_start, s.turn_served, s.turn_rank = now, now, 0, None
        self.measured.loaded(key, load_seconds)
        s.loaded_bytes, s.loaded_source, s.reload_seconds = dict(bytes), bytes_source, load_seconds
        if config is not None:
            s.config = config
        self._touch(s)
        self._pump()

    def load_failed(self, key: str, error: SupervisorError) -> None:
        s = self.table.get(key)
        if s is not None:
            self.table.move(s, S.GONE, exit=Exit.FAILED)
            for w in [q for q in self.queue if self._serves(s, q)]:
                self.queue.remove(w)
                self.fx.reject(w, error)
        self._pump()

    def spawned(self, key: str, config: LoadConfig | None = None) -> None:
        """The placed seat's process runs (under ``config``, when it is not the plan's: a retry without repacking):
        it loads now (STARTING -> LOADING)."""
        s = self.table.get(key)
        if s is not None and s.status in PLACING:
            if config is not None:
                s.config = config
            self.table.move(s, S.LOADING)

    def ending(self, key: str) -> bool:
        """The seat's process exited on its own. A draining seat's end is the stop it drained for (an unload that
        waited, or the eviction for the request that waited for its memory: ``_drained_for``): that stop begins now,
        and True says so (the stop records how the seat ended). Any other serving seat crashed: it serves nothing more
        while its stop runs, and ``stopped`` ends it (False)."""
        s = self.table.get(key)
        if s is None or s.status not in SERVING:
            return False
        stop = self._drained_for(s) if s.status is S.DRAINING else None
        if stop is None:
            self.table.move(s, S.STOPPING)
            return False
        self._stop(s, *stop)
        return True

    def stopped(self, key: str, how: Exit = Exit.STOPPED) -> None:
        """A stop finished (or a seat crashed, ``how``): it holds nothing any more, and leaves the table."""
        s = self.table.get(key)
        if s is not None:
            self.table.move(s, S.GONE, exit=how)
        self.measured.released(key, self.fx.now())
        self._pump()

    def finished(self, key: str, w: Waiter | None = None) -> None:
        """A request handed seat ``key`` ended (``w``: which, for its client's count in flight)."""
        if w is not None and w.hold:
            self.fair.finished(w)
        self.measured.ended(key, w, self.fx.now())
        s = self.table.get(key)
        if s is not None:
            s.in_flight = max(0, s.in_flight - 1)
            s.last_used = self.fx.now()
        self._pump()

    def tick(self) -> None:
        self._pump()

    def remeasured(self) -> None:
        """The machine's memory was read again (the memory sampler's reading): a request waiting for a placement is
        planned again against it now, so memory that came back (another program let go, memory pressure cleared)
        admits it at this reading, not when its own wake-up comes."""
        if self._head() is not None:
            self._pump()

    def unload(self, key: str, reason: str, request_id: str | None = None, event: str = "unload") -> bool:
        """Stop ``key`` once its requests in flight finish (its history event: ``event``); meanwhile it takes nothing
        new and requests for it wait. False when it is not resident."""
        s = self.table.get(key)
        if s is None or s.status is S.STOPPING:
            return False
        if s.status in PLACING:
            self._stop(s, event, reason, request_id)
        else:
            self.table.move(s, S.DRAINING)
            s.stop_after = (event, reason)
        self._pump()
        return True

    def relieve(self, key: str, reason: str) -> bool:
        """Stop ``key`` now to give memory back to other programs (``fitevict.pressure``), only when it is idle:
        ready, nothing in flight or queued for it, not pinned. False when it is not (it is left alone)."""
        s = self.table.get(key)
        if s is None or s not in self.idle():
            return False
        self._stop(s, "evict", reason, None)
        self._pump()
        return True

    def close(self, reason: str = "shutting down") -> list[Waiter]:
        """Take no new work: every queued request is answered busy, every load is cancelled."""
        self.closed = reason
        gone, self.queue = self.queue, []
        for w in gone:
            self.fx.reject(w, Busy(f"{w.key}: fitevict is {reason}; retry later", retry_after=5))
        for s in self.table.values():
            if s.status in PLACING:
                self._stop(s, "unload", f"fitevict is {reason}: load cancelled", None)
        return gone

    def adopt(self, seat: Seat) -> None:
        """A seat that already runs (adopted from an earlier fitevict): its record, READY and never used."""
        self.table.place(seat)

    def plan(self, request: pl.PlanRequest, now: float | None = None) -> pl.Plan:
        """What the planner decides for ``request`` now, over these seats as residents, the world's budget and the
        prices of its file. The server's one call of the planner: every placement, and dry runs (which change
        nothing); ``fitevict plan`` without a server calls the planner over residents it is told of."""
        now = self.fx.now() if now is None else now
        return pl.plan(request, self.residents(now), self.fx.budget(), self.fx.prices(request), self.planning, now)

    # -- views ----------------------------------------------------------------------------------

    def estimate(self, w: Waiter, *, queued: bool = True) -> Estimate:
        """How long ``w`` will wait from now (``schedule.estimate``); ``queued``: it is in the queue."""
        return estimate(self, w, self.fx.now(), queued=queued)

    def waiting(self, key: str | None = None) -> int:
        return sum(1 for w in self.queue if key is None or w.key == key)

    def idle(self) -> list[Seat]:
        """Seats that serve nobody now and may be stopped: ready, nothing in flight or queued, not pinned."""
        return [s for s in self.table.values() if s.status is S.READY and not s.in_flight and not s.pinned
                and not any(self._serves(s, w) for w in self.queue)]

    def idle_due_at(self, s: Seat) -> float | None:
        """When ``s`` falls due for an idle unload (None: never)."""
        ttl = s.keep_alive if s.keep_alive is not None else (self.idle_unload_seconds or math.inf)
        if s.pinned or s.last_used is None or s.status is not S.READY or math.isinf(ttl) or ttl < 0:
            return None
        return s.last_used + ttl

    # -- the step -------------------------------------------------------------------------------

    def _pump(self) -> None:
        if self._pumping:  # an effect answered synchronously: finish this step, then go again
            self._again = True
            return
        self._pumping = True
        try:
            wake = math.inf
            while True:
                self._again = False
                wake = self._step()
                if not self._again:
                    break
        finally:
            self._pumping = False
        if wake < math.inf:
            self.fx.wake_at(wake)

    def _step(self) -> float:
        now = self.fx.now()
        wake = math.inf
        for w in list(self.queue):  # requests that waited their whole bound
            due = w.arrived + self.policy.queue_timeout_seconds
            if now >= due:
                self.queue.remove(w)
                self.fx.reject(w, Busy(f"{w.key}: not ready within policy.queue_timeout_seconds="
                                       f"{self.policy.queue_timeout_seconds:g}; retry later", retry_after=10))
            else:
                wake = min(wake, due)
        self._dispatch(now)
        wake = min(wake, self._finish_drains(), self._idle(now))
        if self.closed is None and not self.table.in_status(*PLACING, S.STOPPING):
            wake = min(wake, self._place(now))
        return wake

    def _dispatch(self, now: float) -> None:
        depth = self.policy.engine_queue_depth
        for w in sorted(self.queue, key=self.fair.order):  # each model's waiters in fair order
            s = self.table.get(w.key)
            if s is None or s.status is not S.READY or not self._serves(s, w):
                continue
            if w.hold and (s.in_flight >= s.room(depth, w.share.rank) or self.fair.capped(w)):
                continue
            self.queue.remove(w)
            if w.hold:
                self._hand(s, w, now)
            self.fx.dispatch(w, s.key)

    def _finish_drains(self) -> float:
        for s in list(self.table.values()):
            if s.status is S.DRAINING and s.stop_after is not None and s.in_flight == 0:
                self._stop(s, *s.stop_after, None)
        return math.inf

    def _idle(self, now: float) -> float:
        wake = math.inf
        for s in list(self.table.values()):
            due = self.idle_due_at(s)
            if due is None or s.in_flight or any(w.key == s.key for w in self.queue):
                continue
            if now >= due:
                kept = s.keep_alive if s.keep_alive is not None else self.idle_unload_seconds
                self._stop(s, "idle-unload", f"idle for {now - (s.last_used or now):.0f} s (keep-alive {kept:g} s)",
                           None)
            else:
                wake = min(wake, due)
        return wake

    def _head(self, other_than: str | None = None) -> Waiter | None:
        """The longest-waiting request that needs a placement (not one its ready seat only has no room for), for
        another model than ``other_than``. Earliest deadline first: the longest-waiting of one class goes first, and a
        lower class's request goes first once it has waited its class's bound (``fair.deadline``)."""
        for w in sorted(self.queue, key=self._due):
            s = self.table.get(w.key)
            if w.key == other_than or s is not None and s.status is S.READY and self._serves(s, w):
                continue
            return w
        return None

    def _drained_for(self, s: Seat) -> tuple[str, str, str | None] | None:
        """The stop draining seat ``s`` waits for, as ``(event, reason, request id)``: the unload that waits for its
        requests in flight, else the eviction for the longest-waiting request of another model (its turn is over);
        None when nobody waits for its memory any more."""
        if s.stop_after is not None:
            return (*s.stop_after, None)
        head = self._head(other_than=s.key)
        if head is None:
            return None
        return ("evict", f"evicted for {head.key}: its turn was over, and {head.key} waited for its memory",
                head.request_id)

    def _stop(self, s: Seat, event: str, reason: str, request_id: str | None) -> None:
        """``s``'s stop begins (its history event: ``event``); ``s.drained`` says whether it was draining then."""
        s.drained = s.status is S.DRAINING
        self.table.move(s, S.STOPPING)
        self.measured.stop_began(s.key, self.fx.now())
        self.fx.stop(s.key, event, reason, request_id)

    def _place(self, now: float) -> float:
        head = self._head()
        draining = [s for s in self.table.values() if s.status is S.DRAINING and s.stop_after is None]
        if head is None:
            for s in draining:  # nobody needs their room any more
                self.table.move(s, S.READY)
            if draining:
                self._again = True
            return math.inf
        plan = self.plan(head.request, now)
        wake = math.inf
        keep = set(plan.wait_for) | set(plan.evict_keys)
        for s in draining:
            if s.key not in keep:
                self.table.move(s, S.READY)
                self._again = True
        if plan.action == "hit":
            s = self.table.get(head.key)
            if s is not None and s.status is S.DRAINING and s.stop_after is None:
                self.table.move(s, S.READY)
                self._again = True
        elif plan.action in pl.LOADING_ACTIONS:
            if plan.evict:
                for e in plan.evict:
                    s = self.table[e.key]
                    self.inflation = max(self.inflation, s.priority)  # GreedyDual-Size: L rises to the victim's H
                    self._stop(s, *stop_words(e, head.key), head.request_id)
                if head.request.path:  # its file read into the page cache while they stop (reclaimable: unbudgeted)
                    self.fx.prefetch(head.request.path)
            else:
                assert plan.config is not None
                self.table.place(Seat(head.key, plan.config, head.request.source, now, pinned=head.request.pinned,
                                      pages=plan.footprint.pages if plan.footprint is not None else None))
                self.fx.start(head, plan)
        elif plan.action == "wait":
            self.blocked[head.key] = tuple(plan.wait_for)
            for key in plan.wait_for:
                s = self.table.get(key)
                if s is None or s.status not in (S.READY, S.DRAINING):
                    continue
                if s.in_flight == 0 or s.status is S.DRAINING:  # within its minimum residency: evictable after
                    if now < (young := self._young_until(s)):
                        wake = min(wake, young)
                    continue
                end = self._turn_end(s, head, now)
                if now >= end:
                    self.table.move(s, S.DRAINING)
                else:
                    wake = min(wake, end)
        else:  # refuse: everyone asking for the same thing gets the same answer
            for w in [q for q in self.queue if q.key == head.key and q.request == head.request]:
                self.queue.remove(w)
                self.fx.reject(w, Refused(plan, plan.reason))
            self._again = True
        return wake

    def _turn_end(self, s: Seat, head: Waiter, now: float) -> float:
        """When ``s`` drains for ``head`` (takes nothing new): its turn's bound (``max_turn_seconds``, or ``head``'s
        class bound), not within its minimum residency; or now when ``head``'s class ends a lower class's turn early
        (``_cut_short``), so that nothing more of the lower class is handed it: its stop waits only for what is in
        flight and for its minimum residency (a draining seat within it is busy for the planner: ``residents``)."""
        if self._cut_short(s, head, now):
            return now
        start = s.turn_start if s.turn_start is not None else s.since
        return max(min(start + self.policy.max_turn_seconds, self._due(head)), self._young_until(s))

    def _cut_short(self, s: Seat, head: Waiter, now: float) -> bool:
        """Whether ``head``'s class ends ``s``'s turn early (``fair.cuts_short``)."""
        mine = [w for w in self.queue if self._serves(s, w)]
        return cuts_short(head, s.turn_served, s.turn_rank, mine, now, self.policy.max_wait_seconds)

    def _due(self, w: Waiter) -> float:
        return deadline(w, self.policy.max_wait_seconds)

    def _young_until(self, s: Seat) -> float:
        """The end of ``s``'s minimum residency; once it has served a request, never longer than its own load took.
        The one place it is computed (no rounding can disagree)."""
        guard = self.policy.min_residency_seconds
        if s.reload_seconds is not None and s.last_used is not None:
            guard = min(guard, s.reload_seconds)
        return (s.ready_at if s.ready_at is not None else s.since) + guard

    def residents(self, now: float) -> list[pl.Resident]:
        """What the planner sees at ``now``: every seat but those stopping, as a ``Resident`` (a seat within its
        minimum residency counts as busy). A fresh list, read-only for the caller."""
        out = []
        live = [s for s in self.table.values() if s.status is not S.STOPPING]
        carried = carriers(Holder(s.key, s.pages, s.since) for s in live)  # the first seat of a binary: its pages
        for s in live:
            young = s.ready_at is not None and now < self._young_until(s)
            # a seat within its minimum residency is busy for the planner: not a victim, but worth waiting for.
            # Its priority goes over as credit above L, so that the planner's band measures the cost term, not L.
            in_flight = s.in_flight or (1 if young and s.status in (S.READY, S.DRAINING) else 0)
            held, held_source = s.held(carried[s.key])
            out.append(pl.Resident(
                key=s.key, config=s.config, bytes=held, source=s.source,
                last_used=s.last_used if s.last_used is not None else (s.ready_at or s.since),
                bytes_source=held_source, pinned=s.pinned, in_flight=in_flight,
                loading=s.status in PLACING, priority=s.priority - self.inflation, reload_seconds=s.reload_seconds,
                outgrowing=s.outgrowing, pages=s.pages.group if s.pages is not None else "", carries=carried[s.key],
            ))
        return out

    def _hand(self, s: Seat, w: Waiter, now: float) -> None:
        s.in_flight += 1
        s.last_used = now
        s.turn_served += 1
        s.turn_rank = w.share.rank if s.turn_rank is None else min(s.turn_rank, w.share.rank)
        self.fair.handed(w)
        self.measured.handed(s.key, w, now, s.capacity)
        if w.keep_alive is not None:
            s.keep_alive = w.keep_alive
        n, then = self.uses.get(s.key, (0.0, now))
        self.uses[s.key] = (n * 0.5 ** ((now - then) / USE_HALF_LIFE) + 1.0, now)
        self._touch(s)

    def _touch(self, s: Seat) -> None:
        """GreedyDual-Size with frequency: H = L + uses x reload cost / size, renewed on every use; uses is the
        model's count of requests handed, each counting half after USE_HALF_LIFE seconds (at least 1)."""
        size = max(1, sum(s.bytes.values()) or 1)
        cost = s.reload_seconds if s.reload_seconds is not None else size / DEFAULT_RELOAD_RATE
        n, then = self.uses.get(s.key, (1.0, self.fx.now()))
        uses = max(1.0, n * 0.5 ** ((self.fx.now() - then) / USE_HALF_LIFE))
        s.priority = self.inflation + uses * cost * GiB / size

    def _serves(self, s: Seat, w: Waiter) -> bool:
        return s.key == w.key and pl.compatible(s.config, w.request, source=s.source)


__all__ = ["EVICTION_POLICIES", "Effects", "Eviction", "SchedPolicy", "Scheduler", "Waiter"]
