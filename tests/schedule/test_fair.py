"""Fairness between clients, driven through the recording fake and the fake-clock world: priority classes, a fair
share per key, the per-key caps, and the wait stated up front. No processes, no sleeps."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fitevict.schedule.errors import RateLimited
from fitevict.schedule.fair import Fairness, Share, cuts_short, share_of
from fitevict.schedule.scheduler import SchedPolicy, Scheduler, Waiter
from fitevict.schedule.seats import SeatStatus, seat_room
from fitevict.pricing.footprint import HOST
from tests.schedule.schedsim import Recorder, World, request

MB = 1_000_000
CLASSES = {"interactive": 4.0, "batch": 1.0}
INTER = share_of(CLASSES, "interactive")
BATCH = share_of(CLASSES, "batch")


def sched(sizes: dict[str, int], budget: int, **policy) -> tuple[Scheduler, Recorder]:
    fx = Recorder(sizes, budget)
    return Scheduler(fx, SchedPolicy(**policy)), fx


def ready(s: Scheduler, fx: Recorder, key: str, load_s: float = 1.0) -> None:
    s.loaded(key, bytes={HOST: fx.sizes[key]}, bytes_source="measured", load_seconds=load_s)


def handed(fx: Recorder) -> list[str]:
    return [c[1] for c in fx.kinds("dispatch")]


def test_shares_rank_weigh_and_bound_the_classes() -> None:
    assert (INTER.rank, INTER.weight, INTER.patience) == (0, 4.0, 1.0)
    assert (BATCH.rank, BATCH.weight, BATCH.patience) == (1, 1.0, 4.0)  # waits at most 4x max_wait for a placement
    three = share_of({"bulk": 0.5, "interactive": 4.0, "batch": 1.0}, "bulk", "k", key_weight=2.0)
    assert (three.rank, three.weight, three.patience) == (2, 1.0, 8.0)


def test_an_interactive_request_overtakes_a_batch_flood_within_its_models_turn() -> None:
    s, fx = sched({"a": 100 * MB}, 150 * MB)
    s.submit(Waiter(request("a"), 0.0, "b0", share=BATCH))
    ready(s, fx, "a")  # one slot, and one more in the engine's queue for the top class only
    for i in range(1, 8):
        s.submit(Waiter(request("a"), 0.1 * i, f"b{i}", share=BATCH))
    assert handed(fx) == ["b0"]  # one slot: a batch request is handed only a free slot, not the engine's queue
    s.submit(Waiter(request("a"), 1.0, "i0", share=INTER))
    assert handed(fx) == ["b0", "i0"]  # the top class has the engine's queue: it runs once b0 ends, before any b
    s.finished("a")
    assert handed(fx) == ["b0", "i0"]  # i0 took the slot b0 left
    s.finished("a")
    assert handed(fx) == ["b0", "i0", "b1"]


def test_a_flooding_key_delays_another_by_at_most_one_request() -> None:
    s, fx = sched({"a": 100 * MB}, 150 * MB)
    flood = share_of(CLASSES, "interactive", "flood")
    light = share_of(CLASSES, "interactive", "light")
    for i in range(10):
        s.submit(Waiter(request("a"), 0.01 * i, f"f{i}", share=flood))
    ready(s, fx, "a")
    s.submit(Waiter(request("a"), 1.0, "l0", share=light))
    s.finished("a")
    assert handed(fx) == ["f0", "f1", "l0"]  # its tag ties the request in service: the next free slot is its
    s.finished("a")
    assert handed(fx) == ["f0", "f1", "l0", "f2"]


def test_a_higher_class_ends_a_lower_turn_once_it_has_served_a_request() -> None:
    s, fx = sched({"a": 100 * MB, "b": 100 * MB}, 150 * MB, max_wait_seconds=10, min_residency_seconds=0)
    s.submit(Waiter(request("a"), 0.0, "a0", share=BATCH))
    ready(s, fx, "a")  # a's batch turn is handed a0
    s.submit(Waiter(request("b"), 0.5, "b-inter", share=INTER))
    assert s.seats["a"].status is SeatStatus.DRAINING  # the interactive need ends a's turn (not at b's bound, 10.5)
    assert not fx.kinds("stop")  # never mid-request: a0 is still in flight
    s.submit(Waiter(request("a"), 0.6, "a1", share=BATCH))
    assert handed(fx) == ["a0"]  # a drains: it takes nothing new
    s.finished("a")
    assert fx.kinds("stop")[0][1:3] == ("a", "evict")


def test_no_turn_is_cut_before_it_has_served_a_request() -> None:
    w = Waiter(request("b"), 0.0, "b", share=INTER)
    assert not cuts_short(w, 0, None, [Waiter(request("a"), 0.0, "a", share=BATCH)], 0.0, 10.0)
    assert cuts_short(w, 1, 1, [Waiter(request("a"), 0.0, "a", share=BATCH)], 0.0, 10.0)
    assert not cuts_short(w, 1, 0, [], 0.0, 10.0)  # the turn served an interactive request: same class


def test_a_lower_turn_owed_to_its_overdue_requests_is_not_cut() -> None:
    s, fx = sched({"a": 100 * MB, "b": 100 * MB}, 150 * MB, max_wait_seconds=1, min_residency_seconds=0)
    for i in range(3):
        s.submit(Waiter(request("a"), 0.0, f"a{i}", share=BATCH))
    fx.t = 10.0  # a's batch requests have waited past their bound (4 s) when it is ready
    ready(s, fx, "a")
    s.submit(Waiter(request("b"), 10.0, "b-inter", share=INTER))
    assert s.seats["a"].status is SeatStatus.READY  # a2 still waits, overdue: its turn is owed to it


def test_an_equal_class_does_not_cut_a_turn() -> None:
    s, fx = sched({"a": 100 * MB, "b": 100 * MB}, 150 * MB, max_wait_seconds=10, max_turn_seconds=100,
                  min_residency_seconds=0)
    s.submit(Waiter(request("a"), 0.0, "a0", share=BATCH))
    ready(s, fx, "a")
    s.submit(Waiter(request("b"), 0.5, "b0", share=BATCH))
    assert s.seats["a"].status is SeatStatus.READY and fx.wake == 0.5 + 4 * 10  # b0's class bound: 40 s


def test_a_key_over_its_queue_cap_is_refused_with_a_retry_after() -> None:
    s, fx = sched({"a": 100 * MB}, 150 * MB)
    capped = Share(client="k", max_in_flight=1, max_queue=1)
    s.submit(Waiter(request("a"), 0.0, "k0", share=capped))  # waits for the load: one waiting, as its key allows
    ready(s, fx, "a", load_s=2.0)
    s.measured.served("a", 3.0)
    s.submit(Waiter(request("a"), 0.1, "k1", share=capped))  # waits for k0: its key allows one in flight
    assert handed(fx) == ["k0"] and s.waiting("a") == 1
    w = Waiter(request("a"), 0.2, "k2", share=capped)
    s.submit(w)
    err = fx.answers[w]
    assert isinstance(err, RateLimited) and err.status == 429 and err.retry_after >= 1
    assert "client 'k'" in str(err) and "max_queue" in str(err) and s.waiting("a") == 1


def test_a_key_at_its_concurrency_cap_waits_and_others_pass() -> None:
    s, fx = sched({"a": 100 * MB}, 150 * MB)
    capped = Share(client="k", max_in_flight=1)
    s.submit(Waiter(request("a", parallel=4), 0.0, "k0", share=capped))
    ready(s, fx, "a")
    s.submit(Waiter(request("a", parallel=4), 0.1, "k1", share=capped))
    s.submit(Waiter(request("a", parallel=4), 0.2, "o0", share=Share(client="other")))
    assert handed(fx) == ["k0", "o0"] and s.waiting("a") == 1
    k0 = next(w for w in fx.answers if w.request_id == "k0")
    s.finished("a", k0)
    assert handed(fx) == ["k0", "o0", "k1"]


def test_the_estimate_counts_position_loads_and_service() -> None:
    s, fx = sched({"a": 100 * MB, "b": 100 * MB}, 150 * MB, max_wait_seconds=10, min_residency_seconds=0)
    s.submit(Waiter(request("a"), 0.0, "a0"))
    ready(s, fx, "a", load_s=2.0)
    s.measured.served("a", 1.0)
    queued = [Waiter(request("a"), 0.1, f"a{i}") for i in (1, 2, 3)]
    for w in queued:
        s.submit(w)
    # one slot, room 2: a0 and a1 are handed; a2 starts once one of them ends, a3 once two have
    assert [s.estimate(w).seconds for w in queued[1:]] == [1.0, 2.0]
    b = Waiter(request("b"), 0.2, "b0")
    s.submit(b)
    # a's turn (until b's bound, 10.2), one more of its queue, its two in flight on one slot, its release (never
    # measured: 0), then b's own load (never measured: the median of the loads here, a's 2 s)
    e = s.estimate(b)
    assert e.placements == 1 and math.isclose(e.seconds, 10.2 + 1.0 + 2 * 1.0 + 0.0 + 2.0, abs_tol=1e-9)
    assert any("median" in src for src in e.sources) and any("release a unavailable" in src for src in e.sources)


# -- properties ------------------------------------------------------------------------------------------------

arrivals = st.lists(st.tuples(st.sampled_from("ab"), st.floats(0, 60, allow_nan=False),
                              st.sampled_from(["interactive", "batch"]), st.sampled_from(["k1", "k2", "k3"])),
                    min_size=1, max_size=40)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals=arrivals, load=st.floats(0.2, 3.0), service=st.floats(0.01, 1.0), min_res=st.floats(0, 1.0))
def test_no_class_waits_past_its_bound_and_no_turn_is_cut_mid_request(arrivals, load, service, min_res) -> None:
    """Two models that cannot be co-resident, random arrivals of two classes and three keys: nothing is lost, the
    budget holds, no seat is stopped with a request in flight or before its turn served one, and no request waits
    past its class's bound, ``max(patience x max_wait, swap + min_residency) + swap``, beyond the service of the
    requests of its own model handed while it waited."""
    release = 0.05
    policy = SchedPolicy(max_wait_seconds=10, max_turn_seconds=30, min_residency_seconds=min_res,
                         queue_timeout_seconds=10_000)
    w = World({"a": 100 * MB, "b": 100 * MB}, budget_bytes=150 * MB, load_s={"a": load, "b": load},
              release_s=release, service_s=lambda _k: service, policy=policy)
    wrong: list[str] = []

    def on_stop(world: World, key: str, event: str) -> None:
        seat = world.sched.seats[key]
        if event == "evict" and (seat.in_flight or seat.turn_served < 1):
            wrong.append(f"{key} evicted with {seat.in_flight} in flight, {seat.turn_served} served in its turn")

    w.on_stop = on_stop
    for i, (k, t, klass, key) in enumerate(sorted(arrivals, key=lambda x: x[1])):
        w.submit(f"r{i}", k, t, share=share_of(CLASSES, klass, key))
    w.run()
    assert not wrong
    assert all(r.done is not None and r.rejected is None for r in w.requests.values())
    assert w.peak_over <= 0
    swap = seat_room(1, policy.engine_queue_depth) * service + release + load
    for r in w.requests.values():
        bound = max(r.share.patience * policy.max_wait_seconds, swap + min_res) + swap
        ahead = sum(1 for o in w.requests.values() if o.key == r.key and o is not r and r.arrived <= o.handed < r.handed)
        assert r.handed - r.arrived <= bound + (ahead + 1) * service + 1e-6, (r.rid, r.handed - r.arrived, bound)


@settings(max_examples=150, deadline=None)
@given(flows=st.lists(st.tuples(st.sampled_from(["k1", "k2", "k3", "k4"]), st.sampled_from([1.0, 2.0, 8.0])),
                      min_size=1, max_size=60))
def test_a_request_of_an_idle_flow_is_behind_at_most_one_share_of_each_other_flow(flows) -> None:
    """Start-time fair queueing, alone: a request of a flow with nothing waiting goes after at most one waiting
    request of each other flow per share of its own (``w_g / w_f + 1`` when its flow was just served, 1 when it was
    not), whatever their backlog."""
    fair = Fairness()
    waiting: list[Waiter] = []
    weights = {}
    for i, (client, weight) in enumerate(flows):
        weights.setdefault(client, weight)
        w = Waiter(request("a"), float(i), f"r{i}", share=Share(client=client, weight=weights[client]))
        idle = not any(q.share.client == client for q in waiting)
        fair.stamp(w)
        waiting.append(w)
        if idle:  # of each other flow g, only the requests stamped within w_g x (its tag - V) + 1 of V go first
            v = fair.virtual.get("a", 0.0)
            per_flow: dict[str, int] = {}
            for q in waiting:
                if fair.order(q) < fair.order(w):
                    per_flow[q.share.client] = per_flow.get(q.share.client, 0) + 1
            for g, n in per_flow.items():
                assert n <= weights[g] * (w.tag - v) + 1 + 1e-9, (g, n, w.tag, v)
            assert w.tag - v <= 1 / weights[client] + 1e-9  # at most its own last share behind
        if i % 3 == 2:  # hand one, in fair order
            first = min(waiting, key=fair.order)
            waiting.remove(first)
            fair.handed(first)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(slots=st.integers(1, 3), depth=st.sampled_from([None, 0, 1, 2]), flooders=st.integers(1, 6),
       batch_s=st.floats(0.5, 8.0), inter_s=st.floats(0.01, 1.0), load_a=st.floats(0.2, 3.0),
       load_b=st.floats(0.2, 3.0), min_res=st.floats(0, 1.0),
       chats=st.lists(st.floats(0, 60, allow_nan=False), min_size=1, max_size=12))
def test_a_higher_class_waits_for_at_most_one_lower_request_per_slot_under_a_flood(
        slots, depth, flooders, batch_s, inter_s, load_a, load_b, min_res, chats) -> None:
    """A batch flood on ``a`` (closed-loop clients, as many slots as drawn) and interactive requests on ``b``, which
    cannot be resident with it: an interactive request waits at most for ``b``'s stop (and its requests in flight
    there), ``a``'s load, then the longer of ``a``'s residency guard and one batch request (each slot's), ``a``'s
    release and ``b``'s load: the batch requests in flight bound it, one per slot, whatever the engine's queue
    depth, and never the batch queue behind them."""
    release = 0.05
    policy = SchedPolicy(max_wait_seconds=100, max_turn_seconds=30, min_residency_seconds=min_res,
                         queue_timeout_seconds=10_000, engine_queue_depth=depth)  # batch is never past its bound
    service = {"a": batch_s, "b": inter_s}
    w = World({"a": 100 * MB, "b": 100 * MB}, budget_bytes=150 * MB, load_s={"a": load_a, "b": load_b},
              release_s=release, service_s=lambda k: service[k], policy=policy)
    batch = share_of(CLASSES, "batch", "pipeline")

    def flood(cid: str, i: int, when: float) -> None:
        if when < 60:
            w.submit(f"{cid}-{i}", "a", when, req=request("a", parallel=slots), share=batch,
                     on_done=lambda: flood(cid, i + 1, w.t))

    for c in range(flooders):
        flood(f"f{c}", 0, 0.0)
    for i, t in enumerate(sorted(chats)):
        w.submit(f"chat-{i}", "b", t, share=share_of(CLASSES, "interactive", "chat"))
    w.run()
    assert all(r.done is not None and r.rejected is None for r in w.requests.values())
    guard = max(min(min_res, load_a), batch_s)  # a's turn: its residency, or one batch request on each slot
    bound = inter_s + release + load_a + guard + release + load_b
    for r in w.requests.values():
        if r.key == "b":
            ahead = sum(1 for o in w.requests.values() if o.key == "b" and r.arrived <= o.handed < r.handed)
            assert r.handed - r.arrived <= bound + ahead * inter_s + 1e-6, (r.rid, r.handed - r.arrived, bound)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(slots=st.integers(1, 3), depth=st.sampled_from([None, 0, 1]), heavy=st.integers(1, 8),
       service=st.floats(0.1, 3.0), thinks=st.lists(st.floats(0, 5.0), min_size=1, max_size=8),
       lights=st.integers(1, 2))
def test_a_flooding_key_is_handed_at_most_two_requests_while_a_light_key_waits(
        slots, depth, heavy, service, thinks, lights) -> None:
    """One key floods a model with closed-loop clients, one or two light keys send one request at a time (random
    pauses): while a light request waits, the door hands the heavy key at most ``w_heavy / w_light + 1`` = 2 of its
    requests (the second only when the light key was served just before), whatever the heavy key's backlog, the
    seat's slots and the engine's queue depth: a key that floods delays another by its share, not its backlog."""
    policy = SchedPolicy(engine_queue_depth=depth, queue_timeout_seconds=10_000)
    w = World({"a": 100 * MB}, budget_bytes=150 * MB, load_s={"a": 0.5}, service_s=lambda _k: service, policy=policy)
    order: list[str] = []  # request ids, in the order the scheduler handed them
    at_submit: dict[str, int] = {}
    dispatch, submit = w.dispatch, w.sched.submit

    def recorded_dispatch(waiter: Waiter, key: str) -> None:
        order.append(waiter.request_id)
        dispatch(waiter, key)

    def recorded_submit(waiter: Waiter) -> None:
        at_submit[waiter.request_id] = len(order)
        submit(waiter)

    w.dispatch, w.sched.submit = recorded_dispatch, recorded_submit  # type: ignore[method-assign]
    flood = share_of(CLASSES, "interactive", "heavy")

    def flooder(cid: str, i: int, when: float) -> None:
        if when < 30:
            w.submit(f"{cid}-{i}", "a", when, req=request("a", parallel=slots), share=flood,
                     on_done=lambda: flooder(cid, i + 1, w.t))

    def light(cid: str, i: int, when: float) -> None:
        if i < len(thinks):
            w.submit(f"{cid}-{i}", "a", when, req=request("a", parallel=slots),
                     share=share_of(CLASSES, "interactive", cid), on_done=lambda: light(cid, i + 1, w.t + thinks[i]))

    for c in range(heavy):
        flooder(f"heavy{c}", 0, 0.0)
    for c in range(lights):
        light(f"light{c}", 0, 1.0 + c * 0.3)
    w.run()
    assert all(r.done is not None and r.rejected is None for r in w.requests.values())
    for rid in (r for r in order if r.startswith("light")):
        overtook = [o for o in order[at_submit[rid]:order.index(rid)] if o.startswith("heavy")]
        assert len(overtook) <= 2, (rid, overtook)
