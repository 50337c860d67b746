"""What a new seat is priced at: the catalog entry and the file a request loads, the prediction the seat starts
with (the request's quote while it is current, else the book's sheet of its file; a GPU placement's engine dry run
first, when the book has none for it), the signature its measurement is stored under, a transformers seat's own
process overhead as priced, and the price again without repacking (``crash``: a load that crashed with it on).

``SeatPrices`` works with three parts: the price book, the catalog and the planning part (the file a request
loads).
"""

from __future__ import annotations

from pathlib import Path

from fitevict.engines import prices_own_process, traits
from fitevict.pricing.footprint import Footprint
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.prices.book import PriceBook
from fitevict.request.ask import passthrough_args
from fitevict.request.catalog import Catalog, CatalogEntry
from fitevict.schedule.scheduler import Waiter
from fitevict.seat.parts import SeatFigures


class SeatPrices:
    def __init__(self, prices: PriceBook, catalog: Catalog, planning: SeatFigures) -> None:
        self.prices, self.catalog, self.planning = prices, catalog, planning

    def asked(self, waiter: Waiter) -> tuple[CatalogEntry, Path]:
        """The entry a waiter's load runs, and the file it reads."""
        return self.catalog.resolve(waiter.key), self.planning.path_for(waiter.request)

    async def predicted(self, waiter: Waiter, entry: CatalogEntry, cfg: LoadConfig, path: Path) -> Footprint:
        """The seat's prediction: the request's quote, unless the book or its file changed since it was quoted (a
        GPU placement's dry run, run first, lands as a new version of the book, never a changed quote)."""
        if cfg.devices and traits(entry.engine).dry_run and not self.prices.has_dry_run(path, cfg):
            await self.prices.dry_run(entry, cfg, path, passthrough_args(entry))  # its compute buffers (cached)
        quote = waiter.request.quote
        if quote is None or not self.prices.holds(quote):
            quote = await self.prices.sheet(path, cfg)
        return quote.footprint(cfg)

    def signature(self, path: Path, cfg: LoadConfig) -> str:
        return self.prices.signature(path, cfg)

    def own_overhead(self, entry: CatalogEntry, cfg: LoadConfig) -> int | None:
        """The process overhead priced into a seat whose family prices its own process (a transformers seat's);
        None for another."""
        return self.prices.torch_overhead_for(cfg.loras) if prices_own_process(entry.engine) else None

    async def without_repack(self, entry: CatalogEntry, path: Path, cfg: LoadConfig) -> Footprint:
        """``path`` loads with ``-nr`` from now on (on this engine build and CPU), priced for ``cfg`` (repack off),
        its compute buffers by the engine's own dry run of that configuration (its graph differs from the repacked
        one's: without it the price falls back to the formula's compute)."""
        self.prices.no_repack(path)
        if traits(entry.engine).dry_run and not self.prices.has_dry_run(path, cfg):
            await self.prices.dry_run(entry, cfg, path, passthrough_args(entry))
        return (await self.prices.sheet(path, cfg)).footprint(cfg)

    def host_buffers(self) -> str:
        """This machine's extra host buffer types (what repacking used)."""
        return self.prices.host.label()

