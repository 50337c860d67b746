"""One victim order: a load's evictions (``planner.victims.choose``) and pressure relief (``pressure.assess``) take
seats in the order of one registered policy object (``planner.eviction``)."""

from __future__ import annotations

import pytest

from fitevict.budget import Budget, DeviceBudget, Figure
from fitevict.config import EVICTION_POLICIES
from fitevict.planner.eviction import POLICIES, eviction_policy
from fitevict.planner.records import Resident
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.planner.victims import choose
from fitevict.pressure import Idle, assess

MiB = 1024 ** 2
# (key, MiB held, GreedyDual-Size priority, last used): near and far in priority, old and new in use
SEATS = [("a", 300, 1.0, 9.0), ("b", 300, 1.1, 2.0), ("c", 500, 1.1, 2.0), ("d", 300, 9.0, 1.0), ("e", 300, 5.0, 3.0)]


def _residents() -> list[Resident]:
    return [Resident(key=k, config=LoadConfig(), bytes={"CPU": n * MiB}, priority=p, last_used=t)
            for k, n, p, t in SEATS]


def _idle() -> list[Idle]:
    return [Idle(k, {"CPU": n * MiB}, p, t) for k, n, p, t in SEATS]


def _pressed(need: int) -> Budget:
    total = 10_000 * MiB
    free = 1_000 * MiB - need  # the reserve is 1000 MiB: ``need`` short of it
    return Budget((DeviceBudget("CPU", total=Figure(total, "t"), free=Figure(free, "t"),
                                reserve=Figure(1_000 * MiB, "t")),))


def test_the_config_names_the_registered_policies() -> None:
    assert tuple(POLICIES) == EVICTION_POLICIES
    with pytest.raises(ValueError, match="not one of cost, lru"):
        eviction_policy("fifo")


@pytest.mark.parametrize("name", EVICTION_POLICIES)
def test_pressure_relief_and_a_loads_evictions_take_seats_in_one_order(name: str) -> None:
    order = [r.key for r in eviction_policy(name).order(_residents(), {"CPU"})]
    # the whole order, as a load short of every byte takes it, and as relief short of every byte stops seats
    evicted = [r.key for r in choose({"CPU": 10**12}, _residents(), name)]
    relief = assess(_pressed(1_000 * MiB - 1), {"CPU": 10**12}, frozenset(), _idle(), name)
    assert evicted == order
    assert [v.key for v in relief.victims] == order
    # the first victim when one seat is enough: the same for both
    assert choose({"CPU": 100 * MiB}, _residents(), name)[0].key == order[0]
    assert assess(_pressed(100 * MiB), {"CPU": 0}, frozenset(), _idle(), name).victims[0].key == order[0]


def test_the_orders_follow_each_policys_rule() -> None:
    # cost: bands of priority (a, b and c within 25% of 1.0), recency within a band, then the most bytes on the
    # short devices (c before b); lru: recency, then the most bytes
    assert [c.key for c in POLICIES["cost"].order(_residents(), {"CPU"})] == ["c", "b", "a", "e", "d"]
    assert [c.key for c in POLICIES["lru"].order(_residents(), {"CPU"})] == ["d", "c", "b", "e", "a"]
    outgrowing = [*_residents()[:4], Resident(key="e", config=LoadConfig(), bytes={"CPU": MiB}, priority=5.0,
                                              last_used=3.0, outgrowing=True)]
    assert all(p.order(outgrowing, {"CPU"})[0].key == "e" for p in POLICIES.values())  # before every healthy one
