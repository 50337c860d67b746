"""The door's residents as the planner reads them carry an engine binary's shared pages once: on the first seat
placed of that binary, and on the next oldest once it stops (``Scheduler.residents`` with ``pricing.pages``)."""

from __future__ import annotations

from fitevict.pricing.footprint import HOST
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.pages import SharedPages
from fitevict.schedule.scheduler import Scheduler
from fitevict.schedule.seats import Seat, SeatStatus, SeatTable

S = SeatStatus
MiB = 1024**2
PAGES = SharedPages("llama-server", 12 * MiB, "measured: test figure", ("llama-server",))


class _Process:
    """A seat's process: ``n`` bytes of its own (its readings and buffers), and its shared pages when it carries
    them (``SeatState.held``'s contract)."""

    def __init__(self, n: int) -> None:
        self.n, self.outgrowing = n, False

    def held(self, carried: int = 0) -> tuple[dict[str, int], str]:
        return {HOST: self.n + carried}, "planned"


def door(*placed: tuple[str, float, int]) -> tuple[Scheduler, SeatTable]:
    t = SeatTable()
    for key, since, n in placed:
        s = t.place(Seat(key, LoadConfig(n_ctx=512), key, since, S.READY, ready_at=since, pages=PAGES))
        t.attach(s, _Process(n))
    return Scheduler(None, table=t), t  # type: ignore[arg-type]  # residents() reads the table alone


def held(sched: Scheduler) -> dict[str, tuple[int, int]]:
    return {r.key: (r.bytes[HOST], r.carries) for r in sched.residents(now=10_000.0)}


def test_the_first_seat_placed_carries_the_pages_and_the_others_do_not() -> None:
    sched, _ = door(("b", 20.0, 50 * MiB), ("a", 10.0, 40 * MiB), ("c", 30.0, 60 * MiB))
    assert held(sched) == {"a": (52 * MiB, 12 * MiB), "b": (50 * MiB, 0), "c": (60 * MiB, 0)}
    assert all(r.pages == "llama-server" for r in sched.residents(10_000.0))


def test_when_the_carrier_stops_the_pages_move_to_the_next_oldest_seat() -> None:
    sched, t = door(("a", 10.0, 40 * MiB), ("b", 20.0, 50 * MiB), ("c", 30.0, 60 * MiB))
    t.move(t["a"], S.STOPPING)
    assert held(sched) == {"b": (62 * MiB, 12 * MiB), "c": (60 * MiB, 0)}
    t.move(t["b"], S.STOPPING)
    assert held(sched) == {"c": (72 * MiB, 12 * MiB)}
    total = sum(n for n, _ in held(sched).values())
    assert total == 60 * MiB + PAGES.bytes  # once, whatever the number of seats
