"""What a placement is planned against, the scheduler's two readings: the budget as the machine stands now (under
memory pressure, with the margin; ``Effects.budget``) and the prices of the request's file, read before the request
is queued (``Supervisor._wait`` awaits its price sheet), so that planning is computation (``Effects.prices``). The server's plans, its dry runs
and the load reports read the same budget reading, kept as ``last_budget``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fitevict import planner as pl
from fitevict.budget import Budget
from fitevict.config import Config
from fitevict.pricing.footprint import HOST
from fitevict.supervisor.pressure_watch import PressureWatch
from fitevict.prices.book import PriceBook
from fitevict.prices.sheet import PriceSheet
from fitevict.seat.running import SeatState


class Planning:
    def __init__(self, config: Config, prices: PriceBook, pressure: PressureWatch,
                 budget_fn: Callable[[], Budget]) -> None:
        self.config = config
        self.prices = prices
        self.pressure = pressure
        self.budget_fn = budget_fn  # the machine now (host/budget), or a declared budget in tests
        self.last_budget: Budget | None = None  # the reading the last plan was made against

    def path_for(self, request: pl.PlanRequest) -> Path:
        """The file a load of ``request`` reads (``request.ask`` names it in every request it builds)."""
        return Path(request.path)

    def budget(self) -> Budget:
        """The budget as the planner would see it now (a fresh reading; under memory pressure, with the margin)."""
        return self.pressure.planning_budget(self.budget_fn())

    def plan_budget(self) -> Budget:
        """``Effects.budget``: a fresh reading for a plan, kept as ``last_budget`` (the load reports read it)."""
        budget = self.last_budget = self.budget()
        return budget

    def footprints(self, request: pl.PlanRequest) -> pl.FootprintFn:
        """``Effects.prices``: the request's quote (the price sheet it was priced with when queued) while it is
        current, else the sheet the book holds of its file; read ahead either way, so that the plan does no I/O."""
        sheet = self.quote(request) or self.prices.sheet_now(self.path_for(request), request.config)
        return lambda _key, cfg: sheet.footprint(cfg)

    def quote(self, request: pl.PlanRequest) -> PriceSheet | None:
        """The request's quote while it is current: None when it has none, or the book has changed since (a dry run
        landed, a measurement was stored, its file changed), which makes a new version, never a changed one."""
        q = request.quote
        return q if q is not None and self.prices.current(q) else None

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
