"""How a seat's process is made: which engine runs a catalog entry, its argv and environment (the engine's one
builder), a fresh port and log file, and the record the store keeps of a live seat (so that a restarted fitevict
finds what an earlier one left)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fitevict.config import Config
from fitevict.engines import engine_class
from fitevict.engines.base import Engine, LaunchSpec
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.request.catalog import Catalog, CatalogEntry
from fitevict.request.ask import passthrough_args
from fitevict.store.records import SeatRecord
from fitevict.supervisor.kvkeep import PromptKeep
from fitevict.supervisor.seat import SeatState


class Processes:
    def __init__(self, config: Config, catalog: Catalog, engine_binary: Path, ports: Callable[[], int],
                 kv: PromptKeep) -> None:
        self.config = config
        self.catalog = catalog
        self.engine_binary = Path(engine_binary)
        self.next_port = ports  # where a new seat's port comes from (the OS by default)
        self.kv = kv
        self.log_dir = Path(config.data_dir) / "seats"
        self._engines: dict[str, Engine] = {}

    def engine_for(self, entry: CatalogEntry) -> Engine:
        eng = self._engines.get(entry.engine)
        if eng is None:
            cls = engine_class(entry.engine)
            # llama-server runs the configured build; a transformers seat runs this Python
            eng = self._engines[entry.engine] = cls(self.engine_binary) if entry.engine == "llama-server" else cls()
        return eng

    def engine_name(self, key: str) -> str:
        entry = self.catalog.get(key)
        return entry.engine if entry is not None else "unknown"

    def launch_spec(self, entry: CatalogEntry, path: Path, cfg: LoadConfig, port: int) -> LaunchSpec:
        """The argv and environment that start ``entry`` under ``cfg`` (the engine's one builder)."""
        engine = self.engine_for(entry)
        kw: dict[str, Any] = {"extra_args": passthrough_args(entry),
                              "embeddings": bool(entry.settings.embeddings)}
        if entry.engine == "llama-server":
            kw["mmproj"] = entry.mmproj
            if self.config.policy.prompt_cache:
                kw["slot_save_path"] = self.kv.prepare()
        return engine.launch_spec(path, cfg, port, **kw)

    def log_path(self, key: str) -> Path:
        """A fresh log file for a seat of ``key``."""
        return self.log_dir / f"{key.replace('/', '_')}-{uuid.uuid4().hex[:8]}.log"

    @staticmethod
    def record(seat: SeatState) -> SeatRecord:
        """The store's record of a live seat."""
        return SeatRecord(seat_id=seat.id, model=seat.key, engine=seat.engine, state=str(seat.state),
                          started_at=seat.started_at, fitevict_pid=os.getpid(), pid=seat.pid, pgid=seat.pgid,
                          port=seat.port, log_path=str(seat.log_path), config=seat.config.to_json())
