"""The placement planner: which configuration to load, what to evict, or why nothing fits.

PURE: no I/O, no logging, no clock (the caller passes ``now``). The same call is the dry run.

``plan(request, residents, budget, footprints, policy, now) -> Plan`` reads a snapshot of what is
resident and a budget per device (GPUs and host RAM, ``"CPU"``), prices candidate configurations
through ``footprints`` (a pricing function), and returns frozen data that carries every number that
decided it. "Doesn't fit" is a ``refuse`` plan, not an exception; only broken invariants raise.

Bytes per device: a GPU counts the model's device buffers; the host counts mapped + committed bytes
(mapped weights count against RAM like committed ones; the split is reported, never used to
over-commit). A device is checked where the new model needs bytes on it.

Placement ladder (``max-gpu`` / ``max-ram``), ordered from most to least GPU use, as llama.cpp's own
``--fit`` does it: all layers on the GPU(s); then, for MoE models, the experts of the first 1..M
layers moved to the CPU (``--n-cpu-moe``); then fewer layers (``-ngl``) with every expert on the CPU;
last, a CPU-only load (``-dev none``). ``max-gpu`` takes the first rung that fits, ``max-ram`` the
last. GPU bytes fall and host bytes rise along the ladder, so the rungs that fit the GPUs are a
suffix and those that fit the host a prefix; both are found by bisection, and the chosen rung is
always re-checked against every device.

Evictions: only residents that are not pinned, protected, serving requests (``in_flight``) or loading
are evicted; least recently used first, ties by most bytes on the devices that are short, only as
many as needed, then every victim whose removal was not needed is dropped again (so removing any
one victim from the set makes the load not fit). A model whose footprint exceeds
``policy.exclusive_fraction`` of a device's budget is *exclusive* and evicts everything evictable.
When a load would fit only once busy residents are gone, the plan is ``wait`` with their keys.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Literal, NamedTuple

from fitevict.host.budget import Budget
from fitevict.pricing.footprint import HOST, Footprint
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.units import format_size

Action = Literal["hit", "load", "partial", "ram", "wait", "refuse"]
AllocMode = Literal["gpu-only", "max-gpu", "max-ram", "ram-only", "explicit"]
ALLOC_MODES: tuple[str, ...] = ("gpu-only", "max-gpu", "max-ram", "ram-only", "explicit")
LOADING_ACTIONS: tuple[str, ...] = ("load", "partial", "ram")

FootprintFn = Callable[[str, LoadConfig], Footprint]
"""Prices one model (by key) under one configuration. ``fitevict.pricing`` provides the real one."""


class PlanInvariantError(ValueError):
    """An input the planner cannot reason about (negative bytes, duplicate resident keys, ...)."""


_EMPTY: Mapping[str, int] = MappingProxyType({})


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "bytes", _bytes_map(self.bytes, f"resident {self.key}"))
        if self.in_flight < 0:
            raise PlanInvariantError(f"resident {self.key}: in_flight {self.in_flight} < 0")

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

    exclusive_fraction: float = 0.5
    min_ctx: int = 512
    ctx_step: int = 256  # llama.cpp pads n_ctx to 256

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
    needed_bytes: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    free_bytes_before: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    free_bytes_after: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    available_bytes: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    budget_bytes: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    host_mapped_bytes: int = 0
    host_committed_bytes: int = 0
    exclusive: bool = False
    largest_ctx: int | None = None
    footprint: Footprint | None = field(default=None, compare=False)

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
                "flash_attn": self.config.flash_attn, "parallel": self.config.n_parallel},
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


# ---------------------------------------------------------------------------------------------
# placement candidates


_PLACEMENT_FIELDS = ("n_gpu_layers", "n_cpu_moe", "devices")
_ALL_FIELDS = tuple(f.name for f in fields(LoadConfig))
_OTHER_FIELDS = tuple(f for f in _ALL_FIELDS if f not in _PLACEMENT_FIELDS)


def _non_placement(c: LoadConfig) -> tuple:
    return tuple(getattr(c, f) for f in _OTHER_FIELDS)


def _derive(c: LoadConfig, **changes: object) -> LoadConfig:
    """``c`` with ``changes``: LoadConfig.with_ without dataclasses.replace's per-call field walk."""
    return LoadConfig(*[changes[f] if f in changes else getattr(c, f) for f in _ALL_FIELDS])  # type: ignore[arg-type]


