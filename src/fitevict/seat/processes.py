"""How a seat's process is made: which engine runs a catalog entry, its argv and environment (the engine's one
builder), a fresh port and log file. Seat logs are kept within ``[logs]``: a model's newest
``logs.seats_per_model``, all of them within ``logs.seats_disk``, the oldest going first; never a log that a seat
still writes or whose end is still being recorded."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from fitevict.config import Config
from fitevict.engines import build_pricer, engine_class
from fitevict.engines.base import Engine, LaunchSpec
from fitevict.schedule.errors import LoadFailed
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.request.catalog import Catalog, CatalogEntry
from fitevict.request.ask import passthrough_args
from fitevict.seat.running import SeatState
from fitevict.seat.parts import PromptFiles

log = logging.getLogger("fitevict.seat")


class Processes:
    def __init__(self, config: Config, catalog: Catalog, engine_binary: Path, ports: Callable[[], int],
                 kv: PromptFiles) -> None:
        self.config = config
        self.catalog = catalog
        self.engine_binary = Path(engine_binary)
        self.next_port = ports  # where a new seat's port comes from (the OS by default)
        self.kv = kv
        self.log_dir = Path(config.data_dir) / "seats"
        self._engines: dict[str, Engine] = {}
        self.busy_logs: set[Path] = set()  # issued to a seat whose end is not recorded yet: never pruned
        # the build its flags, prices and calibration were read from
        self.build = build_pricer().build_id(self.engine_binary)

    def engine_for(self, entry: CatalogEntry) -> Engine:
        eng = self._engines.get(entry.engine)
        if eng is None:
            # an engine that runs the configured llama-server build gets it; another runs its own program
            eng = self._engines[entry.engine] = engine_class(entry.engine).for_binary(self.engine_binary)
        return eng

    def engine_name(self, key: str) -> str:
        entry = self.catalog.get(key)
        return entry.engine if entry is not None else "unknown"

    def launch_spec(self, entry: CatalogEntry, path: Path, cfg: LoadConfig, port: int) -> LaunchSpec:
        """The argv and environment that start ``entry`` under ``cfg`` (the engine's one builder)."""
        engine = self.engine_for(entry)
        keep = engine.traits.keeps_prompts and self.config.policy.prompt_cache
        spec = engine.launch_spec(path, cfg, port, extra_args=passthrough_args(entry),
                                  embeddings=bool(entry.settings.embeddings), mmproj=entry.mmproj,
                                  slot_save_path=self.kv.prepare() if keep else None)
        if spec.argv and Path(spec.argv[0]) == self.engine_binary:
            self.check_build(entry.key)
        return spec

    def check_build(self, key: str) -> None:
        """Raise LoadFailed when the engine binary is missing, or on disk is no longer the build fitevict started with
        (another build put in its place): its flags, prices and calibration were read from the old one. Running
        seats are not touched."""
        now = build_pricer().build_id(self.engine_binary)
        if not self.engine_binary.is_file():
            raise LoadFailed(
                f"{key}: no engine binary at {self.engine_binary} (fitevict serve started without one, or it was "
                "removed): install it (fitevict engine install llama.cpp) or set engine.llama_server, then restart "
                "fitevict serve; the other engines' models are served meanwhile")
        if now != self.build:
            why = build_pricer().build_change(self.engine_binary)
            raise LoadFailed(
                f"{key}: the engine binary {self.engine_binary} changed since fitevict started (build {self.build} "
                f"then, {now} now{'; ' + why if why else ''}); fitevict read its flags, prices and calibration from "
                "the old build, so it does not start the new one: restart fitevict serve to use it (or put the old "
                "build back); running seats are unaffected")

    def log_path(self, key: str) -> Path:
        """A fresh log file for a seat of ``key``, held from pruning until ``done_with_log``. Its folder is made
        again when it was removed while fitevict ran (a cleaned data directory)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / f"{key.replace('/', '_')}-{uuid.uuid4().hex[:8]}.log"
        self.busy_logs.add(path)
        return path

    def done_with_log(self, path: Path) -> None:
        """The seat that wrote ``path`` has ended and its end is recorded: its log may be pruned from now on."""
        self.busy_logs.discard(path)

    async def prune_logs(self, running: Iterable[SeatState]) -> list[Path]:
        """Remove seat logs beyond ``[logs]``: each model's oldest beyond ``logs.seats_per_model``, then the oldest
        of all until they fit ``logs.seats_disk``; a running seat's log and a busy one count but stay. Returns the
        logs removed (and says so in the server log)."""
        keep = {Path(s.log_path) for s in running} | self.busy_logs
        bound = self.config.logs
        try:
            removed, freed = await asyncio.to_thread(prune_dir, self.log_dir, bound.seats_disk, keep,
                                                     bound.seats_per_model)
        except OSError as e:  # a log that cannot be removed must not fail the load that pruned
            log.warning("seat logs in %s not pruned: %s", self.log_dir, e)
            return []
        if removed:
            log.info("pruned %d seat log(s), %d bytes, oldest first, to keep %s within logs.seats_per_model=%d and "
                     "logs.seats_disk=%d", len(removed), freed, self.log_dir, bound.seats_per_model, bound.seats_disk)
        return removed


def log_model(path: Path) -> str:
    """The model a seat log belongs to, from its name (``<key>-<8 hex>.log``, see ``Processes.log_path``)."""
    stem = path.stem
    head, sep, tail = stem.rpartition("-")
    return head if sep and len(tail) == 8 else stem


def prune_dir(folder: Path, budget: int, keep: set[Path], per_model: int | None = None) -> tuple[list[Path], int]:
    """Remove ``*.log`` files of ``folder``: each model's oldest (by mtime) beyond its newest ``per_model``, then the
    oldest of all until the folder's logs total at most ``budget`` bytes; ``keep`` are counted but never removed.
    Returns what was removed and its bytes."""
    logs = []
    for p in folder.glob("*.log"):
        try:
            st = p.stat()
        except FileNotFoundError:
            continue  # removed meanwhile
        logs.append((st.st_mtime_ns, st.st_size, p))
    logs.sort()
    doomed: list[tuple[int, Path]] = []
    if per_model is not None:
        seen: dict[str, int] = {}
        for _, size, p in reversed(logs):  # newest first
            model = log_model(p)
            seen[model] = seen.get(model, 0) + 1
            if seen[model] > per_model and p not in keep:
                doomed.append((size, p))
    total = sum(size for _, size, _ in logs) - sum(size for size, _ in doomed)
    gone = {p for _, p in doomed}
    for _, size, p in logs:
        if total <= budget:
            break
        if p in keep or p in gone:
            continue
        doomed.append((size, p))
        total -= size
    removed: list[Path] = []
    freed = 0
    for size, p in doomed:
        try:
            p.unlink()
        except FileNotFoundError:
            log.debug("seat log %s was removed meanwhile", p)  # its bytes are gone all the same
        removed.append(p)
        freed += size
    return removed, freed
