"""The planner's frozen inputs (PlanRequest, Resident, Policy) and its output (Plan). Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from fitevict.config.records import ALLOC_MODES, PolicyConfig, default
from fitevict.pricing.footprint import Footprint
from fitevict.pricing.loadconfig import LoadConfig


Action = Literal["hit", "load", "partial", "ram", "wait", "refuse"]
AllocMode = Literal["gpu-only", "max-gpu", "max-ram", "ram-only", "explicit"]
LOADING_ACTIONS: tuple[str, ...] = ("load", "partial", "ram")

FootprintFn = Callable[[str, LoadConfig], Footprint]
"""Prices one model (by key) under one configuration. ``fitevict.pricing`` provides the real one."""


class PlanInvariantError(ValueError):
    """An input the planner cannot reason about (negative bytes, duplicate resident keys, ...)."""


EMPTY: Mapping[str, int] = MappingProxyType({})
PRIORITY_BAND = 1.25  # GreedyDual-Size priorities within this factor are ties (reload times are measured, noisy)


def _bytes_map(m: Mapping[str, int], what: str) -> Mapping[str, int]:
    out: dict[str, int] = {}
    for k, v in m.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise PlanInvariantError(f"{what}: bytes on {k} must be an int >= 0, got {v!r}")
        out[str(k)] = v
    return MappingProxyType(out)


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """What to load.

    ``config`` carries everything but the placement (ctx, -np, kv types, flash-attn, batch sizes,
    mmap); the placement fields (``n_gpu_layers``, ``n_cpu_moe``, ``devices``) are the planner's to
    choose, except in ``explicit`` mode where they are the caller's (empty ``devices`` with GPU
    layers then means every GPU in the budget). ``config.n_ctx == 0`` means the training context.

    ``n_layer`` counts the offloadable layers *including* the output pseudo-layer (the GGUF
    block_count + 1): ``-ngl n_layer`` puts everything on the GPU. ``n_moe_layers`` is the
    ``--n-cpu-moe`` value that moves every expert tensor to the CPU (the block count for a MoE model,
    0 for a dense one). ``pinned``/``protected`` are the flags the model will carry once resident;
    they do not change this plan.
    """

    key: str
    config: LoadConfig = LoadConfig()
    alloc_mode: AllocMode = "max-gpu"
    n_layer: int = 1
    n_moe_layers: int = 0
    n_ctx_train: int = 0
    pinned: bool = False
    protected: bool = False
    source: str = ""  # the file or folder a seat must have loaded to serve it ("": any file of the model serves)
    fixed: frozenset[str] | None = None  # LoadConfig fields a resident must match (None: all but placement)
    path: str = ""  # the file or folder a load of it reads (what it is priced from and started with)
    # the engine whose binary's own file pages its seat would share with the other seats of that engine
    # (``pricing.pages``): a load carries them (its footprint's ``pages``) only when no seat of it stays
    pages: str = ""
    # its quote: the price sheet it was priced with once, when it was queued (fitevict.prices.sheet.PriceSheet:
    # immutable, one version of the price book); the plan and the seat's prediction use it while it is current.
    # None: not quoted yet (a plan of the CLI, or a dry run), priced when planned
    quote: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.alloc_mode not in ALLOC_MODES:
            raise PlanInvariantError(f"{self.key}: alloc_mode {self.alloc_mode!r} is not one of {ALLOC_MODES}")
        if self.n_layer < 1:
            raise PlanInvariantError(f"{self.key}: n_layer {self.n_layer} < 1 (it counts the output layer too)")
        if not 0 <= self.n_moe_layers < self.n_layer:
            raise PlanInvariantError(
                f"{self.key}: n_moe_layers {self.n_moe_layers} must be in 0..{self.n_layer - 1} (the block count)"
            )
        if self.n_ctx_train < 0 or self.config.n_ctx < 0:
            raise PlanInvariantError(f"{self.key}: negative context size")


@dataclass(frozen=True, slots=True)
class Resident:
    """A loaded (or loading) model as the supervisor reports it.

    ``bytes`` per budget device; the host figure is mapped + committed. ``bytes_source`` says how
    they were obtained ("measured", "predicted" while loading, ...). ``last_used`` is on the same
    clock as the ``now`` passed to ``plan``. ``in_flight`` counts requests being served.
    """

    key: str
    config: LoadConfig
    bytes: Mapping[str, int]
    last_used: float = 0.0
    bytes_source: str = "measured"
    pinned: bool = False
    protected: bool = False
    in_flight: int = 0
    loading: bool = False
    source: str = ""  # the file or folder it was loaded from
    # GreedyDual-Size H above the scheduler's L (the ``cost`` eviction order): lowest goes first. Given above L, so
    # that a band of 25% measures the reload-cost term, not how far L has risen (then every seat would tie)
    priority: float = 0.0
    reload_seconds: float | None = None  # measured load time (None: never loaded here)
    outgrowing: bool = False  # its reading exceeded its price by more than budget.outgrow_margin: a victim first
    pages: str = ""  # the engine whose binary's own file pages it shares with the other seats of it (``pricing.pages``)
    carries: int = 0  # the bytes of those pages its host figure includes: the first seat of the engine carries them

    def __post_init__(self) -> None:
        object.__setattr__(self, "bytes", _bytes_map(self.bytes, f"resident {self.key}"))
        if self.in_flight < 0:
            raise PlanInvariantError(f"resident {self.key}: in_flight {self.in_flight} < 0")
        if not 0 <= self.carries <= self.bytes.get("CPU", 0):
            raise PlanInvariantError(f"resident {self.key}: carries {self.carries} B of shared pages, outside 0.."
                                     f"{self.bytes.get('CPU', 0)} B, its host figure")

    @property
    def evictable(self) -> bool:
        return not (self.pinned or self.protected or self.in_flight or self.loading)

    @property
    def busy(self) -> bool:
        """Not evictable now, but will be once its requests finish or its load completes."""
        return not (self.pinned or self.protected) and bool(self.in_flight or self.loading)


@dataclass(frozen=True, slots=True)
class Policy:
    """Knobs of the planner. ``min_ctx`` is the smallest context a refusal suggests."""

    exclusive_fraction: float = default(PolicyConfig, "exclusive_fraction")
    min_ctx: int = 512
    ctx_step: int = 256  # llama.cpp pads n_ctx to 256
    # the victim order: a registered eviction policy's name (``planner.eviction.POLICIES``); the config's default
    eviction: str = default(PolicyConfig, "eviction")

    def __post_init__(self) -> None:
        if not 0 < self.exclusive_fraction <= 1:
            raise PlanInvariantError(f"exclusive_fraction {self.exclusive_fraction} must be in (0, 1]")
        if self.ctx_step <= 0 or self.min_ctx < 0:
            raise PlanInvariantError(f"ctx_step {self.ctx_step} must be > 0 and min_ctx {self.min_ctx} >= 0")


class Eviction(NamedTuple):
    """One victim: its key, the bytes it frees per device, and why it was chosen."""

    key: str
    bytes: Mapping[str, int]
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    """The decision and the numbers that decided it. All byte maps are keyed by device name.

    ``needed_bytes``: what ``config`` needs (for a hit: what the resident holds).
    ``free_bytes_before``: budget minus every resident's bytes (negative when already over budget).
    ``free_bytes_after``: after executing the plan -- evictions done and the model loaded; for
    ``hit``, ``wait`` and ``refuse`` nothing is executed, so it equals ``free_bytes_before``.
    ``available_bytes``: free after every eviction the rules allow (what a refusal is measured against).
    ``evict`` is what executing the plan evicts now (empty for wait/refuse: their reasons name the
    residents that would have to go). ``largest_ctx`` is set on refusals when a smaller context fits.
    """

    action: Action
    key: str
    alloc_mode: AllocMode
    config: LoadConfig | None
    reason: str
    remedy: str = ""
    evict: tuple[Eviction, ...] = ()
    wait_for: tuple[str, ...] = ()
    needed_bytes: Mapping[str, int] = field(default_factory=lambda: EMPTY)
    free_bytes_before: Mapping[str, int] = field(default_factory=lambda: EMPTY)
    free_bytes_after: Mapping[str, int] = field(default_factory=lambda: EMPTY)
    available_bytes: Mapping[str, int] = field(default_factory=lambda: EMPTY)
    budget_bytes: Mapping[str, int] = field(default_factory=lambda: EMPTY)
    host_mapped_bytes: int = 0
    host_committed_bytes: int = 0
    exclusive: bool = False
    largest_ctx: int | None = None
    footprint: Footprint | None = field(default=None, compare=False)
    split: str = ""  # where a split over several GPUs came from (free memory, or the request's -ts); "" otherwise

    @property
    def fits(self) -> bool:
        """True when the model is (or after executing the plan will be) resident."""
        return self.action == "hit" or self.action in LOADING_ACTIONS

    @property
    def evict_keys(self) -> tuple[str, ...]:
        return tuple(e.key for e in self.evict)

    def to_json(self) -> dict:
        return {
            "action": self.action,
            "key": self.key,
            "alloc_mode": self.alloc_mode,
            "config": None if self.config is None else self.config.to_json(),
            "placement": None if self.config is None else {
                "n_gpu_layers": self.config.n_gpu_layers if self.config.devices else 0,
                "n_cpu_moe": self.config.n_cpu_moe, "ctx": self.config.n_ctx, "devices": list(self.config.devices),
                "cache_type_k": self.config.cache_type_k, "cache_type_v": self.config.cache_type_v,
                "flash_attn": self.config.flash_attn, "parallel": self.config.n_parallel,
                **({"tensor_split": list(self.config.tensor_split), "split": self.split}
                   if self.config.tensor_split else {})},
            "reason": self.reason,
            "remedy": self.remedy,
            "evict": [{"key": e.key, "bytes": dict(e.bytes), "reason": e.reason} for e in self.evict],
            "wait_for": list(self.wait_for),
            "needed_bytes": dict(self.needed_bytes),
            "free_bytes_before": dict(self.free_bytes_before),
            "free_bytes_after": dict(self.free_bytes_after),
            "available_bytes": dict(self.available_bytes),
            "budget_bytes": dict(self.budget_bytes),
            "host_mapped_bytes": self.host_mapped_bytes,
            "host_committed_bytes": self.host_committed_bytes,
            "exclusive": self.exclusive,
            "largest_ctx": self.largest_ctx,
            "footprint": None if self.footprint is None else self.footprint.to_json(),
        }