def _all_layers(c: LoadConfig, n_layer: int) -> bool:
    return c.n_gpu_layers < 0 or c.n_gpu_layers >= n_layer


def action_of(c: LoadConfig, n_layer: int) -> Action:
    """``ram`` with no GPU layers, ``load`` with every layer and expert on the GPU, else ``partial``."""
    if not c.devices or c.n_gpu_layers == 0:
        return "ram"
    if _all_layers(c, n_layer) and c.n_cpu_moe == 0:
        return "load"
    return "partial"


def compatible(resident: LoadConfig, request: PlanRequest) -> bool:
    """Whether a resident configuration serves the request: the same LoadConfig, except for the
    placement fields the alloc mode leaves to the planner (any placement serves max-gpu/max-ram)."""
    if _non_placement(resident) != _non_placement(request.config):
        return False
    mode = request.alloc_mode
    if mode == "explicit":
        want = request.config
        return (
            resident.n_cpu_moe == want.n_cpu_moe
            and (resident.n_gpu_layers == want.n_gpu_layers
                 or (_all_layers(resident, request.n_layer) and _all_layers(want, request.n_layer)))
            and (not want.devices or resident.devices == want.devices)
        )
    if mode == "gpu-only":
        return action_of(resident, request.n_layer) == "load"
    if mode == "ram-only":
        return action_of(resident, request.n_layer) == "ram"
    return True


class _Rungs:
    """The candidate configurations for one request at one ctx, most GPU first (see module doc)."""

    __slots__ = ("base", "gpus", "L", "M", "kind", "made")

    def __init__(self, request: PlanRequest, gpus: tuple[str, ...], n_ctx: int) -> None:
        self.L, self.M = request.n_layer, request.n_moe_layers
        self.made: dict[int, LoadConfig] = {}
        mode = request.alloc_mode
        if mode == "explicit":
            c = request.config if request.config.n_ctx == n_ctx else _derive(request.config, n_ctx=n_ctx)
            if not c.devices and c.n_gpu_layers != 0:
                c = _derive(c, devices=gpus)
            self.base, self.gpus, self.kind = c, c.devices, "explicit"
            return
        self.base = _derive(request.config, n_ctx=n_ctx, n_gpu_layers=0, n_cpu_moe=0, devices=())
        self.gpus = request.config.devices or gpus
        if mode == "ram-only" or not self.gpus:
            self.kind = "ram"
        elif mode == "gpu-only":
            self.kind = "full"
        else:
            self.kind = "ladder"

    def __len__(self) -> int:
        return self.L + self.M + 2 if self.kind == "ladder" else 1

    def __getitem__(self, i: int) -> LoadConfig:
        c = self.made.get(i)
        if c is None:
            c = self.made[i] = self._make(i)
        return c

    def _make(self, i: int) -> LoadConfig:
        if self.kind == "explicit":
            return self.base
        if self.kind == "ram" or (self.kind == "ladder" and i == self.L + self.M + 1):
            return self.base
        if self.kind == "full" or i <= self.M:  # every layer on the GPU, experts of the first i layers on CPU
            return _derive(self.base, devices=self.gpus, n_gpu_layers=self.L, n_cpu_moe=0 if self.kind == "full" else i)
        ngl = self.L - (i - self.M)  # fewer layers, every expert on the CPU
        return _derive(self.base, devices=self.gpus, n_gpu_layers=ngl, n_cpu_moe=self.M if ngl else 0)


