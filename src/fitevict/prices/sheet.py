"""A price sheet: everything the planner's footprint function needs for one model file, read ahead, so that
pricing a configuration is computation only.

One sheet per file and the adapters its contract names (the planner varies the placement and the context, never
the adapters). It holds the file's parsed structure and identity (path, size, mtime), this machine's host buffer
table, the stored measurements (the newest of each signature), the correction learned from the file's accepted
loads, the engine's dry-run figures known so far (compute per configuration, context, projector estimate), the
engine process's overhead and, for a Hugging Face folder, the seat's own flags and the transformers overheads.
``PriceSheet.footprint(cfg)`` prices any configuration ``planner.plan`` tries (the placement rungs, the
largest-context search) without a file, database or socket access (``tests/test_purity.py`` runs a plan on a
real sheet under an audit hook).

``read_sheet`` builds one: blocking I/O, which the price book runs off the event loop (``prices.book``).
A sheet never changes once built; the book builds a new one when what it read changes, and each sheet carries the
version of the book's state it was built from (``version``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fitevict import planner as pl
from fitevict.engines.transformers.engine import hf_config
from fitevict.pricing import price as pricing
from fitevict.pricing.correction import Correction, apply_correction, correction
from fitevict.pricing.footprint import Footprint, as_stored
from fitevict.pricing.gguf import PricingError, load_structure
from fitevict.pricing.grown import Grown, with_grown
from fitevict.pricing.hf_price import price_hf
from fitevict.pricing.hostbufs import HostBuffers
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.logparse import PRECISION_BYTES
from fitevict.pricing.lora import LoraAdapter, load_adapter
from fitevict.pricing.peft import PeftAdapter, load_peft_adapter
from fitevict.pricing.projector import price_projector, with_projector
from fitevict.store.records import measurement_signature
from fitevict.pricing.process import model_terms
from fitevict.pricing.footprint import footprint_from_json
from fitevict.prices.overhead import with_engine_overhead

# a measured term sums at most three logged buffers (KV, SWA KV, recurrent state), each printed to +-0.005 MiB
LOG_TERM_PRECISION = 3 * PRECISION_BYTES

Ident = tuple[str, int, int]  # (path, size, mtime_ns): a file as it is on disk now


@dataclass(frozen=True, slots=True)
class SheetInputs:
    """What the price book knows of one file, copied without any I/O; ``read_sheet`` reads the rest."""

    path: Path
    loras: tuple[str, ...]  # the adapters of the configurations priced (GGUF LoRA files or PEFT folders)
    version: tuple[int, int]  # the book's state copied: (every file's, this file's)
    machine: str
    host: HostBuffers
    engine_overhead: Mapping[str, int]
    threads: int  # the threads a seat computes with, and whether ggml's tiled K-quant path runs: the work buffer
    tiled: bool
    learned: Mapping[Ident, Mapping[LoadConfig, Footprint]]  # accepted loads' measured buffers, by file identity
    compute: Mapping[LoadConfig, Mapping[str, int]]  # dry-run compute buffers, by configuration
    dry_context: Mapping[LoadConfig, Any]  # dry-run caches, by placement-free configuration
    projector_estimate: Mapping[LoadConfig, int]  # by placement-free configuration
    mmproj: Path | None
    extra_args: tuple[str, ...]  # an HF seat's own flags (dtype, quant, ...)
    torch_overhead: int | None
    peft_overhead: int | None
    # what seats of this file outgrew to on this machine, beyond their price, by file identity and configuration
    grown: Mapping[Ident, Mapping[LoadConfig, Grown]] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, tuple[str, ...]]:
        return (str(self.path), self.loras)


@dataclass(frozen=True, slots=True, eq=False)
class PriceSheet:
    """One file's prices, ready: ``footprint(cfg)`` is computation on this record only."""

    path: Path
    ident: Ident
    resolved: str  # the path with links resolved: a stored measurement's signature names it
    is_hf: bool
    structure: Any  # GgufStructure, or an HF folder's HfStructure
    quantization: str
    machine: str
    host: HostBuffers
    stored: Mapping[str, Mapping]  # signature -> the newest stored measurement's footprint document
    correction: Correction | None
    compute: Mapping[LoadConfig, Mapping[str, int]]
    dry_context: Mapping[LoadConfig, Any]
    projector: Any  # the projector file's structure, or None
    projector_estimate: Mapping[LoadConfig, int]
    engine_overhead: Mapping[str, int]
    threads: int
    tiled: bool
    loras: tuple[str, ...]
    lora_files: Mapping[str, LoraAdapter]  # a GGUF seat's LoRA adapters, read
    peft: Mapping[str, PeftAdapter]  # an HF seat's PEFT adapters, read
    extra_args: tuple[str, ...]
    torch_overhead: int | None
    peft_overhead: int | None
    version: tuple[int, int]
    grown: Mapping[LoadConfig, Grown]  # per configuration: what its seats outgrew to here (``pricing.grown``)
    # each configuration priced once (the planner asks for the same rung many times); what it holds follows from the
    # fields above, so the sheet stays what it was built as
    _priced: dict[LoadConfig, Footprint] = field(default_factory=dict, repr=False)

    @property
    def key(self) -> tuple[str, tuple[str, ...]]:
        return (str(self.path), self.loras)

    def signature(self, cfg: LoadConfig) -> str:
        """The stored-measurement key of this file under ``cfg`` on this machine (``PriceBook.signature``)."""
        return measurement_signature(path=self.resolved, size=self.ident[1], mtime_ns=self.ident[2],
                                     quantization=self.quantization, config=cfg.to_json(), machine=self.machine)

    def torch_overhead_for(self, adapters: tuple[str, ...]) -> int | None:
        """A transformers seat's own process bytes: with adapters, peft's libraries too (the plain seat's figure, a
        lower bound, until a seat with adapters was measured)."""
        return (self.peft_overhead or self.torch_overhead) if adapters else self.torch_overhead

    def footprint(self, cfg: LoadConfig) -> Footprint:
        """The measured footprint stored for this signature (labelled stored-measurement), else the price corrected
        by this file's accepted loads, with the model's projector; with the engine process's overhead, and what a
        seat of this configuration was seen to need beyond its price here (learned from its outgrowth)."""
        hit = self._priced.get(cfg)
        if hit is None:
            hit = self._priced[cfg] = with_grown(self._price(cfg), self.grown.get(cfg))
        return hit

    def _price(self, cfg: LoadConfig) -> Footprint:
        if cfg.loras != self.loras:
            raise ValueError(f"{self.path}: the price sheet holds adapters {list(self.loras)}, not {list(cfg.loras)}")
        if self.is_hf:
            # a transformers seat: priced from its headers (its walk equals that to the byte), with its own process
            # overhead as measured; a walk has no cache or activations to reuse, so no stored figure stands in
            hf = hf_config(cfg, extra_args=self.extra_args)
            return price_hf(self.structure, hf, overhead_bytes=self.torch_overhead_for(cfg.loras),
                            adapters=tuple(self.peft[a] for a in hf.adapters)).footprint
        stored = self.stored.get(self.signature(cfg))
        if stored is not None:
            fp = as_stored(footprint_from_json(dict(stored)))
        else:
            fp = pricing.price(self.structure, cfg, host=self.host, compute=self.compute.get(cfg),
                               context=self.dry_context.get(cfg.without_placement()), loras=self.lora_files).footprint
            fp = apply_correction(fp, self.correction)
            if self.projector is not None:
                estimate = self.projector_estimate.get(cfg.without_placement())
                fp = with_projector(fp, price_projector(self.projector, estimate))
        terms = model_terms(self.structure, cfg, self.host, n_threads=self.threads, tiled=self.tiled)
        return with_engine_overhead(fp, self.engine_overhead, terms=terms)  # with the parts that scale with the model


