"""Placement candidates: the ladder from all-GPU to CPU-only, the one compatibility rule, priced candidates. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields

from fitevict.budget import charged
from fitevict.pricing.footprint import HOST, Footprint
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.placement import default_split, layers_per_device
from fitevict.planner.records import EMPTY, Action, FootprintFn, PlanInvariantError, PlanRequest


# ---------------------------------------------------------------------------------------------
# placement candidates


_PLACEMENT_FIELDS = ("n_gpu_layers", "n_cpu_moe", "devices", "tensor_split", "rpc")
_ALL_FIELDS = tuple(f.name for f in fields(LoadConfig))
_OTHER_FIELDS = tuple(f for f in _ALL_FIELDS if f not in _PLACEMENT_FIELDS)


def _non_placement(c: LoadConfig) -> tuple:
    return tuple(getattr(c, f) for f in _OTHER_FIELDS)


def _derive(c: LoadConfig, **changes: object) -> LoadConfig:
    """``c`` with ``changes``: LoadConfig.with_ without dataclasses.replace's per-call field walk."""
    return LoadConfig(*[changes[f] if f in changes else getattr(c, f) for f in _ALL_FIELDS])  # type: ignore[arg-type]


def all_layers(c: LoadConfig, n_layer: int) -> bool:
    return c.n_gpu_layers < 0 or c.n_gpu_layers >= n_layer


def action_of(c: LoadConfig, n_layer: int) -> Action:
    """``ram`` with no GPU layers, ``load`` with every layer and expert on the GPU, else ``partial``."""
    if not c.devices or c.n_gpu_layers == 0:
        return "ram"
    if all_layers(c, n_layer) and c.n_cpu_moe == 0:
        return "load"
    return "partial"


def compatible(resident: LoadConfig, request: PlanRequest, source: str = "") -> bool:
    """Whether a resident configuration serves the request. The one rule, for the front door's fast path,
    the scheduler and the planner alike (``mismatch`` says why not)."""
    return mismatch(resident, request, source) is None


RELOADED_FOR_CTX = "reloaded for ctx"  # how a reload for a larger context names itself (the load report reads it)
_CTX_FIELDS = ("n_ctx", "n_parallel")


def slot_ctx(c: LoadConfig, n_ctx_train: int = 0) -> int:
    """Tokens one slot of ``c`` holds: its context (0: the training context) over its slots (no -np: the engine's 4)."""
    return (c.n_ctx or n_ctx_train) // max(1, c.n_parallel or 4)


def ctx_short(resident: LoadConfig, request: PlanRequest) -> str | None:
    """Why the resident's context is too small for the request (``RELOADED_FOR_CTX: resident N < asked M``, per
    slot), or None: a seat serves any request whose slot holds no more than one of its own slots."""
    have, want = slot_ctx(resident, request.n_ctx_train), slot_ctx(request.config, request.n_ctx_train)
    if not request.n_ctx_train and not (resident.n_ctx and request.config.n_ctx):  # a training context not known
        if resident.n_ctx == request.config.n_ctx:
            return None
        return (f"{RELOADED_FOR_CTX}: resident {resident.n_ctx} != asked {request.config.n_ctx} "
                "(0: the training context, whose size is not known)")
    if want <= have:
        return None
    per = "" if (resident.n_parallel or 4) == (request.config.n_parallel or 4) == 1 else " per slot"
    return f"{RELOADED_FOR_CTX}: resident {have} < asked {want}{per}"


def mismatch(resident: LoadConfig, request: PlanRequest, source: str = "") -> str | None:
    """Why a resident configuration does not serve the request, or None: it does. The one rule (``compatible``).

    The file must be the same (when both are known). The non-placement fields must match: all of them, or
    only those the request fixes (``request.fixed``: a request that names no context is served at any). A fixed
    context is served by a seat whose slots hold at least as many tokens as the request's (``ctx_short``): only a
    larger one reloads. Placement follows the alloc mode: any placement serves max-gpu/max-ram, gpu-only needs
    every layer on the GPU, ram-only none, explicit the very -ngl/--n-cpu-moe/devices asked for."""
    if request.source and source and request.source != source:
        return f"resident file {source} is not the asked {request.source}"
    if request.fixed is None:
        if _non_placement(resident) != _non_placement(request.config):
            return "resident with a different configuration"
    else:
        differ = [f for f in request.fixed if f not in _PLACEMENT_FIELDS and f not in _CTX_FIELDS
                  and getattr(resident, f) != getattr(request.config, f)]
        if "n_parallel" in request.fixed and resident.n_parallel != request.config.n_parallel:
            differ.append("n_parallel")
        if differ:
            return f"resident with a different {', '.join(sorted(differ))}"
        if "n_ctx" in request.fixed and (short := ctx_short(resident, request)) is not None:
            return short
    if not _placement_serves(resident, request):
        return f"resident placement does not serve alloc mode {request.alloc_mode}"
    return None


def _placement_serves(resident: LoadConfig, request: PlanRequest) -> bool:
    mode = request.alloc_mode
    if mode == "explicit":
        want = request.config
        return (
            resident.n_cpu_moe == want.n_cpu_moe
            and (resident.n_gpu_layers == want.n_gpu_layers
                 or (all_layers(resident, request.n_layer) and all_layers(want, request.n_layer)))
            and (not want.devices or resident.devices == want.devices)
            and (not want.tensor_split or resident.tensor_split == want.tensor_split)
        )
    if mode == "gpu-only":
        return action_of(resident, request.n_layer) == "load"
    if mode == "ram-only":
        return action_of(resident, request.n_layer) == "ram"
    return True


