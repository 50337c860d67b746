"""The catalog rescanned while serving: on SIGHUP, and every ``server.rescan_seconds`` when set.

A rescan walks the models directories off the event loop, swaps the catalog's models in place (the front door,
the supervisor and the dashboard all hold the same catalog), and says what changed in the server log. A seat of a
model that disappeared keeps serving until it is unloaded; a new model can be asked for at once. Whoever keeps
something read from the models (the supervisor's price sheets) hears of each rescan through ``on_change``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from fitevict.config import Config, ConfigError
from fitevict.request.catalog import Catalog

log = logging.getLogger("fitevict.catalog")


class CatalogWatch:
    def __init__(self, config: Config, catalog: Catalog) -> None:
        self.config = config
        self.catalog = catalog
        self.rescans = 0
        self.last_error: str | None = None
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None
        self.on_change: list[Callable[[list[str], list[str]], None]] = []  # called with (added, removed) keys

    async def rescan(self) -> tuple[list[str], list[str]]:
        """Walk the models directories again; returns the keys (added, removed). A rescan that fails (a broken
        config entry, say) keeps the catalog as it was and says why."""
        async with self._lock:
            try:
                fresh = await asyncio.to_thread(Catalog.from_config, self.config)
            except (ConfigError, OSError) as e:
                self.last_error = str(e)
                log.error("catalog rescan failed, the catalog is unchanged: %s", e)
                return [], []
            added, removed = self.catalog.replace_with(fresh)
            self.rescans += 1
            self.last_error = None
            log.info("catalog rescanned: %d models; added %s; removed %s", len(self.catalog),
                     ", ".join(added) or "none", ", ".join(removed) or "none")
            for hook in self.on_change:
                hook(added, removed)
            return added, removed

    def start(self) -> None:
        every = self.config.server.rescan_seconds
        if every and self._task is None:
            self._task = asyncio.create_task(self._every(every), name="fitevict-catalog-rescan")

    async def _every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)  # a timer: there is no event for "a file appeared" to await
            await self.rescan()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
