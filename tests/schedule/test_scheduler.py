"""The scheduler's rules, driven through a recording fake and a fake clock: no processes, no sleeps."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fitevict.pricing.footprint import HOST
from fitevict.schedule.errors import Busy, Refused
from fitevict.schedule.scheduler import USE_HALF_LIFE, SchedPolicy, Scheduler, Waiter
from fitevict.schedule.seats import SeatStatus, seat_room
from fitevict.units import GiB

from .schedsim import Recorder, World, request

MB = 1_000_000


def sched(sizes: dict[str, int], budget: int, **policy) -> tuple[Scheduler, Recorder]:
    fx = Recorder(sizes, budget)
    return Scheduler(fx, SchedPolicy(**policy)), fx


def ready(s: Scheduler, fx: Recorder, key: str, load_s: float = 1.0) -> None:
    s.loaded(key, bytes={HOST: fx.sizes[key]}, bytes_source="measured", load_seconds=load_s)


def test_abcabc_is_served_as_aabbcc() -> None:
    """Room for one model: six requests arriving A B C A B C cost three loads, not six."""
    w = World({"a": 100 * MB, "b": 100 * MB, "c": 100 * MB}, budget_bytes=150 * MB, load_s=dict(a=1, b=1, c=1))
    for i, k in enumerate("abcabc"):
        w.submit(f"r{i}", k, 0.0)
    w.run()
    assert w.loads() == ["a", "b", "c"]
    assert all(r.done is not None for r in w.requests.values())
    assert w.peak_over <= 0


def test_waiters_get_their_seat_in_the_step_that_makes_it_ready() -> None:
    s, fx = sched({"a": 100 * MB, "b": 100 * MB}, 150 * MB)
    waiters = [Waiter(request("a"), 0.0, f"a{i}") for i in range(3)]
    for w in waiters:
        s.submit(w)
    s.submit(Waiter(request("b"), 0.0, "b0"))
    assert fx.kinds("start") == [("start", "a")]
    fx.calls.clear()
    ready(s, fx, "a")
    # all three handed over (np=1 + one queued in the engine = 2 at once, the third waits for a slot) before anything
    # could stop a: the pending b does not evict it while it serves
    assert [c[0] for c in fx.calls] == ["dispatch", "dispatch"]
    assert s.seats["a"].in_flight == 2 and s.waiting("a") == 1
    s.finished("a")
    assert ("dispatch", "a2", "a") in fx.calls and not fx.kinds("stop")
    s.finished("a")
    s.finished("a")
    fx.t = 2.0  # past the minimum residency: idle now, so b may have its room
    s.tick()
    assert fx.kinds("stop") == [("stop", "a", "evict", fx.kinds("stop")[0][3])]
    assert "evicted for b" in fx.kinds("stop")[0][3]


def test_turn_ends_at_the_oldest_other_request_bound() -> None:
    """a keeps getting requests; b's request waits at most max_wait before a is drained for it."""
    s, fx = sched({"a": 100 * MB, "b": 100 * MB}, 150 * MB, max_wait_seconds=5, max_turn_seconds=100,
                  min_residency_seconds=0)
    s.submit(Waiter(request("a"), 0.0, "a0"))
    ready(s, fx, "a")
    fx.t = 1.0
    s.submit(Waiter(request("b"), 1.0, "b0"))
    assert s.seats["a"].status is SeatStatus.READY and fx.wake == 6.0  # wakes when b's bound is reached
    fx.t = 3.0
    s.submit(Waiter(request("a"), 3.0, "a1"))  # a's turn goes on: it is served at once
    assert ("dispatch", "a1", "a") in fx.calls
    fx.t = 6.0
    s.tick()
    assert s.seats["a"].status is SeatStatus.DRAINING
    s.submit(Waiter(request("a"), 6.5, "a2"))  # after the turn: it queues behind the swap
    assert ("dispatch", "a2", "a") not in fx.calls and s.waiting("a") == 1
    s.finished("a")
    s.finished("a")
    assert fx.kinds("stop")[0][1:3] == ("a", "evict")


