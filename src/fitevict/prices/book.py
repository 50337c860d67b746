"""What a load costs, as the supervisor knows it: a stored measurement for the signature, else the price, corrected
by what loads of the same file at other settings measured (``pricing.correction``; learned from each accepted load
and, at start, from the history's load records).

The book gathers what it learns (dry runs, accepted loads, overheads) and hands the planner price sheets
(``prices.sheet``): one immutable record per file and adapter set, read off the event loop before a
request is queued or when the catalog changes, so that the scheduler's synchronous plan prices configurations by
computation only. Each change that can move a price bumps a version; the sheets built before it are rebuilt, off
the event loop (``sheet``, ``_refresh``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from importlib import metadata
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fitevict.engines import build_pricer, pricer_for, traits
from fitevict.engines.base import Unavailable
from fitevict.pricing.footprint import Footprint
from fitevict.host.cpu import Cpu, this_cpu
from fitevict.pricing.gguf import PricingError
from fitevict.pricing.grown import Grown
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.pages import SharedPages
from fitevict.request.catalog import CatalogEntry
from fitevict.request.ask import ask
from fitevict.store import Store
from fitevict.store.records import measurement_signature
from fitevict.pricing.footprint import footprint_from_json
from fitevict.prices.sheet import PriceSheet, SheetInputs, read_sheet

__all__ = ["HISTORY_LOADS", "PriceBook", "PriceSheet"]

log = logging.getLogger("fitevict.prices")
HISTORY_LOADS = 1000  # the newest load records a starting supervisor learns each file's error from
MAX_SHEETS = 512  # sheets kept (the oldest read goes first)


def torch_version() -> str:
    """The installed torch's version (its package metadata: torch is not imported), or "none"."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"