class Rungs:
    """The candidate configurations for one request at one ctx, most GPU first (see module doc).

    ``free`` is each GPU's free memory now: a rung on several GPUs whose request gives no ``tensor_split`` is split
    the way llama.cpp splits by default, by free memory (``placement.default_split``), and carries the resulting
    layers per device as its ``tensor_split`` (``placement.layers_per_device``): priced so, and started so."""

    __slots__ = ("base", "gpus", "L", "M", "kind", "made", "free", "rpc")

    def __init__(self, request: PlanRequest, gpus: tuple[str, ...], n_ctx: int,
                 free: Mapping[str, int] = EMPTY, rpc: tuple[str, ...] = ()) -> None:
        """``rpc``: the rpc-server endpoints of the budget's RPC devices, in order; a rung on any RPC device is
        started with all of them (``Budget.rpc``), so that the engine names those devices as the budget does."""
        self.L, self.M = request.n_layer, request.n_moe_layers
        self.made: dict[int, LoadConfig] = {}
        self.free, self.rpc = free, rpc
        mode = request.alloc_mode
        if mode == "explicit":
            c = request.config if request.config.n_ctx == n_ctx else _derive(request.config, n_ctx=n_ctx)
            if not c.devices and c.n_gpu_layers != 0:
                c = _derive(c, devices=gpus)
            self.base, self.gpus, self.kind = self._split(c), c.devices, "explicit"
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
            return self._split(_derive(self.base, devices=self.gpus, n_gpu_layers=self.L,
                                       n_cpu_moe=0 if self.kind == "full" else i))
        ngl = self.L - (i - self.M)  # fewer layers, every expert on the CPU
        return self._split(_derive(self.base, devices=self.gpus, n_gpu_layers=ngl, n_cpu_moe=self.M if ngl else 0))

    def _split(self, c: LoadConfig) -> LoadConfig:
        """``c`` with llama.cpp's default split by free memory made explicit (see the class doc); as it is when it
        names its own split, uses one GPU, offloads nothing, or a GPU's free memory is unknown. A placement on an RPC
        device gets the budget's ``--rpc`` endpoints."""
        if self.rpc and not c.rpc and any(d.startswith("RPC") for d in c.devices):
            c = _derive(c, rpc=self.rpc)
        if len(c.devices) < 2 or c.tensor_split or c.n_gpu_layers == 0:
            return c
        weights = default_split(c.devices, self.free)
        if not weights:
            return c
        ngl = self.L if c.n_gpu_layers < 0 else c.n_gpu_layers
        counts = layers_per_device(self.L - 1, ngl, c.devices, weights)
        return _derive(c, tensor_split=counts) if counts else c


class Unpriced(Exception):
    """A footprint with an unavailable term: the planner cannot decide on it."""


class Prices:
    """Prices configurations of one model, once each, as bytes per budget device."""

    __slots__ = ("key", "fn", "cache", "unified", "carry")

    def __init__(self, key: str, fn: FootprintFn, unified: frozenset[str] = frozenset(), carry: bool = True) -> None:
        """``unified``: the devices whose bytes count against the host too (``budget.charged``). ``carry``: the load
        would carry its engine binary's shared pages (``Footprint.pages``; no other seat of the engine stays), so its
        host need counts them."""
        self.key, self.fn, self.unified, self.carry = key, fn, unified, carry
        self.cache: dict[LoadConfig, tuple[Footprint, dict[str, int]]] = {}

    def __call__(self, c: LoadConfig) -> tuple[Footprint, dict[str, int]]:
        hit = self.cache.get(c)
        if hit is not None:
            return hit
        fp = self.fn(self.key, c)
        if fp.host_source == "unavailable" or not all(d.complete for d in fp.devices):
            missing = [
                f"{d.name} {name}: {t.reason}" for d in fp.devices for name, t in d.terms() if t.bytes is None
            ]
            if fp.host_source == "unavailable":
                missing.append("host mapped/committed split unavailable")
            raise Unpriced("; ".join(missing))
        if fp.host_mapped_bytes < 0 or fp.host_committed_bytes < 0:
            raise PlanInvariantError(
                f"footprint of {self.key}: negative host bytes "
                f"(mapped {fp.host_mapped_bytes}, committed {fp.host_committed_bytes})"
            )
        need = {HOST: fp.bytes_on(HOST) + (fp.pages.bytes if self.carry and fp.pages is not None else 0)}
        for g in fp.gpu_names:
            need[g] = need.get(g, 0) + fp.bytes_on(g)
        if self.unified:
            need = charged(need, self.unified)
        self.cache[c] = (fp, need)
        return fp, need


def _ok(need: Mapping[str, int], room: Mapping[str, int], host: bool | None = None) -> bool:
    """Every device the need touches has room; ``host`` restricts to the host (True) or GPUs (False)."""
    for d, n in need.items():
        if n > 0 and (host is None or (d == HOST) == host) and n > room.get(d, 0):
            return False
    return True


def search(
    rungs: Rungs, price: Prices, room: Mapping[str, int], prefer_gpu: bool, lo: int = 0, hi: int | None = None
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
