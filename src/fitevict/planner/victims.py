"""Which residents go (in the eviction policy's order, ``planner.eviction``; a minimal set), and the words a plan
says. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fitevict.pricing.loadconfig import LoadConfig
from fitevict.units import format_size
from fitevict.planner.eviction import eviction_policy
from fitevict.planner.records import Resident
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


def choose(short: Mapping[str, int], pool: list[Resident], eviction: str = "lru") -> list[Resident]:
    """Victims from ``pool`` in the order of the policy ``eviction`` names (``planner.eviction``) covering every
    shortfall, then pruned to a minimal set."""
    if not short:
        return []
    order = eviction_policy(eviction).order(pool, short)
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
    return f"{eviction_policy(eviction).why(r, idle, r.reload_seconds)}; {frees}"


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