def test_max_turn_ends_a_turn_too() -> None:
    s, fx = sched({"a": 100 * MB, "b": 100 * MB}, 150 * MB, max_wait_seconds=100, max_turn_seconds=4,
                  min_residency_seconds=0)
    s.submit(Waiter(request("a"), 0.0, "a0"))
    ready(s, fx, "a")
    s.submit(Waiter(request("b"), 0.0, "b0"))
    assert fx.wake == 4.0
    fx.t = 4.0
    s.tick()
    assert s.seats["a"].status is SeatStatus.DRAINING


def test_minimum_residency_keeps_a_fresh_seat() -> None:
    s, fx = sched({"a": 100 * MB, "b": 100 * MB}, 150 * MB, min_residency_seconds=3)
    s.submit(Waiter(request("a"), 0.0, "a0", hold=False))  # an admin load: holds nothing once ready
    ready(s, fx, "a")  # loaded in 1 s, but it has served nothing yet: the full 3 s of residency
    s.submit(Waiter(request("b"), 0.0, "b0"))
    assert not fx.kinds("stop") and fx.wake == 3.0
    fx.t = 3.0
    s.tick()
    assert fx.kinds("stop")[0][1] == "a"


@pytest.mark.parametrize("load_s,until", [(0.25, 0.25), (3.0, 3.0), (7.0, 3.0)])
def test_minimum_residency_is_never_longer_than_the_load(load_s: float, until: float) -> None:
    """Once a seat has served a request, the guard against thrash keeps it idle min(min_residency_seconds, its own
    load time): a request waiting for its room never waits longer for it than reloading that seat would take."""
    s, fx = sched({"a": 100 * MB, "b": 100 * MB}, 150 * MB, min_residency_seconds=3)
    s.submit(Waiter(request("a"), 0.0, "a0"))
    ready(s, fx, "a", load_s=load_s)
    s.finished("a")  # served: idle now, and young
    s.submit(Waiter(request("b"), 0.0, "b0"))
    assert not fx.kinds("stop") and fx.wake == until
    fx.t = until
    s.tick()
    assert [c[1:3] for c in fx.kinds("stop")] == [("a", "evict")]


def test_a_load_nobody_waits_for_is_cancelled() -> None:
    s, fx = sched({"a": 100 * MB}, 150 * MB)
    w1, w2 = Waiter(request("a"), 0.0, "a0"), Waiter(request("a"), 0.0, "a1")
    s.submit(w1)
    s.submit(w2)
    assert s.cancel(w1) and not fx.kinds("stop")  # one still waits: the load goes on
    assert s.cancel(w2)
    assert fx.kinds("stop") == [("stop", "a", "unload", fx.kinds("stop")[0][3])]
    assert "no one waiting" in fx.kinds("stop")[0][3]
    assert not s.cancel(w2)  # already gone
    s.loaded("a", bytes={HOST: 1}, bytes_source="measured", load_seconds=1)  # a late answer changes nothing
    assert s.seats["a"].status is SeatStatus.STOPPING
    s.stopped("a")
    assert "a" not in s.seats and len(fx.kinds("start")) == 1


def test_close_answers_every_waiter_and_cancels_loads() -> None:
    s, fx = sched({"a": 100 * MB, "b": 100 * MB}, 150 * MB)
    ws = [Waiter(request(k), 0.0, f"{k}{i}") for i, k in enumerate("abab")]
    for w in ws:
        s.submit(w)
    s.close()
    assert all(isinstance(fx.answers[w], Busy) and "shutting down" in str(fx.answers[w]) for w in ws)
    assert [c[1] for c in fx.kinds("stop")] == ["a"]
    s.stopped("a")
    late = Waiter(request("b"), 1.0, "late")
    s.submit(late)
    assert isinstance(fx.answers[late], Busy) and len(fx.kinds("start")) == 1  # no new load after close