def hf_dtype(structure: Any) -> str:
    """The safetensors dtype holding the most bytes: an HF folder's quantization, for signatures."""
    by: dict[str, int] = {}
    for t in structure.tensors:
        by[t.dtype] = by.get(t.dtype, 0) + t.nbytes
    return "hf:" + (max(by, key=by.__getitem__) if by else "empty")


def correction_of(structure: Any, loads: Mapping[LoadConfig, Footprint], host: HostBuffers) -> Correction | None:
    """How far this file's formula was from what its accepted loads measured (any settings), per term."""
    pairs, seen = [], []
    for c, measured in loads.items():
        try:
            pairs.append((pricing.price(structure, c, host=host).footprint, measured))
        except PricingError:
            continue  # priced no more (the rules changed): nothing to learn from it
        seen.append(f"ctx {c.n_ctx}, " + pl.describe(c, structure.n_layer + 1))
    origin = "; ".join(seen[:4]) + (" ..." if len(seen) > 4 else "")
    return correction(pairs, origin, tolerance=LOG_TERM_PRECISION)


def read_sheet(inputs: SheetInputs, stored: Mapping[str, Mapping], structure: Callable[[Path], Any]) -> PriceSheet:
    """Read what ``inputs`` do not hold (the file's identity and structure, its projector's, its adapters') and build
    the sheet. Blocking I/O: off the event loop. ``stored``: the store's newest measurement of every signature;
    ``structure``: the price book's (cached) structure reader. Raises OSError or PricingError for a file that cannot
    be read or priced."""
    path = inputs.path
    st = path.stat()
    ident = (str(path), st.st_size, st.st_mtime_ns)
    is_hf = path.is_dir()
    s = structure(path)
    peft: dict[str, PeftAdapter] = {}
    if is_hf:
        hf = hf_config(LoadConfig(loras=inputs.loras), extra_args=inputs.extra_args)
        peft = {a: load_peft_adapter(a) for a in hf.adapters}
    return PriceSheet(
        path=path, ident=ident, resolved=str(path.resolve()), is_hf=is_hf, structure=s,
        quantization=hf_dtype(s) if is_hf else s.dominant_type(), machine=inputs.machine, host=inputs.host,
        stored=stored, correction=None if is_hf else correction_of(s, inputs.learned.get(ident, {}), inputs.host),
        compute=_frozen(inputs.compute), dry_context=_frozen(inputs.dry_context),
        projector=load_structure(inputs.mmproj) if inputs.mmproj is not None and not is_hf else None,
        projector_estimate=_frozen(inputs.projector_estimate), engine_overhead=_frozen(inputs.engine_overhead),
        threads=inputs.threads, tiled=inputs.tiled,
        loras=inputs.loras, lora_files=_frozen({} if is_hf else {a: load_adapter(a) for a in inputs.loras}),
        peft=_frozen(peft), extra_args=inputs.extra_args, torch_overhead=inputs.torch_overhead,
        peft_overhead=inputs.peft_overhead, version=inputs.version, grown=_frozen(inputs.grown.get(ident, {})))


def _frozen(d: Mapping) -> Mapping:
    return MappingProxyType(dict(d))
