"""The supervisor's parts, named: what the live effects, the pressure watch, the orphan cleanup and the views work
with, instead of the supervisor itself. Each part is built once by the ``Supervisor`` and shared:

    clock       the one clock (scheduling, health, stall, release timing)
    config      the server's configuration
    catalog     the models it can name
    store       the one store (its writer thread)
    prices      the price book: prices, stored measurements, dry runs
    table       the seat table: every seat's one record and state (``schedule.seats``)
    seats       the seats whose process runs, as those processes, by key (the table's read-only view)
    history     events written and waited for
    processes   which engine runs an entry, its argv, port and log
    planning    the budget now and the request's prices, read ahead (the scheduler's two readings)
    desk        the waiting requests' futures, stop waiters, shrink decisions, whether it takes work
    kv          the prompt cache kept across swaps
    pressure    memory pressure from other programs
    nvml        the NVML reader (None: the real one when a driver exists; tests pass a fake)
    meters      the device readers by kind (host.devmem), over the engine's census of its devices
    tasks       background work (stops, records) that shutdown waits for
    scheduler   the pure scheduler, bound once it exists (it is built over the effects that use these ports)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fitevict.budget import Budget
from fitevict.config import Config
from fitevict.host.devmem import DeviceMeters
from fitevict.request.catalog import Catalog
from fitevict.schedule.scheduler import Scheduler
from fitevict.schedule.seats import SeatTable
from fitevict.store import Store
from fitevict.store.records import Event
from fitevict.supervisor.desk import Desk
from fitevict.supervisor.history import History
from fitevict.supervisor.kvkeep import PromptKeep
from fitevict.supervisor.pressure_watch import PressureWatch
from fitevict.supervisor.planning import Planning
from fitevict.prices.book import PriceBook
from fitevict.seat.processes import Processes
from fitevict.seat.running import SeatState


@dataclass(eq=False, slots=True)
class Ports:
    clock: Callable[[], float]
    config: Config
    catalog: Catalog
    store: Store
    prices: PriceBook
    table: SeatTable
    seats: Mapping[str, SeatState]
    history: History
    processes: Processes
    planning: Planning
    desk: Desk
    kv: PromptKeep
    pressure: PressureWatch
    nvml: Any
    meters: DeviceMeters
    tasks: set[asyncio.Task] = field(default_factory=set)
    scheduler: Scheduler = field(init=False)

    def spawn(self, coro: Any, name: str, on_done: Callable[[asyncio.Task], None] | None = None) -> asyncio.Task:
        """Run ``coro`` as background work that shutdown waits for."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if on_done is not None:
            task.add_done_callback(on_done)
        return task

    # what the load reports read (supervisor/loadreport.py)
    @property
    def recent_events(self) -> tuple[Event, ...]:
        return self.history.recent

    @property
    def last_budget(self) -> Budget | None:
        return self.planning.last_budget