def test_refusal_answers_everyone_asking_the_same() -> None:
    s, fx = sched({"big": 500 * MB, "a": 10 * MB}, 150 * MB)
    ws = [Waiter(request("big"), 0.0, f"r{i}") for i in range(3)]
    for w in ws:
        s.submit(w)
    s.submit(Waiter(request("a"), 0.0, "a0"))
    assert all(isinstance(fx.answers[w], Refused) for w in ws)
    assert fx.kinds("start") == [("start", "a")]  # the queue moves on


def test_queue_full_and_timeout_are_busy() -> None:
    s, fx = sched({"a": 100 * MB}, 150 * MB, max_queue=2, queue_timeout_seconds=10)
    ws = [Waiter(request("a"), 0.0, f"a{i}") for i in range(3)]
    for w in ws:
        s.submit(w)
    assert isinstance(fx.answers[ws[2]], Busy) and "max_queue=2" in str(fx.answers[ws[2]])
    assert fx.wake == 10.0
    fx.t = 10.0
    s.tick()
    assert all(isinstance(fx.answers[w], Busy) and "queue_timeout" in str(fx.answers[w]) for w in ws[:2])


def test_by_default_a_seat_takes_one_batch_beyond_its_slots() -> None:
    """With no engine_queue_depth set, a 2-slot seat takes 4 requests (2 running, 2 ready in the engine for when
    they end); the fifth waits in fitevict's queue."""
    s, fx = sched({"a": 100 * MB}, 150 * MB)
    s.submit(Waiter(request("a", parallel=2), 0.0, "x"))
    ready(s, fx, "a")
    got = [s.fast(Waiter(request("a", parallel=2), 0.0, f"a{i}")) for i in range(4)]
    assert got == ["a", "a", "a", None]
    assert s.seats["a"].in_flight == 4


def test_capacity_is_slots_plus_engine_queue_depth() -> None:
    s, fx = sched({"a": 100 * MB}, 150 * MB, engine_queue_depth=1)
    s.submit(Waiter(request("a", parallel=2), 0.0, "x"))
    ready(s, fx, "a")
    held = [Waiter(request("a", parallel=2), 0.0, f"a{i}") for i in range(4)]
    got = [s.fast(w) for w in held]
    assert got == [None, None, None, None] or got.count("a") == 2  # one already in flight: 3 fit, 2 via fast
    assert s.seats["a"].in_flight == 3


def test_fast_path_never_overtakes_a_queued_request() -> None:
    s, fx = sched({"a": 100 * MB}, 150 * MB, engine_queue_depth=0)
    s.submit(Waiter(request("a"), 0.0, "a0"))
    ready(s, fx, "a")
    queued = Waiter(request("a"), 0.0, "a1")
    s.submit(queued)  # no room: it queues
    assert s.waiting("a") == 1
    assert s.fast(Waiter(request("a"), 0.0, "a2")) is None  # the newcomer must queue behind it
    s.finished("a")
    assert fx.answers[queued] == "a"


def test_contract_mismatch_replaces_the_seat_after_its_requests() -> None:
    s, fx = sched({"a": 100 * MB}, 150 * MB, min_residency_seconds=0)
    s.submit(Waiter(request("a", ctx=4096), 0.0, "a0"))
    ready(s, fx, "a")
    smaller = Waiter(request("a", ctx=2048, fixed=frozenset({"n_ctx"})), 0.0, "small")
    assert s.fast(smaller) == "a"  # a smaller context is served by the seat as it is
    s.finished("a", smaller)
    other = Waiter(request("a", ctx=8192, fixed=frozenset({"n_ctx"})), 0.0, "a1")
    s.submit(other)
    assert not fx.kinds("stop")  # a0 is in flight on the old seat
    s.finished("a")
    assert fx.kinds("stop")[0][1:3] == ("a", "unload") and "another configuration" in fx.kinds("stop")[0][3]
    assert "(reloaded for ctx: resident 4096 < asked 8192)" in fx.kinds("stop")[0][3]
    s.stopped("a")
    assert fx.kinds("start") == [("start", "a"), ("start", "a")]
    # a request that fixes nothing is served by whatever seat of the model is resident
    ready(s, fx, "a")
    assert s.fast(Waiter(request("a"), 0.0, "any")) == "a"


