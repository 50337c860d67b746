"""The store's upkeep, while the server runs: at start-up and every ``logs.prune_seconds``, history and load records
beyond ``[logs]`` are pruned (one write, through the single writer), the pages that freed are given back to the disk
(SQLite's incremental vacuum, through the writer too), SQLite's write-ahead log is checkpointed and truncated (the
file shrinks then), and the data folder is measured. What each round did is logged and kept for ``/health``.
Between rounds the history's row bound is held by each recorded event (``Store.history_rows``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fitevict.config import Config
from fitevict.host.datadir import DataDirUsage, data_dir_usage
from fitevict.store.retention import Pruned, RowBounds, checkpoint, compact, op_prune

log = logging.getLogger("fitevict.upkeep")


class Upkeep:
    def __init__(self, store: Any, config: Config, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.last: dict[str, Any] = {}  # the last round: when, what was pruned, the WAL, the data folder
        self.usage: DataDirUsage | None = None
        self._task: asyncio.Task | None = None
        self._stop = asyncio.Event()

    async def round(self) -> dict[str, Any]:
        """One round of upkeep; a step that fails is logged with its reason and the others still run."""
        now = self.clock()
        bounds = self.config.logs
        done: dict[str, Any] = {"at": now}
        try:
            pruned: Pruned = await self.store.awrite(op_prune(
                now, bounds.history_days, bounds.history_rows, RowBounds.of(bounds.records_per_signature,
                                                                            bounds.records_rows)))
        except Exception as e:  # a refused write (full disk, locked database) must not stop the upkeep
            done["pruned"] = f"unavailable, because the store refused the prune: {e}"
            log.warning("store not pruned: %s", e)
        else:
            done["pruned"] = {"events": pruned.events, "measurements": pruned.measurements,
                              "seat_peaks": pruned.seat_peaks, "caches": pruned.caches}
            if pruned.total:
                log.info("%s", pruned.reason())
        try:
            steps = await compact(self.store.awrite)  # one write per step: other writes run between them
            done["compacted"] = f"{len(steps)} step(s), the last: {steps[-1]}" if steps else None
        except Exception as e:
            done["compacted"] = f"unavailable, because the store refused it: {e}"
            log.warning("store space not given back to the disk: %s", e)
        else:
            if done["compacted"]:
                log.info("store: %s", done["compacted"])
        try:
            done["wal"] = await asyncio.to_thread(checkpoint, self.store.engine)
        except Exception as e:
            done["wal"] = f"not checkpointed, because {e}"
            log.warning("store write-ahead log not checkpointed: %s", e)
        self.usage = await asyncio.to_thread(data_dir_usage, Path(self.config.data_dir))
        done["data_dir"] = self.usage.to_json()
        self.last = done
        return done

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="fitevict-upkeep")

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                await self.round()
            except Exception as e:  # a bug in one round must not end the upkeep for good
                log.error("store upkeep round failed", exc_info=e)
            try:
                await asyncio.wait_for(self._stop.wait(), self.config.logs.prune_seconds)
            except asyncio.TimeoutError:
                continue

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


__all__ = ["Upkeep"]