class _Unpriced(Exception):
    """A footprint with an unavailable term: the planner cannot decide on it."""


class _Prices:
    """Prices configurations of one model, once each, as bytes per budget device."""

    __slots__ = ("key", "fn", "cache")

    def __init__(self, key: str, fn: FootprintFn) -> None:
        self.key, self.fn = key, fn
        self.cache: dict[LoadConfig, tuple[Footprint, dict[str, int]]] = {}

    def __call__(self, c: LoadConfig) -> tuple[Footprint, dict[str, int]]:
        hit = self.cache.get(c)
        if hit is not None:
            return hit
        fp = self.fn(self.key, c)
        if fp.host_source == "unavailable" or not all(d.complete for d in fp.devices):
            missing = [
                f"{d.name} {name}: {t.reason}" for d in fp.devices for name, t in d._terms() if t.bytes is None
            ]
            if fp.host_source == "unavailable":
                missing.append("host mapped/committed split unavailable")
            raise _Unpriced("; ".join(missing))
        if fp.host_mapped_bytes < 0 or fp.host_committed_bytes < 0:
            raise PlanInvariantError(
                f"footprint of {self.key}: negative host bytes "
                f"(mapped {fp.host_mapped_bytes}, committed {fp.host_committed_bytes})"
            )
        need = {HOST: fp.bytes_on(HOST)}
        for g in fp.gpu_names:
            need[g] = need.get(g, 0) + fp.bytes_on(g)
        self.cache[c] = (fp, need)
        return fp, need


def _ok(need: Mapping[str, int], room: Mapping[str, int], host: bool | None = None) -> bool:
    """Every device the need touches has room; ``host`` restricts to the host (True) or GPUs (False)."""
    for d, n in need.items():
        if n > 0 and (host is None or (d == HOST) == host) and n > room.get(d, 0):
            return False
    return True


def _search(
    rungs: _Rungs, price: _Prices, room: Mapping[str, int], prefer_gpu: bool, lo: int = 0, hi: int | None = None
) -> tuple[int | None, int]:
    """(index of the preferred rung that fits, or None; the boundary rung, reported when none fits).

    The boundary is the first rung whose GPU needs fit (max-gpu) or the last whose host needs fit
    (max-ram). ``lo``/``hi`` bound it when the caller knows more (the largest-ctx search does).
    """
    n = len(rungs)
    need = lambda i: price(rungs[i])[1]  # noqa: E731
    if n == 1:
        return (0 if _ok(need(0), room) else None), 0
    hi = n - 1 if hi is None else hi
    if prefer_gpu:
        if _ok(need(lo), room):
            return lo, lo
        if _ok(need(lo), room, host=False):  # GPUs fit here but the host doesn't: it won't lower down
            return None, lo
        if not _ok(need(hi), room, host=False):
            return None, hi
        a, b = lo + 1, hi  # first rung whose GPU need fits
        while a < b:
            mid = (a + b) // 2
            if _ok(need(mid), room, host=False):
                b = mid
            else:
                a = mid + 1
        return (a if _ok(need(a), room) else None), a
    if _ok(need(hi), room):
        return hi, hi
    if _ok(need(hi), room, host=True):  # host fits here, GPUs don't: they won't higher up
        return None, hi
    if not _ok(need(lo), room, host=True):
        return None, lo
    a, b = lo, hi - 1  # last rung whose host need fits
    while a < b:
        mid = (a + b + 1) // 2
        if _ok(need(mid), room, host=True):
            a = mid
        else:
            b = mid - 1
    return (a if _ok(need(a), room) else None), a


# ---------------------------------------------------------------------------------------------
# victims


def _sum(rs: Iterable[Resident], devices: Iterable[str]) -> dict[str, int]:
    out = dict.fromkeys(devices, 0)
    for r in rs:
        for d, n in r.bytes.items():
            if d in out:
                out[d] += n
    return out


def _covers(victims: Iterable[Resident], short: Mapping[str, int]) -> bool:
    got = _sum(victims, short)
    return all(got[d] >= s for d, s in short.items())


