"""Which residents go (GreedyDual-Size or LRU order, a minimal set), and the words a plan says. Pure."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from fitevict.pricing.loadconfig import LoadConfig
from fitevict.units import format_size
from fitevict.planner.records import PRIORITY_BAND, Resident
from fitevict.planner.ladder import all_layers, action_of


# ---------------------------------------------------------------------------------------------
# victims


def device_sums(rs: Iterable[Resident], devices: Iterable[str]) -> dict[str, int]:
    out = dict.fromkeys(devices, 0)
    for r in rs:
        for d, n in r.bytes.items():
            if d in out:
                out[d] += n
    return out


def _covers(victims: Iterable[Resident], short: Mapping[str, int]) -> bool:
    got = device_sums(victims, short)
    return all(got[d] >= s for d, s in short.items())


def priority_bands(pool: Iterable[Resident]) -> dict[str, int]:
    """GreedyDual-Size bands: the lowest priority opens band 0, and every priority within 25% of it
    (``<= lowest * PRIORITY_BAND``) ties with it; the lowest priority left opens the next band. Load times are
    measured, so noisy: a band keeps noise from deciding, and recency decides within it. Priorities are H above L
    (``Resident.priority``): on H itself, L's growth would soon put every seat in one band."""
    bands: dict[str, int] = {}
    band, top = -1, -math.inf
    for r in sorted(pool, key=lambda r: (r.priority, r.key)):
        if r.priority > top:
            band, top = band + 1, r.priority * PRIORITY_BAND if r.priority > 0 else r.priority
        bands[r.key] = band
    return bands


def victim_order(r: Resident, short: Mapping[str, int], eviction: str, bands: Mapping[str, int] | None = None) -> tuple:
    """The order victims are taken in: a seat outgrowing its price before every healthy one, then by ``cost``:
    GreedyDual-Size, the lowest band of H first (cheap to reload per byte and not used lately; ``priority_bands``),
    then least recently used; ``lru``: least recently used first. Ties: most bytes on the short devices, then the
    key."""
    freed = -sum(r.bytes.get(d, 0) for d in short)
    if eviction == "cost":
        band = (bands or priority_bands([r]))[r.key]
        return (not r.outgrowing, band, r.last_used, freed, r.key)
    return (not r.outgrowing, r.last_used, freed, r.key)


def choose(short: Mapping[str, int], pool: list[Resident], eviction: str = "lru") -> list[Resident]:
    """Victims from ``pool`` in ``victim_order`` covering every shortfall, then pruned to a minimal set."""
    if not short:
        return []
    bands = priority_bands(pool) if eviction == "cost" else None
    order = sorted(pool, key=lambda r: victim_order(r, short, eviction, bands))
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


def victim_words(r: Resident, helps: list[str], eviction: str, now: float) -> str:
    idle = f"idle {max(0.0, now - r.last_used):.0f} s"
    frees = f"frees {per_device(r.bytes, helps)}"
    if r.outgrowing:
        return f"outgrowing its price (its outgrew event), so before every healthy seat ({idle}); {frees}"
    if eviction == "cost":
        reload = (f"reload {r.reload_seconds:.2f} s measured" if r.reload_seconds is not None
                  else "reload time not measured yet")
        return f"lowest GreedyDual-Size priority (H - L = {r.priority:.3g}: {reload}, {idle}); {frees}"
    return f"least recently used ({idle}); {frees}"


def gib(n: int) -> str:
    return format_size(n)


def key_list(rs: Iterable[Resident], most: int = 8) -> str:
    keys = [r.key for r in rs]
    more = f", ... ({len(keys) - most} more)" if len(keys) > most else ""
    return "[" + ", ".join(keys[:most]) + more + "]"


def describe(c: LoadConfig, n_layer: int) -> str:
    """Placement in words: "all 33 layers on CUDA0", "20 of 33 layers on CUDA0", "CPU only"."""
    if action_of(c, n_layer) == "ram":
        return "CPU only" if not c.devices else f"CPU weights, compute on {'+'.join(c.devices)}"
    on = "+".join(c.devices)
    layers = f"all {n_layer} layers" if all_layers(c, n_layer) else f"{c.n_gpu_layers} of {n_layer} layers"
    moe = f", experts of the first {c.n_cpu_moe} layers on CPU" if c.n_cpu_moe else ""
    return f"{layers} on {on}{moe}"


def context_words(c: LoadConfig, n_ctx_train: int) -> str:
    if c.n_ctx:
        return f"ctx {c.n_ctx}"
    return f"training ctx {n_ctx_train}" if n_ctx_train else "training ctx"


def per_device(m: Mapping[str, int], devices: Iterable[str]) -> str:
    return " and ".join(f"{gib(m.get(d, 0))} on {d}" for d in devices)
