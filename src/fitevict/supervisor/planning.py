"""What a placement is planned against: the request's file and load configuration (from the price book), the budget
as the machine stands now (under memory pressure, with the margin), and the planner's policy from the config. The
server's plans, its dry runs and the load reports read the same budget reading, kept as ``last_budget``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from fitevict import planner as pl
from fitevict.budget import Budget
from fitevict.config import Config
from fitevict.pricing.footprint import HOST
from fitevict.request.catalog import Catalog, CatalogEntry
from fitevict.request.contract import Contract
from fitevict.supervisor.learned import plan_policy
from fitevict.supervisor.neighbours import PressureWatch
from fitevict.supervisor.pricebook import PriceBook
from fitevict.supervisor.seat import SeatState


class Planning:
    def __init__(self, config: Config, catalog: Catalog, prices: PriceBook, pressure: PressureWatch,
                 budget_fn: Callable[[], Budget], clock: Callable[[], float]) -> None:
        self.config = config
        self.catalog = catalog
        self.prices = prices
        self.pressure = pressure
        self.budget_fn = budget_fn  # the machine now (host/budget), or a declared budget in tests
        self.clock = clock
        self._paths: dict[pl.PlanRequest, Path] = {}
        self.last_budget: Budget | None = None  # the reading the last plan was made against

    def path_for(self, request: pl.PlanRequest) -> Path:
        return self._paths.get(request) or Path(self.catalog.resolve(request.key).path)

    def request_for(self, entry: CatalogEntry, contract: Contract | None) -> pl.PlanRequest:
        req, _cfg, path = self.prices.request(entry, contract)
        self._paths[req] = path
        self.prices.prefetch(path, req.config)  # its price sheet, read off the event loop before it is planned
        return req

    def exactly(self, request: pl.PlanRequest) -> pl.PlanRequest:
        """``request`` asking for exactly its configuration (no rungs, no context search): a dry run with a contract
        plans what a load for that contract would do."""
        path = self.path_for(request)
        fixed = replace(request, fixed=None)
        self._paths[fixed] = path
        return fixed

    def budget(self) -> Budget:
        """The budget as the planner would see it now (a fresh reading; under memory pressure, with the margin)."""
        return self.pressure.planning_budget(self.budget_fn())

    def plan_now(self, request: pl.PlanRequest, residents: list[pl.Resident]) -> pl.Plan:
        """The planner over a fresh budget reading (what ``Effects.plan`` does)."""
        path = self.path_for(request)
        budget = self.last_budget = self.budget()
        sheet = self.prices.sheet_now(path, request.config)  # prices read ahead: the plan does no I/O
        return pl.plan(request, residents, budget, lambda _k, c: sheet.footprint(c), plan_policy(self.config),
                       self.clock())

    def has_gpu(self) -> bool:
        return self.last_budget is not None and bool(self.last_budget.gpu_names)

    def gpu_figure(self, seat: SeatState) -> int | None:
        """What the seat holds on GPUs; None on a machine without a GPU (not applicable, not 0)."""
        return sum(seat.bytes_on(d) for d in seat.config.devices) if self.has_gpu() else None

    def spilled(self, seat: SeatState) -> int | None:
        """Model weights a load put in host RAM although the machine has a GPU (partial or RAM-only loads): the
        history's ``offloaded`` figure. None on a machine without a GPU: nothing was offloaded."""
        if not self.has_gpu():
            return None
        fp = seat.measured or seat.predicted
        cpu = fp.device(HOST)
        return cpu.model.bytes if cpu is not None else 0