def test_idle_unload_follows_keep_alive() -> None:
    s, fx = sched({"a": 10 * MB, "b": 10 * MB}, 150 * MB)
    s.idle_unload_seconds = 60
    s.submit(Waiter(request("a"), 0.0, "a0", keep_alive=0.0))
    s.submit(Waiter(request("b"), 0.0, "b0", keep_alive=math.inf))
    ready(s, fx, "a")
    ready(s, fx, "b")
    s.finished("a")
    s.finished("b")
    fx.t = 0.5
    s.tick()
    assert [c[1:3] for c in fx.kinds("stop")] == [("a", "idle-unload")]
    fx.t = 10_000
    s.tick()
    assert len(fx.kinds("stop")) == 1  # b is kept for ever


@pytest.mark.parametrize("eviction,victim", [("cost", "cheap"), ("lru", "dear")])
def test_victims_by_greedydual_size_or_lru(eviction: str, victim: str) -> None:
    """Both idle; the cheap one to reload per byte goes under cost, the least recently used under lru."""
    fx = Recorder({"cheap": 100 * MB, "dear": 100 * MB, "new": 100 * MB}, 250 * MB)
    s = Scheduler(fx, SchedPolicy(eviction=eviction, min_residency_seconds=0))  # type: ignore[arg-type]
    for key, load_s in (("dear", 20.0), ("cheap", 0.5)):
        w = Waiter(request(key), fx.t, key)
        s.submit(w)
        ready(s, fx, key, load_s)
        s.finished(key)
        fx.t += 1
    s.submit(Waiter(request("new"), fx.t, "n"))
    stops = fx.kinds("stop")
    assert [c[1] for c in stops] == [victim]
    assert ("GreedyDual-Size" in stops[0][3]) == (eviction == "cost")


@pytest.mark.parametrize("inflation", [0.0, 1000.0])
def test_cost_stays_greedydual_size_however_far_l_has_risen(inflation: float) -> None:
    """L (the last victim's priority) grows with every eviction of a long-running server. The planner's band is
    measured on the priority above L, so L never makes every seat tie (then cost would be LRU): the cheap one to
    reload per byte still goes, though the dear one is older."""
    fx = Recorder({"cheap": 100 * MB, "dear": 100 * MB, "new": 100 * MB}, 250 * MB)
    s = Scheduler(fx, SchedPolicy(eviction="cost", min_residency_seconds=0))
    s.inflation = inflation
    for key, load_s in (("dear", 20.0), ("cheap", 0.5)):
        s.submit(Waiter(request(key), fx.t, key))
        ready(s, fx, key, load_s)
        s.finished(key)
        fx.t += 1
    s.submit(Waiter(request("new"), fx.t, "n"))
    assert [c[1] for c in fx.kinds("stop")] == ["cheap"]


def test_a_model_used_more_is_kept_over_a_more_recent_one() -> None:
    """GreedyDual-Size counts uses: equal size and reload time, the one asked for three times stays, the one asked
    for once goes, though it was used last."""
    fx = Recorder({"often": 100 * MB, "once": 100 * MB, "new": 100 * MB}, 250 * MB)
    s = Scheduler(fx, SchedPolicy(eviction="cost", min_residency_seconds=0))
    for key, uses in (("often", 3), ("once", 1)):  # often at t = 0, 1, 2; once at t = 3
        for i in range(uses):
            s.submit(Waiter(request(key), fx.t, f"{key}{i}"))
            if i == 0:
                ready(s, fx, key, 2.0)
            s.finished(key)
            fx.t += 1
    s.submit(Waiter(request("new"), fx.t, "n"))
    assert [c[1] for c in fx.kinds("stop")] == ["once"]  # least recently used would have been "often"