class PriceBook:
    def __init__(self, store: Store, engine_dir: Path, default_alloc_mode: str, cpu: Cpu | None = None,
                 torch: str | None = None) -> None:
        """``cpu``: the CPU the book prices for (this one by default); with the engine build it keys every figure
        learned and stored (``machine``). ``torch``: the torch version transformers seats run with (the installed
        one by default): it keys their overheads too."""
        self.store = store
        self.engine_dir = engine_dir
        self.default_alloc_mode = default_alloc_mode
        self.cpu = cpu or this_cpu()
        build = build_pricer()  # the family whose build ``engine_dir`` holds
        self.machine = build.build_key(engine_dir, self.cpu)  # engine build @ CPU: keys what is learned
        self.host = build.host_buffers(engine_dir)  # this machine's extra host buffer types
        self.threads, self.tiled = build.work_facts()  # what a seat's work buffer depends on, here
        # bytes a seat's process holds beyond its buffers, per device; whoever changes it (or the two overheads
        # below) calls ``forget`` so that the sheets are read again
        self.engine_overhead: dict[str, int] = {}
        # where the host figure of ``engine_overhead`` came from: "calibrated", "raised" (by loads here), or why not
        self.overhead_origin = "not read yet: no calibration or load of this engine build was read"
        # the engine binary's own file pages, kept out of each price and counted once by the planner (None: none)
        self.engine_pages: SharedPages | None = None
        self._quant: dict[tuple[str, int, int], str] = {}
        # the engine's dry runs, per file: by configuration, or (context, projector) by placement-free configuration
        self._compute: dict[str, dict[LoadConfig, dict[str, int]]] = {}
        self._dry_notes: dict[str, dict[LoadConfig, str]] = {}
        self._dry_context: dict[str, dict[LoadConfig, Any]] = {}
        self._projector_estimate: dict[str, dict[LoadConfig, int]] = {}
        self._dry_file: dict[str, tuple[int, int, int]] = {}  # file -> (size, mtime_ns, inode) its dry runs ran on
        self._mmproj: dict[str, Path] = {}  # model file -> its projector (from the catalog)
        self._extra_args: dict[str, tuple[str, ...]] = {}  # HF folder -> the seat's own flags (dtype, quant, ...)
        self.torch_overhead: int | None = None  # a transformers seat's own process bytes (measured, first seat)
        self.torch = torch if torch is not None else torch_version()  # torch's version keys those two figures
        self.torch_origin = "not read yet"  # which stored key ``torch_overhead`` came from (prices.learned)
        self.peft_overhead: int | None = None  # the same for a seat with PEFT adapters (peft's import: ~136 MiB more)
        # file identity -> configuration -> the engine's measured buffers of an accepted load (newest kept)
        self._learned: dict[tuple[str, int, int], dict[LoadConfig, Footprint]] = {}
        # file identity -> configuration -> what its seats outgrew to here beyond their price (newest outgrew event)
        self._grown: dict[tuple[str, int, int], dict[LoadConfig, Grown]] = {}
        # files whose load crashed the engine with repacking on, on this machine: they load with -nr (seat/crash)
        self._no_repack: set[tuple[str, int, int]] = set()
        # the sheets, by (file, adapters); the versions of what they were read from: every file's, each file's
        self._sheets: dict[tuple[str, tuple[str, ...]], PriceSheet] = {}
        self._epoch = 0
        self._changes = 0  # every change, of any file (``version``)
        self._file_epochs: dict[str, int] = {}
        self._stored: tuple[int, Mapping[str, Mapping]] | None = None  # the store's measurements, at an epoch
        self._rebuild: asyncio.Task | None = None
        self._added: set[asyncio.Task] = set()  # a rescan's new models, read ahead
        self._dry_running: dict[tuple[str, LoadConfig], asyncio.Future] = {}  # dry runs under way
        self._lock = threading.Lock()  # sheets are put from the event loop and from the threads that read them

    # -- what changes prices ----------------------------------------------------------------------

    def forget(self) -> None:
        """A measurement or an overhead changed: every sheet is read again (off the event loop)."""
        self._changed()

    @property
    def version(self) -> int:
        """Moves whenever an answer of the book may have (``request.ask.Asks`` drops what it built before)."""
        return self._changes

    def _changed(self, path: str | None = None) -> None:
        self._changes += 1
        if path is None:
            self._epoch += 1
        else:
            self._file_epochs[path] = self._file_epochs.get(path, 0) + 1
        self._refresh()

    def no_repack(self, path: Path) -> None:
        """``path`` crashed the engine with repacking on, here: from now on it is planned and started with -nr."""
        self._no_repack.add(_ident(path))
        self.forget()

    def learn(self, path: Path, cfg: LoadConfig, measured: Footprint, ident: tuple[str, int, int] | None = None) -> None:
        """An accepted load's measured buffers: they correct this file's formula at other settings from now on."""
        if ident is None:
            ident = _ident(path)
        self._learned.setdefault(ident, {})[cfg] = measured
        self._changed(ident[0])

    def learn_outgrowth(self, ident: tuple[str, int, int], cfg: LoadConfig, grown: Grown) -> None:
        """A seat of ``ident`` under ``cfg`` outgrew its price here: the next price of both includes ``grown``."""
        self._grown.setdefault(ident, {})[cfg] = grown
        self._changed(ident[0])

    def learn_outgrowths(self, events: Iterable[tuple[float, dict]]) -> int:
        """Learn from stored ``outgrew`` events ((time, details), newest first): those of this machine that carry
        what the seat needed beyond its price (``price_learned``), the newest per file and configuration. Returns
        how many were learned."""
        n = 0
        for at, d in events:
            lesson, config = d.get("price_learned"), d.get("config")
            if d.get("machine") != self.machine or not isinstance(lesson, dict) or not isinstance(config, dict):
                continue
            f, cfg, g = lesson.get("file") or {}, LoadConfig.from_json(config), Grown.from_json(lesson, at)
            ident = (str(f.get("path")), int(f.get("size", -1)), int(f.get("mtime_ns", -1)))
            if g is not None and cfg not in self._grown.get(ident, {}):
                self._grown.setdefault(ident, {})[cfg] = g
                n += 1
        if n:
            self.forget()
        return n

    def learn_history(self, details: Sequence[dict]) -> int:
        """Learn from stored ``load`` records (their details, newest first): the accepted ones made on this machine
        (``machine``: engine build @ CPU) that name their file (``file``: path, size, mtime_ns), configuration and
        measured buffers. A record of another machine sharing the store, or of none, is never learned from.
        Returns how many were learned."""
        n = 0
        for d in details:
            crash = d.get("repack_crash")
            if isinstance(crash, dict) and crash.get("machine") == self.machine and isinstance(crash.get("file"), dict):
                cf = crash["file"]
                self._no_repack.add((str(cf["path"]), int(cf["size"]), int(cf["mtime_ns"])))
            if d.get("machine") != self.machine:
                continue
            f, guard = d.get("file"), d.get("guard") or {}
            if not (isinstance(f, dict) and isinstance(d.get("measured"), dict) and isinstance(d.get("config"), dict)
                    and guard.get("accepted")):
                continue
            ident = (str(f["path"]), int(f["size"]), int(f["mtime_ns"]))
            cfg = LoadConfig.from_json(d["config"])
            if cfg not in self._learned.get(ident, {}):
                self._learned.setdefault(ident, {})[cfg] = footprint_from_json(d["measured"])
                n += 1
        if n:
            self.forget()
        return n

    def rescanned(self, added: Iterable[CatalogEntry]) -> None:
        """The catalog changed: every sheet is read again (a file may have changed on disk, or gone), and the models
        it added get theirs (at their default configuration), off the event loop."""
        self.forget()
        try:
            task = asyncio.get_running_loop().create_task(self._prefetch_entries(list(added)),
                                                          name="fitevict-price-sheets")
        except RuntimeError:
            return  # no event loop here: the added models' sheets are read at their first plan
        self._added.add(task)
        task.add_done_callback(self._added.discard)

    async def settled(self) -> None:
        """Wait until the reads under way (rebuilds, a rescan's new models) have finished."""
        while pending := [t for t in (self._rebuild, *self._added)
                          if t is not None and not t.done()]:
            await asyncio.wait(pending)

    async def _prefetch_entries(self, entries: list[CatalogEntry]) -> None:
        for entry in entries:
            try:
                got = await asyncio.to_thread(ask, entry, None, self)
                if (str(got.path), got.request.config.loras) not in self._sheets:
                    await self.sheet(got.path, got.request.config)
            except (OSError, PricingError, ValueError) as e:
                log.debug("no price sheet for %s: %s", entry.key, e)

    # -- sheets -----------------------------------------------------------------------------------

    def _version(self, path: Path | str) -> tuple[int, int]:
        return (self._epoch, self._file_epochs.get(str(path), 0))

    def current(self, sheet: PriceSheet) -> bool:
        """Whether ``sheet`` was read from what the book knows now (a file changed on disk is seen by a reread)."""
        return sheet.version == self._version(sheet.path)

    def holds(self, sheet: PriceSheet) -> bool:
        """Whether ``sheet`` is current and its file is still the one it priced (one ``stat``: not for a plan)."""
        return self.current(sheet) and sheet.ident == _ident(sheet.path)

    def _inputs(self, path: Path, loras: tuple[str, ...]) -> SheetInputs:
        """What the book knows of ``path``, copied (no I/O: take it on the event loop, read the rest off it)."""
        p = str(path)
        return SheetInputs(
            path=Path(path), loras=tuple(loras), version=self._version(p), machine=self.machine, host=self.host,
            engine_overhead=dict(self.engine_overhead), engine_pages=self.engine_pages, threads=self.threads,
            tiled=self.tiled, learned={i: dict(v) for i, v in list(self._learned.items()) if i[0] == p},
            compute=dict(self._compute.get(p, {})), dry_context=dict(self._dry_context.get(p, {})),
            projector_estimate=dict(self._projector_estimate.get(p, {})), mmproj=self._mmproj.get(p),
            extra_args=self._extra_args.get(p, ()), torch_overhead=self.torch_overhead,
            peft_overhead=self.peft_overhead, grown={i: dict(v) for i, v in list(self._grown.items()) if i[0] == p})

    def _stored_now(self) -> Mapping[str, Mapping]:
        """The newest stored measurement of every signature, read once per version of the book (one query)."""
        epoch, got = self._stored if self._stored is not None else (-1, None)
        if got is None or epoch != self._epoch:
            epoch = self._epoch  # taken before the read: a measurement stored meanwhile bumps it, and is read next time
            got = MappingProxyType({sig: m.footprint for sig, m in self.store.newest_measurements().items()})
            self._stored = (epoch, got)
        return got

    def _read(self, inputs: SheetInputs) -> PriceSheet:
        return read_sheet(inputs, self._stored_now(), self.structure)

    def _fresh(self, have: PriceSheet | None, inputs: SheetInputs) -> PriceSheet:
        """``have`` if it is current and its file unchanged on disk, else a new sheet (blocking I/O)."""
        if have is not None and have.version == inputs.version and have.ident == _ident(inputs.path):
            return have
        return self._read(inputs)

    def _keep(self, sheet: PriceSheet) -> None:
        """Hold ``sheet``, unless a sheet read from a newer version of the book is held already (a rebuild that
        started before a change must not put back what the change made stale)."""
        with self._lock:
            held = self._sheets.get(sheet.key)
            if held is not None and all(h >= n for h, n in zip(held.version, sheet.version)) and (
                    held.version != sheet.version or held.ident == sheet.ident):
                return  # what is held was read from the same version of the same file, or a newer one
            self._sheets.pop(sheet.key, None)
            self._sheets[sheet.key] = sheet
            while len(self._sheets) > MAX_SHEETS:
                del self._sheets[next(iter(self._sheets))]

    def read_sheet(self, path: Path, cfg: LoadConfig) -> PriceSheet:
        """A current sheet for ``path`` and ``cfg``'s adapters (blocking I/O: not on the event loop)."""
        inputs = self._inputs(path, cfg.loras)
        sheet = self._fresh(self._sheets.get(inputs.key), inputs)
        self._keep(sheet)
        return sheet

    async def sheet(self, path: Path, cfg: LoadConfig) -> PriceSheet:
        """A current sheet for ``path`` and ``cfg``'s adapters, read off the event loop when it is missing, stale or
        its file changed on disk."""
        inputs = self._inputs(path, cfg.loras)
        have = self._sheets.get(inputs.key)
        sheet = await asyncio.to_thread(self._fresh, have, inputs)
        if sheet is not have:
            self._keep(sheet)  # unless a rebuild meanwhile held one as new
        return self._sheets.get(inputs.key, sheet) if self.current(sheet) else sheet

    def sheet_now(self, path: Path, cfg: LoadConfig) -> PriceSheet:
        """The sheet a synchronous plan prices with: the one held, without I/O. A sheet is immutable and labelled with
        the version of the book it was read from; after a change, until its rebuild (off the event loop) is ready,
        a plan on the loop prices with the previous sheet: it is what the book knew a moment ago, and the requests
        that go on to load await the rebuilt one (``sheet``). Off the event loop (the CLI) a stale sheet is read
        again here. Only a file that neither a waiting request nor a rescan read ahead is read on the spot."""
        have = self._sheets.get((str(path), cfg.loras))
        if have is None:
            return self.read_sheet(path, cfg)
        if not self.current(have):
            if not _on_loop():
                return self.read_sheet(path, cfg)
            self._refresh()
        return have

    def _refresh(self) -> None:
        """Read the stale sheets again: in one task off the event loop, or here when called off the loop (the
        start-up's priming runs in a thread; the CLI has no loop)."""
        if not _on_loop():
            for have in [s for s in list(self._sheets.values()) if not self.current(s)]:
                self._reread(self._inputs(have.path, have.loras))
            return
        if self._rebuild is None or self._rebuild.done():
            self._rebuild = asyncio.get_running_loop().create_task(self._rebuild_stale(), name="fitevict-price-sheets")

    async def _rebuild_stale(self) -> None:
        """Until no sheet is stale: copy what the book knows (here, on the loop), read each sheet in a thread."""
        while stale := [self._inputs(s.path, s.loras) for s in list(self._sheets.values()) if not self.current(s)]:
            await asyncio.to_thread(lambda: [self._reread(i) for i in stale])

    def _reread(self, inputs: SheetInputs) -> None:
        """One stale sheet read again; a file that can no longer be read loses its sheet (its next plan says why)."""
        try:
            self._keep(self._read(inputs))
        except Exception as e:  # in the background: the plan that needs it reads it again and meets the error
            expected = isinstance(e, (OSError, PricingError, ValueError))
            log.log(logging.DEBUG if expected else logging.WARNING, "price sheet of %s dropped: %s: %s", inputs.path,
                    type(e).__name__, e)
            with self._lock:
                self._sheets.pop(inputs.key, None)

    # -- requests and prices ----------------------------------------------------------------------

    def structure(self, path: Path):
        """The model's structure, as its family's pricer reads it (cached there)."""
        return pricer_for(path).structure(path)

    def shape(self, path: Path):
        """What the planner needs of a model's shape: offloadable layers, MoE or not, training context."""
        return pricer_for(path).shape(self.structure(path))

    def context(self, path: Path, cfg: LoadConfig) -> int:
        """The context a seat of ``cfg`` (``n_ctx`` 0) starts with: the model's own. Seats start with --fit off, under
        which "-c 0" means something other than under the engine's default --fit on, so they start with the explicit
        context the price was made for."""
        return pricer_for(path).context(self.structure(path), cfg)

    def repacks(self, path: Path) -> bool:
        """Whether the engine may repack ``path``'s weights here (not once repacking crashed it on this machine)."""
        return _ident(path) not in self._no_repack

    def note_flags(self, entry: CatalogEntry, path: Path) -> None:
        """A transformers seat's own flags (dtype, quantization) set what it costs: a change reads its sheets again."""
        if traits(entry.engine).flags_set_price and self._extra_args.get(str(path)) != tuple(entry.settings.extra_args):
            self._extra_args[str(path)] = tuple(entry.settings.extra_args)
            self._changed(str(path))

    def signature(self, path: Path, cfg: LoadConfig) -> str:
        st = path.stat()
        ident = (str(path), st.st_size, st.st_mtime_ns)
        quant = self._quant.get(ident)
        if quant is None:
            quant = self._quant[ident] = pricer_for(path).quantization(self.structure(path))
        return measurement_signature(path=str(path.resolve()), size=st.st_size, mtime_ns=st.st_mtime_ns,
                                     quantization=quant, config=cfg.to_json(), machine=self.machine)

    def footprint(self, path: Path, cfg: LoadConfig) -> Footprint:
        """The footprint from a current sheet of ``path`` (read here when stale or its file changed: blocking I/O),
        for callers off the planner's path (adopting a seat at start, the CLI, tests)."""
        return self.read_sheet(path, cfg).footprint(cfg)

    def torch_overhead_for(self, adapters: Sequence[str]) -> int | None:
        """A transformers seat's own process bytes: with adapters, peft's libraries too (measured apart; until one
        such seat was measured, the plain seat's figure, a lower bound)."""
        return (self.peft_overhead or self.torch_overhead) if adapters else self.torch_overhead

    async def dry_runs_ended(self) -> None:
        """Wait until every dry run under way has ended (its engine process gone): shutdown leaves none behind."""
        await asyncio.gather(*self._dry_running.values(), return_exceptions=True)

    @property
    def dry_runs_under_way(self) -> tuple[tuple[str, LoadConfig], ...]:
        """(file, configuration) of each dry run running now."""
        return tuple(self._dry_running)

    def has_dry_run(self, path: Path, cfg: LoadConfig) -> bool:
        self._drop_replaced(str(path))
        return cfg in self._compute.get(str(path), {})

    def _drop_replaced(self, p: str) -> None:
        """Forget the dry runs of ``p`` when the file there is no longer the one they ran on (another file put in
        its place under the same name, or the same one rewritten): they priced what is gone, and the next load runs
        them again. A file that cannot be read is left to its plan, which says why."""
        try:
            st = os.stat(p)
        except OSError:
            return
        now = (st.st_size, st.st_mtime_ns, st.st_ino)
        if self._dry_file.setdefault(p, now) != now:
            self._dry_file[p] = now
            for runs in (self._compute, self._dry_context, self._projector_estimate, self._dry_notes):
                runs.pop(p, None)
            old = {k for d in (self._learned, self._grown, self._quant) for k in d} | self._no_repack
            for gone in [k for k in old if k[0] == p and tuple(k[1:3]) != now[:2]]:  # what the old versions taught
                for facts in (self._learned, self._grown, self._quant):
                    facts.pop(gone, None)
                self._no_repack.discard(gone)
            log.info("%s changed on disk: its dry runs are forgotten and run again at its next load", p)
            self._changed(p)

    def compute_source(self, path: Path, cfg: LoadConfig) -> str:
        if self.has_dry_run(path, cfg):
            return "dry-run"
        why = self._dry_notes.get(str(path), {}).get(cfg, "not run for this configuration")
        return f"formula, because the dry run gave no figure: {why}"

    async def dry_run(self, entry: CatalogEntry, cfg: LoadConfig, path: Path, extra_args: Sequence[str]) -> None:
        """Price the compute buffer of ``cfg`` with the engine's own dry run, once per file and configuration
        (also cached on disk); a dry run that gives no figure leaves the labelled formula in place."""
        p = str(path)
        self._drop_replaced(p)
        if cfg in self._compute.get(p, {}) or cfg in self._dry_notes.get(p, {}):
            return
        if entry.mmproj is not None and self._mmproj.get(p) != Path(entry.mmproj):
            self._mmproj[p] = Path(entry.mmproj)
            self._changed(p)
        running = self._dry_running.get((p, cfg))
        if running is None:  # one dry run per file and configuration at a time: a second asker awaits the first
            running = asyncio.ensure_future(asyncio.to_thread(pricer_for(path).dry_run, self.engine_dir, path, cfg,
                                                              extra_args=tuple(extra_args), mmproj=entry.mmproj))
            self._dry_running[(p, cfg)] = running
            running.add_done_callback(lambda _: self._dry_running.pop((p, cfg), None))
        got = await asyncio.shield(running)
        if cfg in self._compute.get(p, {}) or cfg in self._dry_notes.get(p, {}):
            return  # the first asker recorded it
        if isinstance(got, Unavailable):
            self._dry_notes.setdefault(p, {})[cfg] = got.reason
        else:
            self._compute.setdefault(p, {})[cfg] = got.compute
            if got.context is not None:  # the caches do not depend on where layers go: one dry run serves any
                self._dry_context.setdefault(p, {})[cfg.without_placement()] = got.context
            if got.projector_estimate is not None:
                self._projector_estimate.setdefault(p, {})[cfg.without_placement()] = got.projector_estimate
            self._changed(p)


def _ident(path: Path) -> tuple[str, int, int]:
    st = Path(path).stat()
    return (str(path), st.st_size, st.st_mtime_ns)


def _on_loop() -> bool:
    """Whether this thread runs an event loop now (then blocking I/O must go to a thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
