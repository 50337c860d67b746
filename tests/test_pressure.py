"""The memory-pressure rule (fitevict.pressure): when a device is under pressure, with hysteresis, and which idle
seats give memory back, cheapest first; and the scheduler's side (only idle seats are stopped, and a request that
waits through the pressure is placed at the first reading that finds room for it)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fitevict.budget import Budget
from fitevict.config import Config
from fitevict.pressure import Idle, assess, outgrowth, strained
from fitevict.pricing.footprint import HOST
from fitevict.schedule.scheduler import SchedPolicy, Scheduler, Waiter
from fitevict.supervisor.pressure_watch import PressureWatch
from fitevict.units import GiB, MiB

from tests.schedule.schedsim import Recorder, request

MARGIN = {HOST: 256 * MiB}


def host(free: int, held: int = 0, reserve: int = 1 * GiB) -> Budget:
    return Budget.declared({HOST: {"total": 16 * GiB, "free": free, "reserve": reserve, "held": held}})


def idle(key: str, mib: int, priority: float = 1.0, last_used: float = 0.0) -> Idle:
    return Idle(key, {HOST: mib * MiB}, priority, last_used)


def test_calm_above_the_reserve_and_nothing_stops() -> None:
    r = assess(host(2 * GiB), MARGIN, frozenset(), [idle("a", 500)], "cost")
    assert r.under == frozenset() and r.victims == () and "no memory pressure" in r.reason()


def test_below_the_reserve_stops_cheapest_idle_until_reserve_plus_margin() -> None:
    # free 700 MiB, reserve 1 GiB, margin 256 MiB: 580 MiB to free
    seats = [idle("dear", 400, priority=9.0), idle("cheap", 300, priority=1.0), idle("mid", 300, priority=5.0)]
    r = assess(host(700 * MiB, held=1000 * MiB), MARGIN, frozenset(), seats, "cost")
    assert r.under == {HOST}
    assert [v.key for v in r.victims] == ["cheap", "mid"]
    assert r.strain(HOST).need == 1024 * MiB + 256 * MiB - 700 * MiB
    assert r.short == {}


def test_lru_orders_by_last_use() -> None:
    seats = [idle("old", 300, priority=9.0, last_used=1.0), idle("new", 300, priority=1.0, last_used=5.0)]
    r = assess(host(1000 * MiB), MARGIN, frozenset(), seats, "lru")
    assert [v.key for v in r.victims] == ["old"]


def test_hysteresis_enter_below_reserve_leave_at_reserve_plus_margin() -> None:
    edge = 1 * GiB + 100 * MiB  # above the reserve, below reserve + margin
    assert assess(host(edge), MARGIN, frozenset(), [], "cost").under == frozenset()  # calm stays calm
    r = assess(host(edge), MARGIN, frozenset({HOST}), [idle("a", 500)], "cost")
    assert r.under == {HOST} and [v.key for v in r.victims] == ["a"]  # pressure stays until reserve + margin
    assert assess(host(1 * GiB + 256 * MiB), MARGIN, frozenset({HOST}), [], "cost").under == frozenset()


def test_bytes_already_stopping_count_and_nothing_more_goes() -> None:
    r = assess(host(900 * MiB), MARGIN, frozenset(), [idle("a", 500)], "cost", pending={HOST: 400 * MiB})
    assert r.under == {HOST} and r.victims == ()


def test_short_when_nothing_idle_is_left() -> None:
    r = assess(host(500 * MiB), MARGIN, frozenset(), [idle("a", 100)], "cost")
    assert [v.key for v in r.victims] == ["a"]
    assert r.short == {HOST: 1024 * MiB + 256 * MiB - 500 * MiB - 100 * MiB}
    assert "nothing idle left" in r.reason()


def test_a_seat_holding_nothing_on_the_device_in_need_is_not_stopped() -> None:
    b = Budget.declared({HOST: {"total": 16 * GiB, "free": 8 * GiB, "reserve": 1 * GiB},
                         "CUDA0": {"total": 24 * GiB, "free": 100 * MiB, "reserve": 512 * MiB}})
    gpu = Idle("gpu", {"CUDA0": 2 * GiB}, 5.0, 0.0)
    r = assess(b, {HOST: 256 * MiB, "CUDA0": 256 * MiB}, frozenset(), [idle("ram", 900, 1.0), gpu], "cost")
    assert r.under == {"CUDA0"} and [v.key for v in r.victims] == ["gpu"]


def test_planning_budget_raises_the_reserve_only_under_pressure() -> None:
    b = host(900 * MiB, held=2 * GiB)
    assert b.device(HOST).budget_bytes > 256 * MiB
    assert strained(b, frozenset(), MARGIN) is b
    s = strained(b, frozenset({HOST}), MARGIN).device(HOST)
    assert s.reserve.bytes == 1 * GiB + 256 * MiB and "pressure_margin" in s.reserve.source
    assert s.budget_bytes == b.device(HOST).budget_bytes - 256 * MiB


@given(free=st.integers(0, 4 * 1024), sizes=st.lists(st.integers(1, 2048), max_size=8), under=st.booleans())
def test_victims_are_enough_or_all_and_never_more_than_needed(free: int, sizes: list[int], under: bool) -> None:
    seats = [idle(f"s{i}", n, priority=float(i)) for i, n in enumerate(sizes)]
    r = assess(host(free * MiB), MARGIN, frozenset({HOST}) if under else frozenset(), seats, "cost")
    need = r.strain(HOST).need
    got = sum(v.bytes[HOST] for v in r.victims)
    if r.short:
        assert len(r.victims) == len(seats) and got < need
    else:
        assert got >= need
        if r.victims:  # the last victim was needed: without it the need was not met
            assert got - r.victims[-1].bytes[HOST] < need


def test_the_scheduler_stops_only_idle_seats() -> None:
    fx = Recorder({"busy": 100 * MiB, "idle": 100 * MiB, "pinned": 100 * MiB}, 1 * GiB)
    s = Scheduler(fx, SchedPolicy(min_residency_seconds=0))
    for key in ("busy", "idle", "pinned"):
        s.submit(Waiter(request(key, pinned=key == "pinned"), fx.t, key))
        s.loaded(key, bytes={HOST: 100 * MiB}, bytes_source="measured", load_seconds=1.0)
    s.finished("idle")
    s.finished("pinned")
    assert sorted(x.key for x in s.idle()) == ["idle"]
    assert not s.relieve("busy", "pressure") and not s.relieve("pinned", "pressure")
    assert s.relieve("idle", "memory pressure") and not s.relieve("idle", "again")
    assert [c[1:4] for c in fx.kinds("stop")] == [("idle", "evict", "memory pressure")]


# -- a seat outgrowing its price ------------------------------------------------------------------------------------


def test_a_reading_outgrows_its_price_only_beyond_the_bound() -> None:
    assert outgrowth(HOST, 100 * MiB + 16 * MiB, 100 * MiB, 16 * MiB) is None  # at the bound: noise, not growth
    assert outgrowth(HOST, None, 100 * MiB, 16 * MiB) is None  # no reading: nothing said
    o = outgrowth(HOST, 150 * MiB, 100 * MiB, 16 * MiB, base=90 * MiB, seconds=6.0)
    assert o is not None and o.over == 50 * MiB and o.rate == 10 * MiB
    assert "50.0 MiB over (bound 16.0 MiB, budget.outgrow_margin)" in o.reason("m") and "10.0 MiB/s" in o.reason("m")
    assert o.to_json()["growth_bytes_per_second"] == 10 * MiB
    assert outgrowth(HOST, 150 * MiB, 100 * MiB, 16 * MiB).rate is None  # without the load's reading: no rate


def test_an_outgrowing_idle_seat_is_stopped_before_every_healthy_one() -> None:
    for eviction in ("cost", "lru"):
        seats = [idle("healthy", 300, priority=1.0, last_used=1.0),
                 Idle("leaky", {HOST: 300 * MiB}, 9.0, 50.0, outgrowing=True)]
        r = assess(host(1000 * MiB), MARGIN, frozenset(), seats, eviction)
        assert [v.key for v in r.victims] == ["leaky"], eviction  # the cheapest, oldest healthy one stays
        assert "stopping idle leaky (outgrowing its price)" in r.reason()


class _Grown:
    """A seat's process as its record reads it (``Holds``): what it holds now, and whether it outgrew its price."""

    def __init__(self, n: int, outgrowing: bool) -> None:
        self.n, self.outgrowing = n, outgrowing

    def held(self) -> tuple[dict[str, int], str]:
        return {HOST: self.n}, "measured"


