"""What a load costs, as the supervisor knows it: a stored measurement for the signature, else the price, corrected
by what loads of the same file at other settings measured (``pricing.correction``; learned from each accepted load
and, at start, from the history's load records).

Caches in memory by (file identity, configuration): the planner prices many candidate configurations per
plan, the engine's dry run is run once per file and configuration, and a stored measurement changes only
when a load records one (``forget`` drops the cache then).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fitevict import planner as pl
from fitevict.catalog import CatalogEntry
from fitevict.contract import Contract, load_config_for, plan_request
from fitevict.engines.dryrun import Unavailable as DryRunUnavailable
from fitevict.engines.dryrun import dry_run
from fitevict.engines.overhead import model_terms
from fitevict.pricing import price as pricing
from fitevict.pricing.correction import Correction, apply_correction, correction
from fitevict.pricing.footprint import Footprint, as_stored
from fitevict.engines.torch_engine import hf_config
from fitevict.host.machine import host_buffers, machine_key
from fitevict.pricing.gguf import PricingError, load_structure
from fitevict.pricing.hf_kv import training_context
from fitevict.pricing.hf_price import price_hf
from fitevict.pricing.peft import load_peft_adapter
from fitevict.pricing.safetensors import load_hf_structure
from fitevict.pricing.kv import resolve_context
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.logparse import PRECISION_BYTES
from fitevict.pricing.projector import price_projector, with_projector
from fitevict.store import Store
from fitevict.store.records import measurement_signature
from fitevict.supervisor.measure import dominant_type, footprint_from_json, with_engine_overhead


# a measured term sums at most three logged buffers (KV, SWA KV, recurrent state), each printed to +-0.005 MiB
LOG_TERM_PRECISION = 3 * PRECISION_BYTES
HISTORY_LOADS = 1000  # the newest load records a starting supervisor learns each file's error from


@dataclass(frozen=True, slots=True)
class _HfShape:
    n_ctx_train: int
    n_layer: int = 0
    is_moe: bool = False


def _hf_dtype(structure) -> str:
    """The safetensors dtype holding the most bytes: an HF folder's quantization, for signatures."""
    by: dict[str, int] = {}
    for t in structure.tensors:
        by[t.dtype] = by.get(t.dtype, 0) + t.nbytes
    return "hf:" + (max(by, key=by.__getitem__) if by else "empty")


