"""What one request asks of a seat (``Ask``), built once, at the door, before anything waits or loads.

The request's contract (``contract``) and the model's settings become the ``LoadConfig`` a seat would start with
(``load_config_for``), the file it would read, and the planner's request (``plan_request``): the scheduler queues
it, the planner places it, and the effects start the engine from it, without building it again.

Pure but for what it reads of the model's file, through the ``Shapes`` port (the price book: its structure,
cached; what this machine learned of it), and for a contract that names a GGUF file, which is looked up in the
model's folder (``catalog.resolve_gguf_file``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fitevict import planner as pl
from fitevict.engines import traits
from fitevict.pricing.cmdline import absorb_memory_flags
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.request.catalog import CatalogEntry, resolve_gguf_file
from fitevict.request.contract import ADAPTER_KINDS, Contract, fixed_fields, seat_key

DEFAULT_CTX = 4096


class Shapes(Protocol):
    """What building a request reads of a model's file (the price book's answers, cached there)."""

    default_alloc_mode: str

    @property
    def version(self) -> Any:
        """Moves whenever one of the answers below may have (a rescan, a learned crash, a file read again)."""

    def shape(self, path: Path) -> Any:
        """Offloadable layers (``n_layer``), whether it is MoE (``is_moe``), its training context (``n_ctx_train``)."""

    def context(self, path: Path, cfg: LoadConfig) -> int:
        """The context a seat of ``cfg`` starts with when ``cfg.n_ctx`` is 0 (the model's own)."""

    def repacks(self, path: Path) -> bool:
        """Whether the engine may repack ``path``'s weights here (False once repacking crashed it on this machine)."""


@dataclass(frozen=True, slots=True)
class Ask:
    """One request for a seat: the model asked for, its contract, and what a load for it would be (``request``: the
    planner's request, whose ``config`` is the LoadConfig and whose ``path`` is the file)."""

    entry: CatalogEntry
    contract: Contract | None
    request: pl.PlanRequest

    @property
    def key(self) -> str:
        """The seat that serves it (an adapter's is its base's)."""
        return self.request.key

    @property
    def path(self) -> Path:
        return Path(self.request.path)

    @property
    def keep_alive(self) -> float | None:
        return self.contract.keep_alive if self.contract is not None else None


def ask(entry: CatalogEntry, contract: Contract | None, shapes: Shapes) -> Ask:
    """The request ``entry`` under ``contract`` asks for. A context of 0 (asked, or configured) becomes the model's
    own, so that the seat starts with the explicit context it was priced for. Raises ``GgufFileError`` for a
    ``gguf_file`` the model does not have, and ``PricingError``/``OSError`` for a file that cannot be read."""
    cfg, mode, path = load_config_for(entry, contract, shapes.default_alloc_mode)
    if traits(entry.engine).repacks and cfg.repack and not shapes.repacks(path):
        cfg = cfg.with_(repack=False)
    if cfg.n_ctx == 0:
        cfg = cfg.with_(n_ctx=shapes.context(path, cfg))
    named_file = contract is not None and contract.gguf_file is not None
    return Ask(entry, contract, plan_request(entry, cfg, mode, shapes.shape(path), source=path if named_file else None,
                                             contract=contract if contract is not None else Contract(), path=path))


class Asks:
    """The asks built so far, by model and contract, while what they were read from stands (``Shapes.version``; the
    same catalog entry): the door asks once per request, and most requests ask what an earlier one asked."""

    LIMIT = 4096  # built asks kept at most (all dropped at once past it)

    def __init__(self, shapes: Shapes) -> None:
        self.shapes = shapes
        self._built: dict[tuple[str, Contract | None], Ask] = {}
        self._version: Any = None

    def __call__(self, entry: CatalogEntry, contract: Contract | None) -> Ask:
        version = self.shapes.version
        if version != self._version or len(self._built) >= self.LIMIT:
            self._built.clear()
            self._version = version
        hit = self._built.get((entry.key, contract))
        if hit is None or hit.entry is not entry:  # a rescan's new entry for the same key is built anew
            hit = self._built[(entry.key, contract)] = ask(entry, contract, self.shapes)
        return hit


def load_config_for(entry: CatalogEntry, contract: Contract | None,
                    default_alloc_mode: str) -> tuple[LoadConfig, str, Path]:
    """The LoadConfig a model starts with (model settings, then the request's contract), its
    allocation mode, and the file to load. An adapter starts its base's seat: the base's file, with every
    adapter of that base (``loras``: GGUF files for llama-server's ``--lora``, PEFT folders for a transformers
    seat's ``--adapter``), the same configuration whichever adapter is asked for."""
    c = contract or Contract()
    s = entry.settings
    kv = c.kv_cache_type
    cfg = LoadConfig(
        n_ctx=c.ctx if c.ctx is not None else (s.ctx if s.ctx is not None else DEFAULT_CTX),
        n_parallel=c.parallel or s.parallel or 1,
        cache_type_k=kv or s.cache_type_k or "f16",
        cache_type_v=kv or s.cache_type_v or "f16",
        flash_attn=("on" if c.flash_attn else "off") if c.flash_attn is not None else (s.flash_attn or "auto"),
        n_gpu_layers=c.n_gpu_layers if c.n_gpu_layers is not None else (s.n_gpu_layers or 0),
        n_cpu_moe=c.n_cpu_moe if c.n_cpu_moe is not None else (s.n_cpu_moe or 0),
        # an embeddings seat (the model's settings, or a route that needs one): its output buffer is priced as it grows
        embeddings=c.embeddings if c.embeddings is not None else bool(s.embeddings),
        loras=tuple(str(p) for p in entry.loras),
    )
    if traits(entry.engine).memory_flags_priced:
        cfg = absorb_memory_flags(cfg, s.extra_args)[0]  # -nr among the extra arguments is priced
    mode = c.alloc_mode or s.alloc_mode or default_alloc_mode
    path = Path(entry.base_path if entry.base_path is not None else entry.path)
    if c.gguf_file:
        path = resolve_gguf_file(entry, c.gguf_file)
    return cfg, mode, path


def passthrough_args(entry: CatalogEntry) -> tuple[str, ...]:
    """A model's extra arguments (``engine.extra_args`` first) less those its LoadConfig carries: what goes on the
    engine's command line as given, after the flags the argv builder spells from the LoadConfig."""
    if not traits(entry.engine).memory_flags_priced:
        return tuple(entry.settings.extra_args)
    return absorb_memory_flags(LoadConfig(), entry.settings.extra_args)[1]


def plan_request(entry: CatalogEntry, cfg: LoadConfig, mode: str, structure: Any, *,
                 source: Path | None = None, contract: Contract | None = None,
                 fixed: frozenset[str] | None = None, path: Path | None = None) -> pl.PlanRequest:
    """The planner's request for ``entry``: n_layer counts the output pseudo-layer too. ``path``: the file a load
    reads; ``source``: the file a seat must have loaded to serve it (a request that names its GGUF file).

    ``fixed`` defaults to every non-placement field (a dry run asks for exactly ``cfg``); a request passes its
    contract's fields, so a request that names none is served by any resident seat of the model.
    """
    if fixed is None and contract is not None:
        fixed = fixed_fields(contract)
    if fixed is not None and entry.kind in ADAPTER_KINDS:
        fixed = fixed | {"loras"}  # an adapter needs a seat that loaded it: a seat with another set restarts
    return pl.PlanRequest(
        key=seat_key(entry), config=cfg, alloc_mode=mode, n_layer=structure.n_layer + 1,  # type: ignore[arg-type]
        n_moe_layers=structure.n_layer if structure.is_moe else 0, n_ctx_train=structure.n_ctx_train,
        pinned=entry.pinned, source=str(Path(source).resolve()) if source is not None else "", fixed=fixed,
        path=str(path) if path is not None else "", pages=entry.engine,
    )