def test_the_planner_evicts_an_outgrowing_seat_first_and_counts_what_it_holds_now() -> None:
    fx = Recorder({"healthy": 300 * MiB, "leaky": 300 * MiB, "new": 300 * MiB}, 1 * GiB)
    s = Scheduler(fx, SchedPolicy(min_residency_seconds=0, eviction="lru"))
    for key in ("healthy", "leaky"):
        fx.t += 1.0
        s.submit(Waiter(request(key), fx.t, key))
        s.loaded(key, bytes={HOST: 300 * MiB}, bytes_source="measured", load_seconds=1.0)
        s.finished(key)
    s.table.attach(s.table["healthy"], _Grown(300 * MiB, False))
    s.table.attach(s.table["leaky"], _Grown(450 * MiB, True))  # grew 150 MiB past its price since its load
    assert [r.outgrowing for r in s.residents(fx.t)] == [False, True]
    fx.t += 1.0
    s.submit(Waiter(request("new"), fx.t, "new"))  # 750 MiB held + 300 MiB > 1 GiB: one must go
    stops = fx.kinds("stop")
    assert [c[1] for c in stops] == ["leaky"], fx.calls  # not "healthy", though it is the least recently used
    assert "outgrowing its price" in stops[0][3]


# -- loads resume once memory comes back --------------------------------------------------------------------------


