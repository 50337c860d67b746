"""Fairness between clients: priority classes, a fair share per key, and per-key caps. PURE.

- **A share** (``Share``) is who a request is: its client (an API key's name), its class, the class's place
  (``rank``: 0 goes first), the flow's weight and its patience (how many ``policy.max_wait_seconds`` the class waits
  at most for a placement), and the key's caps. ``share_of`` makes one from the classes and the key's settings.
- **Order within a model** is start-time fair queueing: each request is stamped, when it arrives, with the virtual
  start ``max(V, F)`` (``V``: the model's virtual time, the tag of the last request handed; ``F``: the finish tag
  of its flow's previous request) and its flow's finish becomes ``start + 1 / weight``. The model's waiters are
  handed in tag order (ties: the higher class, then the earlier arrival). A flow is one client in one class; its
  weight is its class's weight times its key's. A client that floods a model has its requests stamped one after
  another, so a request of another client is never behind more than one of them per slot; a higher class has
  the larger weight, so it goes first and a lower class still gets its share (no class starves within a model).
- **Order between models** is earliest deadline first: a waiter needing a placement is due at ``arrived +
  patience x max_wait_seconds``; the longest-waiting model of one class goes first, as before.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fitevict.schedule.errors import RateLimited

# a queued request (schedule.terms.Waiter): named, not imported, since terms builds on this module
Waiter = Any

ANONYMOUS = "-"  # the client of a request that brought no key (keys are off)
INTERACTIVE, BATCH = "interactive", "batch"
PRUNE_AT = 4096  # flows remembered before those with nothing ahead of the model's virtual time are forgotten


@dataclass(frozen=True, slots=True)
class Share:
    """Who a request is, for fairness. The default: an anonymous interactive request, uncapped."""

    client: str = ANONYMOUS
    klass: str = INTERACTIVE
    rank: int = 0  # the class's place among the classes: 0 goes first
    weight: float = 1.0  # the flow's (its class's weight x its key's)
    patience: float = 1.0  # the class's bound on a placement wait, in policy.max_wait_seconds (top class: 1)
    max_in_flight: int | None = None  # the client's requests handed to seats at once (None: no cap)
    max_queue: int | None = None  # the client's requests waiting at once (None: no cap)

    @property
    def flow(self) -> tuple[str, str]:
        return (self.klass, self.client)


def ranked(classes: Mapping[str, float]) -> list[tuple[str, float]]:
    """The classes in the order they go: the larger weight first; equal weights in the order listed."""
    return sorted(classes.items(), key=lambda kv: -kv[1])


def share_of(classes: Mapping[str, float], klass: str, client: str = ANONYMOUS, *, key_weight: float = 1.0,
             max_in_flight: int | None = None, max_queue: int | None = None) -> Share:
    """The share of a request of ``client`` in ``klass``: its rank, its flow weight (class x key) and its patience,
    the top class's weight over its own (a class half as heavy waits at most twice as long for a placement)."""
    order = ranked(classes)
    names = [n for n, _w in order]
    if klass not in names:
        raise KeyError(f"priority class {klass!r} is not one of {', '.join(names)}")
    weight = classes[klass]
    return Share(client=client, klass=klass, rank=names.index(klass), weight=weight * key_weight,
                 patience=order[0][1] / weight, max_in_flight=max_in_flight, max_queue=max_queue)


class Fairness:
    """The fair-queueing state of one scheduler: virtual time per model, finish tags per flow, and requests in
    flight per client. Changed only by the scheduler."""

    def __init__(self) -> None:
        self.virtual: dict[str, float] = {}  # per model: the start tag of the last request handed
        self.finish: dict[tuple[str, str, str], float] = {}  # per (model, class, client): its last finish tag
        self.in_flight: Counter[str] = Counter()  # per client: requests handed and not finished

    def stamp(self, w: Waiter) -> None:
        """``w`` arrives: its virtual start tag, and its flow's next finish tag."""
        v = self.virtual.get(w.key, 0.0)
        flow = (w.key, *w.share.flow)
        w.tag = max(v, self.finish.get(flow, 0.0))
        self.finish[flow] = w.tag + 1.0 / max(w.share.weight, 1e-9)
        if len(self.finish) > PRUNE_AT:
            self.finish = {f: t for f, t in self.finish.items() if t > self.virtual.get(f[0], 0.0)}

    def handed(self, w: Waiter) -> None:
        self.virtual[w.key] = max(self.virtual.get(w.key, 0.0), w.tag)
        self.in_flight[w.share.client] += 1

    def finished(self, w: Waiter) -> None:
        n = self.in_flight[w.share.client] - 1
        if n > 0:
            self.in_flight[w.share.client] = n
        else:
            del self.in_flight[w.share.client]

    def capped(self, w: Waiter) -> bool:
        """``w``'s client has as many requests handed to seats as its key allows."""
        cap = w.share.max_in_flight
        return cap is not None and self.in_flight[w.share.client] >= cap

    @staticmethod
    def order(w: Waiter) -> tuple[float, int, float]:
        """The order a model's waiters are handed in: virtual start, then the higher class, then arrival."""
        return (w.tag, w.share.rank, w.arrived)


def over_queue(w: Waiter, waiting: int, in_flight: int, wait: float) -> RateLimited:
    """The refusal of ``w``, whose client already has ``waiting`` requests waiting (its key's ``max_queue``): when to
    retry is the wait estimated for it (``wait`` seconds, at least 1)."""
    sh = w.share
    cap_in = sh.max_in_flight if sh.max_in_flight is not None else "any number"
    return RateLimited(f"{w.key}: client {sh.client!r} has {waiting} request(s) waiting and {in_flight} in flight "
                       f"(its key allows {sh.max_queue} waiting, {cap_in} in flight); retry after about {wait:.1f} s, "
                       f"or raise the key's max_queue", retry_after=max(1, math.ceil(wait)))


def cuts_short(head: Waiter, served: int, turn_rank: int | None, waiting: list[Waiter], now: float,
               max_wait_seconds: float) -> bool:
    """Whether ``head`` ends a seat's turn early: its class is higher than every class the turn serves (``turn_rank``,
    the highest handed in it, and ``waiting``, its requests still queued), the turn has been handed at least one
    request (``served``), and none of ``waiting`` is past its own class's bound (then the turn is owed to it). A drain
    never cuts a request: what is in flight finishes."""
    if served < 1:
        return False
    rank = min([w.share.rank for w in waiting] + ([turn_rank] if turn_rank is not None else []))
    return head.share.rank < rank and all(now < deadline(w, max_wait_seconds) for w in waiting)


def deadline(w: Waiter, max_wait_seconds: float) -> float:
    """When ``w`` has waited its class's bound for a placement: ``arrived + patience x max_wait_seconds``."""
    return w.arrived + w.share.patience * max_wait_seconds if math.isfinite(w.share.patience) else math.inf


__all__ = ["ANONYMOUS", "BATCH", "Fairness", "cuts_short", "INTERACTIVE", "Share", "deadline", "over_queue", "ranked", "share_of"]