def _choose(short: Mapping[str, int], pool: list[Resident]) -> list[Resident]:
    """LRU-first victims from ``pool`` covering every shortfall, then pruned to a minimal set."""
    if not short:
        return []
    order = sorted(pool, key=lambda r: (r.last_used, -sum(r.bytes.get(d, 0) for d in short), r.key))
    left = dict(short)
    chosen: list[Resident] = []
    for r in order:
        if all(v <= 0 for v in left.values()):
            break
        if not any(left[d] > 0 and r.bytes.get(d, 0) > 0 for d in left):
            continue
        chosen.append(r)
        for d in left:
            left[d] -= r.bytes.get(d, 0)
    for r in reversed(list(chosen)):  # newest choices first: keep the least recently used ones
        rest = [v for v in chosen if v is not r]
        if _covers(rest, short):
            chosen = rest
    return chosen


# ---------------------------------------------------------------------------------------------
# words


def _gib(n: int) -> str:
    return format_size(n)


def _keys(rs: Iterable[Resident], most: int = 8) -> str:
    keys = [r.key for r in rs]
    more = f", ... ({len(keys) - most} more)" if len(keys) > most else ""
    return "[" + ", ".join(keys[:most]) + more + "]"


def describe(c: LoadConfig, n_layer: int) -> str:
    """Placement in words: "all 33 layers on CUDA0", "20 of 33 layers on CUDA0", "CPU only"."""
    if action_of(c, n_layer) == "ram":
        return "CPU only" if not c.devices else f"CPU weights, compute on {'+'.join(c.devices)}"
    on = "+".join(c.devices)
    layers = f"all {n_layer} layers" if _all_layers(c, n_layer) else f"{c.n_gpu_layers} of {n_layer} layers"
    moe = f", experts of the first {c.n_cpu_moe} layers on CPU" if c.n_cpu_moe else ""
    return f"{layers} on {on}{moe}"


def _ctx_words(c: LoadConfig, n_ctx_train: int) -> str:
    if c.n_ctx:
        return f"ctx {c.n_ctx}"
    return f"training ctx {n_ctx_train}" if n_ctx_train else "training ctx"


def _per_device(m: Mapping[str, int], devices: Iterable[str]) -> str:
    return " and ".join(f"{_gib(m.get(d, 0))} on {d}" for d in devices)


# ---------------------------------------------------------------------------------------------
# the planner


