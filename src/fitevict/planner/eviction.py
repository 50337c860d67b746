"""The eviction policies: which seat goes first, one rule for a load's evictions (``planner.victims.choose``) and
for pressure relief (``pressure.assess``). Each policy is one registered object (``POLICIES``), found by the name
``policy.eviction`` gives; nothing else compares that name. Pure.

Every policy takes a seat outgrowing its price before every healthy one (it holds more than it was admitted for, and
may still be growing), then orders by its own rule, and breaks ties by the most bytes on the devices that are short,
then by key."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

from fitevict.planner.records import PRIORITY_BAND


class Candidate(Protocol):
    """A seat that may be stopped: a planner's ``Resident`` or pressure relief's ``Idle``."""

    @property
    def key(self) -> str: ...
    @property
    def bytes(self) -> Mapping[str, int]: ...
    @property
    def priority(self) -> float: ...  # GreedyDual-Size H above L
    @property
    def last_used(self) -> float: ...
    @property
    def outgrowing(self) -> bool: ...


C = TypeVar("C", bound=Candidate)


def priority_bands(pool: Iterable[Candidate]) -> dict[str, int]:
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


class EvictionPolicy:
    """One victim order: ``rank`` is the policy's own rule over a pool; ``order`` puts it between the rules all
    policies share."""

    name: str = ""
    summary: str = ""

    def rank(self, pool: Sequence[Candidate]) -> Callable[[Candidate], tuple]:
        raise NotImplementedError

    def why(self, c: Candidate, idle: str, reload_seconds: float | None) -> str:
        """Why ``c`` goes first under this policy, in words (``idle``: how long it has been idle)."""
        raise NotImplementedError

    def order(self, pool: Sequence[C], short: Iterable[str]) -> list[C]:
        """``pool`` in the order its seats are taken: outgrowing first, then this policy's rank, then the most bytes on
        the ``short`` devices, then the key."""
        devices, rank = tuple(short), self.rank(pool)
        return sorted(pool, key=lambda c: (not c.outgrowing, *rank(c), -sum(c.bytes.get(d, 0) for d in devices),
                                           c.key))


class GreedyDualSize(EvictionPolicy):
    name = "cost"
    summary = "GreedyDual-Size: the lowest band of priority first (cheap to reload per byte, not used lately)"

    def rank(self, pool: Sequence[Candidate]) -> Callable[[Candidate], tuple]:
        bands = priority_bands(pool)
        return lambda c: (bands[c.key], c.last_used)

    def why(self, c: Candidate, idle: str, reload_seconds: float | None) -> str:
        reload = (f"reload {reload_seconds:.2f} s measured" if reload_seconds is not None
                  else "reload time not measured yet")
        return f"lowest GreedyDual-Size priority (H - L = {c.priority:.3g}: {reload}, {idle})"


class LeastRecentlyUsed(EvictionPolicy):
    name = "lru"
    summary = "least recently used first"

    def rank(self, pool: Sequence[Candidate]) -> Callable[[Candidate], tuple]:
        return lambda c: (c.last_used,)

    def why(self, c: Candidate, idle: str, reload_seconds: float | None) -> str:
        return f"least recently used ({idle})"


POLICIES: dict[str, EvictionPolicy] = {p.name: p for p in (GreedyDualSize(), LeastRecentlyUsed())}


def eviction_policy(name: str) -> EvictionPolicy:
    """The registered policy ``name`` (``policy.eviction``); raises ValueError naming the ones there are."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"eviction {name!r} is not one of {', '.join(POLICIES)}; set policy.eviction to one of "
                         "them") from None


__all__ = ["POLICIES", "Candidate", "EvictionPolicy", "GreedyDualSize", "LeastRecentlyUsed", "eviction_policy",
           "priority_bands"]