def test_uses_count_half_after_the_half_life() -> None:
    fx = Recorder({"a": 1024 * MB}, 2048 * MB)
    s = Scheduler(fx, SchedPolicy(min_residency_seconds=0))
    for i in range(4):  # four uses at t=0
        s.submit(Waiter(request("a"), 0.0, f"a{i}"))
        if i == 0:
            ready(s, fx, "a", 1.0)
        s.finished("a")
    fx.t = 2 * USE_HALF_LIFE  # two half-lives later the four count as one; with this use, two
    s.submit(Waiter(request("a"), fx.t, "late"))
    per_byte = 1.0 * GiB / (1024 * MB)
    assert s.uses["a"] == (pytest.approx(2.0), fx.t)
    assert s.seats["a"].priority == pytest.approx(s.inflation + 2.0 * per_byte)


# -- properties ------------------------------------------------------------------------------------

arrivals = st.lists(st.tuples(st.sampled_from("ab"), st.floats(0, 60, allow_nan=False)), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals=arrivals, load=st.floats(0.2, 3.0), service=st.floats(0.01, 1.0), min_res=st.floats(0, 1.0),
       eviction=st.sampled_from(["cost", "lru"]))
def test_no_request_waits_past_the_bound_plus_one_swap(arrivals, load, service, min_res, eviction) -> None:
    """Two models that cannot be co-resident, random arrivals: nothing is lost, the budget always holds, and
    no request waits longer than the starvation bound plus one swap (drain, release, load)."""
    release = 0.05
    policy = SchedPolicy(max_wait_seconds=10, max_turn_seconds=30, min_residency_seconds=min_res,
                         queue_timeout_seconds=10_000, eviction=eviction)  # type: ignore[arg-type]
    w = World({"a": 100 * MB, "b": 100 * MB}, budget_bytes=150 * MB, load_s={"a": load, "b": load}, release_s=release,
              service_s=lambda _k: service, policy=policy, eviction=eviction)
    stopped_while_owed: list[str] = []

    def on_stop(world: World, key: str, event: str) -> None:
        slot = world.sched.seats[key]
        if event == "evict" and slot.in_flight:
            stopped_while_owed.append(f"{key} evicted with {slot.in_flight} in flight")

    w.on_stop = on_stop
    for i, (k, t) in enumerate(sorted(arrivals, key=lambda x: x[1])):
        w.submit(f"r{i}", k, t)
    w.run()
    assert not stopped_while_owed
    assert all(r.done is not None and r.rejected is None for r in w.requests.values())
    assert w.peak_over <= 0
    depth = seat_room(1, policy.engine_queue_depth)  # one running on the slot, the rest waiting in the engine
    swap = depth * service + release + load
    bound = max(policy.max_wait_seconds, swap + min_res) + swap
    # a request also waits for the requests of its own model ahead of it on the seat's one slot: that is service,
    # not scheduling, and the bound is about the other model
    for r in w.requests.values():
        ahead = sum(1 for o in w.requests.values() if o.key == r.key and o.arrived <= r.arrived and o is not r)
        assert r.handed - r.arrived <= bound + ahead * service + 1e-6, (r.rid, r.handed - r.arrived, bound, ahead)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_clients=st.integers(2, 8), rounds=st.integers(1, 4), load=st.floats(0.2, 2.0), service=st.floats(0.01, 0.3))
def test_closed_loop_clients_round_robin_do_not_thrash(n_clients, rounds, load, service) -> None:
    """The issue's scenario on a fake clock: clients cycle over two large models and a small one; swaps stay
    a few per starvation-bound period and every request is answered."""
    sizes = {"big1": 150 * MB, "big2": 150 * MB, "small": 10 * MB}
    policy = SchedPolicy(max_wait_seconds=10, max_turn_seconds=30, min_residency_seconds=1)
    w = World(sizes, budget_bytes=200 * MB, load_s={k: load for k in sizes}, service_s=lambda _k: service, policy=policy)
    keys = ["big1", "big2", "small"]
    for c in range(n_clients):
        w.client(f"c{c}", [keys[(c + i) % 3] for i in range(3 * rounds)])
    w.run()
    assert all(r.done is not None for r in w.requests.values()) and len(w.requests) == n_clients * 3 * rounds
    assert w.peak_over <= 0
    big_loads = [k for k in w.loads() if k.startswith("big")]
    periods = max(1.0, w.t / policy.max_wait_seconds)
    assert len(big_loads) <= 2 * periods + 2, (big_loads, w.t)


