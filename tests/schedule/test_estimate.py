"""The wait stated up front (``schedule.estimate``) and its measured inputs (``schedule.measured``): properties of the
rule, and the scheduler's readings of loads, stops and requests on seats. The recording fake, a fake clock."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from fitevict.pricing.footprint import HOST
from fitevict.schedule.estimate import ends, handed_at
from fitevict.schedule.fair import share_of
from fitevict.schedule.measured import Measured
from fitevict.schedule.scheduler import SchedPolicy, Scheduler, Waiter
from tests.schedule.schedsim import Recorder, request

MB = 1_000_000
seconds = st.floats(0, 30, allow_nan=False)


def sched(sizes: dict[str, int], budget: int, **policy) -> tuple[Scheduler, Recorder]:
    fx = Recorder(sizes, budget)
    return Scheduler(fx, SchedPolicy(**policy)), fx


@settings(max_examples=200, deadline=None)
@given(slots=st.integers(1, 8), depth=st.integers(0, 8), running=st.lists(seconds, max_size=12),
       ahead=st.lists(seconds, max_size=12), extra=seconds, at=st.integers(0, 12))
def test_one_more_request_ahead_never_shortens_the_wait(slots, depth, running, ahead, extra, at) -> None:
    room = slots + depth
    running = running[:room]  # the door hands at most its room
    more = [*ahead[:at], extra, *ahead[at:]]
    assert handed_at(slots, room, running, more) >= handed_at(slots, room, running, ahead)


@settings(max_examples=200, deadline=None)
@given(slots=st.integers(1, 8), running=st.lists(seconds, max_size=8), ahead=st.lists(seconds, max_size=8),
       i=st.integers(0, 15), longer=st.floats(0, 30, allow_nan=False))
def test_a_longer_request_ahead_never_shortens_the_wait(slots, running, ahead, i, longer) -> None:
    both = [*running, *ahead]
    if not both:
        return
    j = i % len(both)
    grown = both[:j] + [both[j] + longer] + both[j + 1:]
    room = slots
    k = len(running)
    assert handed_at(slots, room, grown[:k], grown[k:]) >= handed_at(slots, room, running, ahead)


@given(slots=st.integers(1, 8), depth=st.integers(0, 8), n=st.integers(0, 16), service=st.floats(0.01, 30))
def test_there_is_no_wait_while_the_seat_has_room(slots, depth, n, service) -> None:
    running = [service] * n
    wait = handed_at(slots, slots + depth, running, [])
    assert (wait == 0.0) == (n < slots + depth)


def test_requests_end_in_slot_order() -> None:
    assert ends(2, [3.0, 1.0, 1.0, 1.0]) == [1.0, 2.0, 3.0, 3.0]  # the second slot takes three in turn
    assert handed_at(1, 2, [1.0, 1.0], [1.0]) == 2.0  # one slot, one queued in the engine, one ahead: two ends


@settings(max_examples=200, deadline=None)
@given(rate=st.floats(1, 500), measured_at=st.integers(1, 8), tokens=st.integers(1, 2000),
       busy=st.lists(st.integers(1, 24), min_size=2, max_size=2))
def test_a_seat_shares_its_rate_among_its_busy_slots(rate, measured_at, tokens, busy) -> None:
    m = Measured()
    m.served("a", tokens / rate, tokens, measured_at)  # one request at ``rate`` tokens/s with measured_at busy
    lo, hi = sorted(busy)
    assert m.service_of("a", tokens, lo)[0] <= m.service_of("a", tokens, hi)[0]
    # the aggregate rate is kept: tokens / seconds x busy is the same at every concurrency
    assert math.isclose(tokens / m.service_of("a", tokens, hi)[0] * hi, rate * measured_at, rel_tol=1e-9)


def test_a_request_without_max_tokens_takes_its_models_typical_generation() -> None:
    m = Measured()
    assert m.tokens_of("a", Waiter(request("a"), 0.0)) is None
    m.served("a", 1.0, 100, 1)
    m.served("a", 1.0, 200, 1)
    assert m.tokens_of("a", Waiter(request("a"), 0.0)) == 130  # 100, then 30 % of 200
    assert m.tokens_of("a", Waiter(request("a"), 0.0, max_tokens=16)) == 16


def test_the_estimate_grows_with_position_and_the_tokens_ahead() -> None:
    s, fx = sched({"a": 100 * MB}, 150 * MB)
    s.submit(Waiter(request("a"), 0.0, "a0", max_tokens=100))
    s.loaded("a", bytes={HOST: 100 * MB}, bytes_source="measured", load_seconds=1.0)
    s.measured.served("a", 1.0, 100, 1)  # 100 tokens/s on its one slot
    queued = [Waiter(request("a"), 0.0, f"a{i}", max_tokens=100 * i) for i in (1, 2, 3, 4)]
    for w in queued:
        s.submit(w)
    waits = [s.estimate(w).seconds for w in queued[1:]]  # a0 and a1 on the seat (room 2), a2.. waiting
    # at 100 tokens/s: a2 is handed when a0 (100 tokens) ends, a3 when a1 (100) ends, a4 when a2 (200) ends
    assert waits == [1.0, 2.0, 4.0]


def test_the_estimate_counts_the_measured_release_of_the_seat_it_waits_for() -> None:
    s, fx = sched({"a": 100 * MB, "b": 100 * MB}, 150 * MB, max_wait_seconds=10, min_residency_seconds=0)
    s.submit(Waiter(request("a"), 0.0, "a0"))
    s.loaded("a", bytes={HOST: 100 * MB}, bytes_source="measured", load_seconds=1.0)
    s.finished("a")
    b = Waiter(request("b"), 0.0, "b0")
    s.submit(b)  # a is idle: it is stopped for b at once
    assert [c[1] for c in fx.kinds("stop")] == ["a"]
    fx.t = 1.5
    s.stopped("a")  # its stop and release took 1.5 s
    assert s.measured.release["a"] == 1.5
    s.loaded("b", bytes={HOST: 100 * MB}, bytes_source="measured", load_seconds=2.0)
    a = Waiter(request("a"), 1.5, "a1")
    s.submit(a)  # b serves b0 in its turn (until a1's bound): then b's release, then a's load
    e = s.estimate(a)
    assert any("release b 1.50 s: the median of 1 stop(s) measured here" in src for src in e.sources)
    assert math.isclose(e.seconds, (1.5 + 10) - 1.5 + 1.5 + 1.0, abs_tol=1e-9)


def test_the_requests_on_a_seat_are_known_until_they_end() -> None:
    s, fx = sched({"a": 100 * MB}, 150 * MB)
    w = Waiter(request("a"), 0.0, "a0")
    s.submit(w)
    s.loaded("a", bytes={HOST: 100 * MB}, bytes_source="measured", load_seconds=1.0)
    assert list(s.measured.running["a"]) == [w]
    s.finished("a", w)
    assert not s.measured.running["a"]


def test_a_request_queued_in_the_engine_takes_a_slot_when_one_ends() -> None:
    s, fx = sched({"a": 100 * MB}, 150 * MB)  # one slot, room 2
    first, second = Waiter(request("a"), 0.0, "a0"), Waiter(request("a"), 0.0, "a1")
    s.submit(first)
    s.submit(second)
    s.loaded("a", bytes={HOST: 100 * MB}, bytes_source="measured", load_seconds=1.0)
    assert s.measured.slot_since("a", first) == 0.0 and s.measured.slot_since("a", second) is None
    fx.t = 2.5
    s.finished("a", first)
    assert s.measured.slot_since("a", second) == 2.5  # its seconds on a slot count from here, not from its handing


def test_a_higher_class_waits_for_a_lower_loads_first_request_and_its_release() -> None:
    """b (interactive) arrives while a loads for batch requests: a serves one of them (its turn is ended early for
    b once it has, after the longer of that request and its residency), is stopped, then b loads."""
    classes = {"interactive": 4.0, "batch": 1.0}
    s, fx = sched({"a": 100 * MB, "b": 100 * MB}, 150 * MB, max_wait_seconds=10, min_residency_seconds=1.0)
    s.measured.loaded("a", 2.0)
    s.measured.loaded("b", 0.5)
    s.measured.served("a", 3.0)
    s.measured.release["a"] = 0.25
    for i in range(4):
        s.submit(Waiter(request("a"), 0.0, f"a{i}", share=share_of(classes, "batch", "pipeline")))
    assert [c[1] for c in fx.kinds("start")] == ["a"]
    fx.t = 0.5
    b = Waiter(request("b"), 0.5, "b0", share=share_of(classes, "interactive", "chat"))
    s.submit(b)
    # what is left of a's load (1.5 s), one batch request (3 s, longer than a's residency), a's release, b's load
    assert math.isclose(s.estimate(b).seconds, 1.5 + 3.0 + 0.25 + 0.5, abs_tol=1e-9)
    same = Waiter(request("b"), 0.5, "b1", share=share_of(classes, "batch", "other"))
    # of a's class, b1 waits for a's whole queue on its slot (4 rounds, within b1's bound of 40 s)
    assert math.isclose(s.estimate(same, queued=False).seconds, 1.5 + 4 * 3.0 + 0.25 + 0.5, abs_tol=1e-9)