def plan(
    request: PlanRequest,
    residents: Iterable[Resident],
    budget: Budget,
    footprints: FootprintFn,
    policy: Policy,
    now: float,
) -> Plan:
    """Decide how to serve ``request`` (see the module docstring). Pure; ``now`` dates the LRU reasons."""
    res = tuple(residents)
    seen: set[str] = set()
    for r in res:
        if r.key in seen:
            raise PlanInvariantError(f"resident key {r.key!r} appears twice in the snapshot")
        seen.add(r.key)

    budget_b = {d: budget.budget_bytes(d) for d in budget.names}
    held = dict.fromkeys(budget_b, 0)
    for r in res:
        for d, n in r.bytes.items():
            held[d] = held.get(d, 0) + n
    devices: list[str] = list(held)
    for d in devices:
        budget_b.setdefault(d, 0)
    free_before = {d: budget_b[d] - held[d] for d in devices}
    price = _Prices(request.key, footprints)

    def fill(m: Mapping[str, int], devs: list[str]) -> Mapping[str, int]:
        return MappingProxyType({d: m.get(d, 0) for d in devs})

    # -- hit, or the same key resident under another configuration
    same = next((r for r in res if r.key == request.key), None)
    forced: list[Resident] = []
    if same is not None:
        fits_now = compatible(same.config, request)
        if same.loading or fits_now:
            # a hit (or a load of it under way): nothing moves; needed_bytes is what it holds
            before = fill(free_before, devices)
            if same.loading:
                action: Action = "wait"
                reason = f"{request.key} is loading; wait for it"
            else:
                action = "hit"
                reason = (f"{request.key} is resident ({describe(same.config, request.n_layer)}, "
                          f"{_ctx_words(same.config, request.n_ctx_train)})")
            return Plan(
                action, request.key, request.alloc_mode, same.config, reason,
                wait_for=(same.key,) if same.loading else (), needed_bytes=fill(same.bytes, devices),
                free_bytes_before=before, free_bytes_after=before, available_bytes=before,
                budget_bytes=fill(budget_b, devices),
            )
        if same.in_flight:
            before = fill(free_before, devices)
            return Plan(
                "wait", request.key, request.alloc_mode, None,
                f"{request.key} is serving {same.in_flight} request(s) under another configuration; "
                "it can be replaced once they finish",
                wait_for=(same.key,), needed_bytes=fill(_EMPTY, devices), free_bytes_before=before,
                free_bytes_after=before, available_bytes=before, budget_bytes=fill(budget_b, devices),
            )
        forced = [same]

    others = [r for r in res if r is not same]
    pool = [r for r in others if r.evictable]
    busy = [r for r in others if r.busy]
    blockers = [r for r in others if r.pinned or r.protected]
    freed_forced = _sum(forced, devices)
    avail = {d: free_before[d] + freed_forced[d] for d in devices}
    for r in pool:
        for d, n in r.bytes.items():
            avail[d] += n
    avail_wait = dict(avail)
    for r in busy:
        for d, n in r.bytes.items():
            avail_wait[d] += n
    prefer_gpu = request.alloc_mode != "max-ram"
    n_ctx = request.config.n_ctx

    def refusal(reason: str, remedy: str, config: LoadConfig | None = None, need: Mapping[str, int] = _EMPTY,
                fp: Footprint | None = None, largest: int | None = None) -> Plan:
        devs = devices + [d for d in need if d not in devices]
        return Plan(
            "refuse", request.key, request.alloc_mode, config, reason, remedy,
            needed_bytes=fill(need, devs), free_bytes_before=fill(free_before, devs),
            free_bytes_after=fill(free_before, devs), available_bytes=fill(avail, devs),
            budget_bytes=fill(budget_b, devs), largest_ctx=largest,
            host_mapped_bytes=fp.host_mapped_bytes if fp else 0,
            host_committed_bytes=fp.host_committed_bytes if fp else 0, footprint=fp,
        )

    rungs = _Rungs(request, budget.gpu_names, n_ctx)
    if request.alloc_mode == "gpu-only" and not rungs.gpus:
        return refusal(
            f"{request.key}: alloc mode gpu-only but the budget has no GPU ({', '.join(budget.names) or 'no devices'})",
            "use alloc mode max-gpu or ram-only, or run where a GPU is visible",
        )
    found_w: int | None = None
    try:
        found, shown = _search(rungs, price, avail, prefer_gpu)
        if found is None and busy:
            found_w = _search(rungs, price, avail_wait, prefer_gpu)[0]
    except _Unpriced as e:
        return refusal(f"{request.key} cannot be priced: {e}", "run a dry run to measure the missing terms")

    if found is not None:
        config = rungs[found]
        fp, need = price(config)
        devs = devices + [d for d in need if d not in devices]
        exclusive = any(
            n > 0 and budget_b.get(d, 0) > 0 and n > policy.exclusive_fraction * budget_b[d] for d, n in need.items()
        )
        short = {d: n - free_before.get(d, 0) - freed_forced.get(d, 0) for d, n in need.items() if n > 0}
        short = {d: s for d, s in short.items() if s > 0}
        victims = list(pool) if exclusive else _choose(short, pool)
        evict: list[Eviction] = []
        for r in forced:
            evict.append(Eviction(r.key, r.bytes, "replace: resident with a different configuration"))
        for r in sorted(victims, key=lambda r: (r.last_used, r.key)):
            if exclusive:
                top = max((d for d in need if budget_b.get(d, 0) > 0), key=lambda d: need[d] / budget_b[d])
                why = (f"exclusive: {request.key} needs {_gib(need[top])} of {_gib(budget_b[top])} on {top} "
                       f"(> {policy.exclusive_fraction:.0%})")
            else:
                helps = [d for d in short if r.bytes.get(d, 0) > 0]
                why = (f"least recently used (idle {max(0.0, now - r.last_used):.0f} s); frees "
                       f"{_per_device(r.bytes, helps)}")
            evict.append(Eviction(r.key, r.bytes, why))
        gone = _sum([*forced, *victims], devs)
        after = {d: free_before.get(d, 0) + gone[d] - need.get(d, 0) for d in devs}
        action = action_of(config, request.n_layer)
        reason = (f"{request.key}: {describe(config, request.n_layer)}, {_ctx_words(config, request.n_ctx_train)}; "
                  f"needs {_per_device(need, [d for d in devs if need.get(d, 0)])}")
        if evict:
            reason += f"; evicts {'[' + ', '.join(e.key for e in evict) + ']'}"
        if action != "load" and prefer_gpu and rungs.kind == "ladder" and found > 0:
            top_need = price(rungs[0])[1]
            reason += f" (all layers on the GPU would need {_per_device(top_need, [d for d in top_need if d != HOST])})"
        return Plan(
            action, request.key, request.alloc_mode, config, reason,
            evict=tuple(evict), needed_bytes=fill(need, devs), free_bytes_before=fill(free_before, devs),
            free_bytes_after=MappingProxyType(after), available_bytes=fill(avail, devs),
            budget_bytes=fill(budget_b, devs), host_mapped_bytes=fp.host_mapped_bytes,
            host_committed_bytes=fp.host_committed_bytes, exclusive=exclusive, footprint=fp,
        )

    if found_w is not None:
        config = rungs[found_w]
        fp, need = price(config)
        devs = devices + [d for d in need if d not in devices]
        short = {d: n - free_before.get(d, 0) - freed_forced.get(d, 0) for d, n in need.items() if n > 0}
        short = {d: s for d, s in short.items() if s > 0}
        chosen = _choose(short, pool + busy)
        waits = tuple(r.key for r in chosen if r.busy)
        also = [r for r in chosen if not r.busy]
        reason = (f"{request.key} needs {_per_device(need, [d for d in short])} at "
                  f"{_ctx_words(config, request.n_ctx_train)}; it fits once {', '.join(waits)} "
                  f"finish{'es' if len(waits) == 1 else ''} serving or loading"
                  + (f" (then evicting {_keys(also)})" if also else ""))
        return Plan(
            "wait", request.key, request.alloc_mode, config, reason, "retry when they are idle",
            wait_for=waits, needed_bytes=fill(need, devs), free_bytes_before=fill(free_before, devs),
            free_bytes_after=fill(free_before, devs), available_bytes=fill(avail, devs),
            budget_bytes=fill(budget_b, devs), host_mapped_bytes=fp.host_mapped_bytes,
            host_committed_bytes=fp.host_committed_bytes, footprint=fp,
        )

    # -- refuse: what it needs, what is available after every allowed eviction, the largest ctx
    config = rungs[shown]
    fp, need = price(config)
    binding = [d for d, n in need.items() if n > 0 and n > avail.get(d, 0)]
    asked = n_ctx or request.n_ctx_train
    smallest = -(-max(policy.min_ctx, 1) // policy.ctx_step) * policy.ctx_step
    largest = None
    try:
        if asked > smallest:
            largest = _largest_ctx(request, budget.gpu_names, price, avail, prefer_gpu, policy, asked)
        largest, ctx_words = ctx_suggestion(largest, request.n_ctx_train)
        remedy = _remedy(request, budget, binding, blockers, largest, rungs, price, avail)
    except _Unpriced as e:
        remedy = f"price {request.key} at other settings (a term is unavailable: {e})"
    movable = [r for r in (*forced, *pool) if any(r.bytes.get(d, 0) for d in binding)]
    evictable_words = f"after evicting {_keys(movable)}" if movable else "with nothing evictable"
    place = "" if rungs.kind in ("ram", "full") else f" ({describe(config, request.n_layer)})"
    reason = (f"{request.key} needs {_per_device(need, binding)} at {_ctx_words(config, request.n_ctx_train)}"
              f"{place}; {_per_device(avail, binding)} free {evictable_words}")
    if largest is not None:
        reason += f"; {ctx_words}"
    elif asked > smallest:
        reason += f"; no ctx from {smallest} up fits"
    return refusal(reason, remedy, config, need, fp, largest)


def ctx_suggestion(largest: int | None, n_ctx_train: int) -> tuple[int | None, str]:
    """The context a refusal suggests, and the words for it: the largest that fits, capped at the model's training
    context (a larger one fits only memory, not the model, and the training context then fits too)."""
    if largest is None:
        return None, ""
    if n_ctx_train and largest > n_ctx_train:
        return n_ctx_train, (f"the largest ctx that fits is {largest}, above the training ctx {n_ctx_train}: "
                             f"suggesting {n_ctx_train}")
    words = f"the largest ctx that fits is {largest}"
    return largest, words + (f" (training ctx {n_ctx_train})" if n_ctx_train else "")


def _largest_ctx(
    request: PlanRequest, gpus: tuple[str, ...], price: _Prices, room: Mapping[str, int],
    prefer_gpu: bool, policy: Policy, asked: int,
) -> int | None:
    """The largest multiple of ``ctx_step`` below ``asked`` (and >= min_ctx) at which some rung fits.

    Bisection over ctx. A larger ctx needs more everywhere, so the boundary rung only moves one way
    (max-gpu: later, max-ram: earlier) as ctx grows; each probe narrows the rung range of the next.
    """
    step = policy.ctx_step
    lo = max(1, -(-policy.min_ctx // step))
    hi = (asked - 1) // step
    if hi < lo:
        return None
    r_lo, r_hi = 0, len(_Rungs(request, gpus, lo * step)) - 1

    def fits(k: int) -> bool:
        nonlocal r_lo, r_hi
        found, edge = _search(_Rungs(request, gpus, k * step), price, room, prefer_gpu, r_lo, r_hi)
        if (found is not None) == prefer_gpu:  # fits under max-gpu / misses under max-ram: edge is a floor
            r_lo = edge
        else:
            r_hi = edge
        return found is not None

    if not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo * step


def _remedy(
    request: PlanRequest, budget: Budget, binding: list[str], blockers: list[Resident],
    largest: int | None, rungs: _Rungs, price: _Prices, avail: Mapping[str, int],
) -> str:
    parts: list[str] = []
    if largest is not None:
        parts.append(f"lower ctx to {largest}")
    for r in blockers:
        if any(r.bytes.get(d, 0) > 0 for d in binding):
            parts.append(f"{'unpin' if r.pinned else 'unprotect'} {r.key}")
    if request.alloc_mode in ("gpu-only", "explicit") and rungs.gpus:
        wider = PlanRequest(request.key, request.config, "max-gpu", request.n_layer, request.n_moe_layers,
                            request.n_ctx_train)
        if _search(_Rungs(wider, budget.gpu_names, request.config.n_ctx), price, avail, True)[0] is not None:
            parts.append("allow CPU offload (alloc mode max-gpu)")
    for d in binding:
        b = budget.device(d)
        if b is not None and b.limit is not None and b.limit.bytes < b.total.bytes - b.reserve.bytes - b.others_bytes:
            parts.append(f"raise {'ram_limit' if d == HOST else 'gpu_limit'} ({b.limit.source})")
    if not parts:
        parts.append(f"free memory on {', '.join(binding) or 'the host'} or use a smaller quantization")
    return " or ".join(parts)