class PriceBook:
    def __init__(self, store: Store, engine_dir: Path, default_alloc_mode: str) -> None:
        self.store = store
        self.engine_dir = engine_dir
        self.default_alloc_mode = default_alloc_mode
        self.machine = machine_key(engine_dir / "llama-server")  # engine build @ CPU: keys stored measurements
        self.host = host_buffers(engine_dir / "llama-server")  # this machine's extra host buffer types
        self.engine_overhead: dict[str, int] = {}  # bytes a seat's process holds beyond its buffers, per device
        self._footprints: dict[tuple, Footprint] = {}
        self._quant: dict[tuple[str, int, int], str] = {}
        self._compute: dict[tuple[str, LoadConfig], dict[str, int]] = {}
        self._dry_notes: dict[tuple[str, LoadConfig], str] = {}
        self._dry_context: dict[tuple[str, LoadConfig], Any] = {}  # keyed by the placement-free configuration
        self._projector_estimate: dict[tuple[str, LoadConfig], int] = {}
        self._mmproj: dict[str, Path] = {}  # model file -> its projector (from the catalog)
        self._extra_args: dict[str, tuple[str, ...]] = {}  # HF folder -> the seat's own flags (dtype, quant, ...)
        self._hf: dict[tuple[str, int], Any] = {}
        self.torch_overhead: int | None = None  # a transformers seat's own process bytes (measured, first seat)
        self.peft_overhead: int | None = None  # the same for a seat with PEFT adapters (peft's import: ~136 MiB more)
        self._requests: dict[tuple[str, Contract | None], tuple[pl.PlanRequest, LoadConfig, Path]] = {}
        # file identity -> configuration -> the engine's measured buffers of an accepted load (newest kept)
        self._learned: dict[tuple[str, int, int], dict[LoadConfig, Footprint]] = {}
        self._corrections: dict[tuple[str, int, int], Correction | None] = {}
        # files whose load crashed the engine with repacking on, on this machine: they load with -nr (supervisor/crash)
        self._no_repack: set[tuple[str, int, int]] = set()

    def forget(self) -> None:
        """A measurement or an overhead changed: prices are read again."""
        self._footprints.clear()

    def structure(self, path: Path):
        """A GGUF file's structure, or an HF folder's (safetensors headers and config.json)."""
        if not Path(path).is_dir():
            return load_structure(path)  # cached by the pricing module
        key = (str(path), Path(path).stat().st_mtime_ns)
        hit = self._hf.get(key)
        if hit is None:
            hit = self._hf[key] = load_hf_structure(Path(path))
        return hit

    def shape(self, path: Path):
        """What the planner needs of a model's shape: offloadable layers, MoE or not, training context. An HF
        seat places whole modules through its device map, so the planner sees it as one layer."""
        if Path(path).is_dir():
            return _HfShape(n_ctx_train=training_context(self.structure(path).config) or 0)
        return self.structure(path)

    def config_for(self, entry: CatalogEntry, contract: Contract | None) -> tuple[LoadConfig, str, Path]:
        cfg, mode, path = load_config_for(entry, contract, self.default_alloc_mode)
        if entry.engine == "llama-server" and cfg.repack and _ident(path) in self._no_repack:
            cfg = cfg.with_(repack=False)
        if cfg.n_ctx == 0 and Path(path).is_dir():
            cfg = cfg.with_(n_ctx=training_context(self.structure(path).config) or cfg.n_ctx)
        elif cfg.n_ctx == 0:
            # Seats start with --fit off, under which "-c 0" means something other than under the
            # engine's default --fit on; start them with the explicit context the price was made for.
            cfg = cfg.with_(n_ctx=resolve_context(self.structure(path), cfg).n_ctx)
        return cfg, mode, path

    def request(self, entry: CatalogEntry, contract: Contract | None) -> tuple[pl.PlanRequest, LoadConfig, Path]:
        """The scheduler's request for ``entry`` under ``contract`` (cached: the front door asks per request)."""
        k = (entry.key, contract)
        hit = self._requests.get(k)
        if hit is not None:
            return hit
        cfg, mode, path = self.config_for(entry, contract)
        named_file = contract is not None and contract.gguf_file is not None
        if entry.engine == "transformers":
            self._extra_args[str(path)] = tuple(entry.settings.extra_args)  # the seat's flags set what it costs
        req = plan_request(entry, cfg, mode, self.shape(path), source=path if named_file else None,
                           contract=contract if contract is not None else Contract())
        if len(self._requests) > 4096:
            self._requests.clear()
        self._requests[k] = (req, cfg, path)
        return req, cfg, path

    def signature(self, path: Path, cfg: LoadConfig) -> str:
        st = path.stat()
        ident = (str(path), st.st_size, st.st_mtime_ns)
        quant = self._quant.get(ident)
        if quant is None:
            quant = self._quant[ident] = (_hf_dtype(self.structure(path)) if path.is_dir()
                                          else dominant_type(self.structure(path)))
        return measurement_signature(path=str(path.resolve()), size=st.st_size, mtime_ns=st.st_mtime_ns,
                                     quantization=quant, config=cfg.to_json(), machine=self.machine)

    def footprint(self, path: Path, cfg: LoadConfig) -> Footprint:
        """Measured footprint for this signature if one was accepted (labelled stored-measurement), else the priced
        one, with the model's projector and the engine process's overhead."""
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns, cfg)
        hit = self._footprints.get(key)
        if hit is not None:
            return hit
        if path.is_dir():
            # a transformers seat: priced from its headers (its walk equals that to the byte), with its own process
            # overhead as measured; a walk has no cache or activations to reuse, so no stored figure stands in
            hf = hf_config(cfg, extra_args=self._extra_args.get(str(path), ()))
            fp = price_hf(self.structure(path), hf, overhead_bytes=self.torch_overhead_for(cfg.loras),
                          adapters=tuple(load_peft_adapter(a) for a in hf.adapters)).footprint
        elif (m := self.store.last_measurement(self.signature(path, cfg))) is not None:
            fp = as_stored(footprint_from_json(m.footprint))
        else:
            fp = pricing.price(self.structure(path), cfg, host=self.host,
                               compute=self._compute.get((str(path), cfg)),
                               context=self._dry_context.get((str(path), cfg.without_placement()))).footprint
            fp = apply_correction(fp, self.correction(path))
            proj = self._mmproj.get(str(path))
            if proj is not None:
                estimate = self._projector_estimate.get((str(path), cfg.without_placement()))
                fp = with_projector(fp, price_projector(load_structure(proj), estimate))
        if not path.is_dir():
            terms = model_terms(self.structure(path), cfg, self.host)  # the overhead's parts that scale with the model
            fp = with_engine_overhead(fp, self.engine_overhead, terms=terms)
        if len(self._footprints) > 4096:
            self._footprints.clear()
        self._footprints[key] = fp
        return fp

    def no_repack(self, path: Path) -> None:
        """``path`` crashed the engine with repacking on, here: from now on it is planned and started with -nr."""
        self._no_repack.add(_ident(path))
        self._requests.clear()
        self.forget()

    def learn(self, path: Path, cfg: LoadConfig, measured: Footprint, ident: tuple[str, int, int] | None = None) -> None:
        """An accepted load's measured buffers: they correct this file's formula at other settings from now on."""
        if ident is None:
            st = Path(path).stat()
            ident = (str(path), st.st_size, st.st_mtime_ns)
        self._learned.setdefault(ident, {})[cfg] = measured
        self._corrections.pop(ident, None)
        self.forget()

    def learn_history(self, details: Sequence[dict]) -> int:
        """Learn from stored ``load`` records (their details, newest first): the accepted ones that name their file
        (``file``: path, size, mtime_ns), configuration and measured buffers. Returns how many were learned."""
        n = 0
        for d in details:
            crash = d.get("repack_crash")
            if isinstance(crash, dict) and crash.get("machine") == self.machine and isinstance(crash.get("file"), dict):
                cf = crash["file"]
                self._no_repack.add((str(cf["path"]), int(cf["size"]), int(cf["mtime_ns"])))
            f, guard = d.get("file"), d.get("guard") or {}
            if not (isinstance(f, dict) and isinstance(d.get("measured"), dict) and isinstance(d.get("config"), dict)
                    and guard.get("accepted")):
                continue
            ident = (str(f["path"]), int(f["size"]), int(f["mtime_ns"]))
            cfg = LoadConfig.from_json(d["config"])
            if cfg not in self._learned.get(ident, {}):
                self._learned.setdefault(ident, {})[cfg] = footprint_from_json(d["measured"])
                self._corrections.pop(ident, None)
                n += 1
        if n:
            self.forget()
        return n

    def correction(self, path: Path) -> Correction | None:
        """How far this file's formula was from what its accepted loads measured (any settings), per term."""
        st = Path(path).stat()
        ident = (str(path), st.st_size, st.st_mtime_ns)
        if ident in self._corrections:
            return self._corrections[ident]
        loads = self._learned.get(ident, {})
        pairs, seen = [], []
        s = self.structure(path) if loads else None
        for c, measured in loads.items():
            try:
                pairs.append((pricing.price(s, c, host=self.host).footprint, measured))
            except PricingError:
                continue  # priced no more (the rules changed): nothing to learn from it
            seen.append(f"ctx {c.n_ctx}, " + pl.describe(c, s.n_layer + 1))  # type: ignore[union-attr]
        origin = "; ".join(seen[:4]) + (" ..." if len(seen) > 4 else "")
        corr = self._corrections[ident] = correction(pairs, origin, tolerance=LOG_TERM_PRECISION)
        return corr

    def torch_overhead_for(self, adapters: Sequence[str]) -> int | None:
        """A transformers seat's own process bytes: with adapters, peft's libraries too (measured apart; until one
        such seat was measured, the plain seat's figure, a lower bound)."""
        return (self.peft_overhead or self.torch_overhead) if adapters else self.torch_overhead

    def has_dry_run(self, path: Path, cfg: LoadConfig) -> bool:
        return (str(path), cfg) in self._compute

    def compute_source(self, path: Path, cfg: LoadConfig) -> str:
        if self.has_dry_run(path, cfg):
            return "dry-run"
        why = self._dry_notes.get((str(path), cfg), "not run for this configuration")
        return f"formula, because the dry run gave no figure: {why}"

    async def dry_run(self, entry: CatalogEntry, cfg: LoadConfig, path: Path, extra_args: Sequence[str]) -> None:
        """Price the compute buffer of ``cfg`` with the engine's own dry run, once per file and configuration
        (also cached on disk); a dry run that gives no figure leaves the labelled formula in place."""
        if (str(path), cfg) in self._compute or (str(path), cfg) in self._dry_notes:
            return
        if entry.mmproj is not None:
            self._mmproj[str(path)] = Path(entry.mmproj)
        got = await asyncio.to_thread(dry_run, self.engine_dir, path, cfg, extra_args=tuple(extra_args),
                                      mmproj=entry.mmproj)
        if isinstance(got, DryRunUnavailable):
            self._dry_notes[(str(path), cfg)] = got.reason
        else:
            self._compute[(str(path), cfg)] = got.compute
            if got.context is not None:  # the caches do not depend on where layers go: one dry run serves any
                self._dry_context[(str(path), cfg.without_placement())] = got.context
            if got.projector_estimate is not None:
                self._projector_estimate[(str(path), cfg.without_placement())] = got.projector_estimate
            self.forget()


def _ident(path: Path) -> tuple[str, int, int]:
    st = Path(path).stat()
    return (str(path), st.st_size, st.st_mtime_ns)
