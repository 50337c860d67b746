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

from fitevict.engines import PricerBase, pricer_for
from fitevict.pricing.correction import Correction
from fitevict.pricing.footprint import Footprint
from fitevict.pricing.grown import Grown, with_grown
from fitevict.pricing.hostbufs import HostBuffers
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.lora import LoraAdapter
from fitevict.pricing.pages import SharedPages
from fitevict.pricing.peft import PeftAdapter
from fitevict.store.records import measurement_signature
from fitevict.prices.overhead import with_engine_overhead

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
    engine_pages: SharedPages | None  # the engine binary's own file pages (``pricing.pages``), None: none apart
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
    pricer: PricerBase  # the family's that prices this file's kind (``fitevict.engines.pricer_for``)
    structure: Any  # as the family reads it: a GgufStructure, an HF folder's HfStructure
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
    engine_pages: SharedPages | None
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
        fp, terms = self.pricer.price(self, cfg)  # terms: the parts of the engine process that scale with the model
        return fp if terms is None else with_engine_overhead(fp, self.engine_overhead, terms=terms,
                                                             pages=self.engine_pages)


def read_sheet(inputs: SheetInputs, stored: Mapping[str, Mapping], structure: Callable[[Path], Any]) -> PriceSheet:
    """Read what ``inputs`` do not hold (the file's identity and structure, its projector's, its adapters') and build
    the sheet. Blocking I/O: off the event loop. ``stored``: the store's newest measurement of every signature;
    ``structure``: the price book's (cached) structure reader. Raises OSError or PricingError for a file that cannot
    be read or priced."""
    path = inputs.path
    st = path.stat()
    ident = (str(path), st.st_size, st.st_mtime_ns)
    pricer = pricer_for(path)
    s = structure(path)
    parts = {"correction": None, "projector": None, "lora_files": {}, "peft": {}} | pricer.sheet_parts(
        s, ident=ident, loras=inputs.loras, extra_args=inputs.extra_args, learned=inputs.learned, host=inputs.host,
        mmproj=inputs.mmproj)
    return PriceSheet(
        path=path, ident=ident, resolved=str(path.resolve()), pricer=pricer, structure=s,
        quantization=pricer.quantization(s), machine=inputs.machine, host=inputs.host, stored=stored,
        correction=parts["correction"], compute=_frozen(inputs.compute), dry_context=_frozen(inputs.dry_context),
        projector=parts["projector"], projector_estimate=_frozen(inputs.projector_estimate),
        engine_overhead=_frozen(inputs.engine_overhead), engine_pages=inputs.engine_pages, threads=inputs.threads, tiled=inputs.tiled,
        loras=inputs.loras, lora_files=_frozen(parts["lora_files"]), peft=_frozen(parts["peft"]),
        extra_args=inputs.extra_args, torch_overhead=inputs.torch_overhead, peft_overhead=inputs.peft_overhead,
        version=inputs.version, grown=_frozen(inputs.grown.get(ident, {})))


def _frozen(d: Mapping) -> Mapping:
    return MappingProxyType(dict(d))