def test_a_crashed_seat_serves_nothing_more_and_leaves_as_crashed() -> None:
    from fitevict.schedule.seats import Exit

    s, fx = sched({"a": 100 * MB}, 150 * MB)
    s.submit(Waiter(request("a"), 0.0, "a0"))
    record = s.table.get("a")
    ready(s, fx, "a")
    assert fx.kinds("dispatch") == [("dispatch", "a0", "a")]
    assert s.ending("a") is False  # its process exited on its own while a0 was in flight: a crash
    assert s.seats["a"].status is SeatStatus.STOPPING and not fx.kinds("stop")
    fx.calls.clear()
    s.submit(Waiter(request("a"), 0.0, "a1"))  # it waits for the crash's stop, never for the dead seat
    assert fx.kinds("dispatch") == [] and fx.kinds("start") == [] and s.waiting("a") == 1
    s.stopped("a", Exit.CRASHED)
    assert record is not None and record.status is SeatStatus.GONE and record.exit is Exit.CRASHED
    assert fx.kinds("start") == [("start", "a")]  # the next request loads it again


def test_a_draining_seat_that_dies_ends_as_the_eviction_it_drained_for() -> None:
    """Its turn over for b, a dies with a0 in flight: its end is the eviction for b (not a crash), and b gets its
    memory."""
    from fitevict.schedule.seats import Exit

    s, fx = sched({"a": 100 * MB, "b": 100 * MB}, 150 * MB, max_wait_seconds=5, max_turn_seconds=100,
                  min_residency_seconds=0)
    s.submit(Waiter(request("a"), 0.0, "a0"))
    ready(s, fx, "a")
    record = s.table["a"]
    fx.calls.clear()
    s.submit(Waiter(request("b"), 1.0, "b0"))
    s.submit(Waiter(request("a"), 1.5, "a1"))  # waits behind the swap: not the request a drained for
    fx.t = 6.0
    s.tick()
    assert record.status is SeatStatus.DRAINING and not fx.kinds("stop")
    assert s.ending("a") is True
    assert fx.kinds("stop") == [("stop", "a", "evict", "evicted for b: its turn was over, and b waited for its memory")]
    assert record.status is SeatStatus.STOPPING and record.drained
    s.stopped("a")
    assert record.exit is Exit.STOPPED and fx.kinds("start") == [("start", "b")]
    s.finished("a")  # a0's error comes back after its seat is gone: nothing else moves
    assert len(fx.kinds("stop")) == 1 and len(fx.kinds("start")) == 1


def test_a_seat_that_dies_while_an_unload_waits_for_it_ends_as_that_unload() -> None:
    s, fx = sched({"a": 100 * MB}, 150 * MB)
    s.submit(Waiter(request("a"), 0.0, "a0"))
    ready(s, fx, "a")
    assert s.unload("a", "unloaded on request") and s.seats["a"].status is SeatStatus.DRAINING
    assert not fx.kinds("stop")
    assert s.ending("a") is True
    assert fx.kinds("stop") == [("stop", "a", "unload", "unloaded on request")] and s.table["a"].drained


def test_a_stop_says_whether_the_seat_drained_first() -> None:
    s, fx = sched({"a": 100 * MB}, 150 * MB)
    s.submit(Waiter(request("a"), 0.0, "a0"))
    ready(s, fx, "a")
    s.unload("a", "unloaded on request")
    s.finished("a")  # its drain ends: the unload begins
    assert fx.kinds("stop")[0][1:3] == ("a", "unload") and s.table["a"].drained
    s.stopped("a")
    s.submit(Waiter(request("a"), 0.0, "a1", hold=False))
    ready(s, fx, "a")
    assert s.relieve("a", "memory pressure") and not s.table["a"].drained  # stopped while ready