class _Strained(Recorder):
    """The recording fake, planning over the machine as the watch strains it (``PressureWatch.planning_budget``)."""

    def __init__(self, watch: PressureWatch, sizes: dict[str, int]) -> None:
        super().__init__(sizes, 16 * GiB)
        self.watch, self.machine = watch, host(16 * GiB)

    def budget(self) -> Budget:
        return self.watch.planning_budget(self.machine)


def test_a_request_waiting_through_pressure_is_placed_at_the_first_reading_with_room_for_it() -> None:
    watch = PressureWatch(Config())
    fx = _Strained(watch, {"busy": 1 * GiB, "next": 600 * MiB})
    s = Scheduler(fx, SchedPolicy(min_residency_seconds=0, max_wait_seconds=10.0, max_turn_seconds=60.0))
    s.submit(Waiter(request("busy"), fx.t, "busy"))
    s.loaded("busy", bytes={HOST: 1 * GiB}, bytes_source="measured", load_seconds=1.0)  # in flight from here on
    calls, wake = list(fx.calls), fx.wake

    def reading(t: float, free: int) -> None:  # one sampler reading: the pressure rule, then what waits is replanned
        fx.t, fx.machine = t, host(free, held=1 * GiB)
        watch.observe(assess(fx.machine, watch.margins(fx.machine), watch.under, [], "cost"), t)
        s.remeasured()

    reading(1.0, 900 * MiB)  # another program took memory: under pressure; nothing waits, so nothing is planned
    assert watch.under == {HOST} and fx.calls == calls and fx.wake == wake
    fx.t = 2.0
    s.submit(Waiter(request("next"), fx.t, "next"))  # 900 MiB free, 1 GiB reserve: it fits once "busy" goes
    assert fx.kinds("start") == [("start", "busy")] and fx.wake == 2.0 + 10.0, fx.calls
    reading(3.0, 1 * GiB + 300 * MiB)  # it exits: calm (above reserve + margin), yet 300 MiB is no room for 600
    assert watch.under == frozenset() and fx.kinds("start") == [("start", "busy")], fx.calls
    reading(4.0, 3 * GiB)  # the rest of its memory came back: placed at this reading, not at its wake-up (12 s)
    assert fx.kinds("start") == [("start", "busy"), ("start", "next")], fx.calls
    assert fx.kinds("stop") == []  # "busy" serves on: "next" fits beside it
