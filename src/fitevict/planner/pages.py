"""Shared pages in a plan: an engine binary's own file pages, held once by the seats of that engine whatever
their number (``pricing.pages``), freed only when the last of them goes. Pure.

The snapshot gives them on the seat that carries them now (``Resident.carries``: the first placed). What a plan
frees and needs follows the rule that they are held while any seat of the engine is:

- a load of an engine some other seat runs keeps them held, whichever seats it evicts: it needs none of them, and
  no victim of that engine frees them (``pages_view`` takes them off every seat of the engine; the door's held
  bytes still count them, once);
- a load of an engine no other seat runs needs them (``Prices`` adds its footprint's ``pages``);
- for any other engine, they are put on the seat of it that goes last: one that cannot go (pinned, protected),
  else one that is busy, else the last in the victim order. Evicting some of its seats frees none of them;
  evicting all of them frees them once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from fitevict.pricing.footprint import HOST
from fitevict.planner.records import PlanRequest, Resident
from fitevict.planner.eviction import eviction_policy


def stays(res: Sequence[Resident], request: PlanRequest) -> bool:
    """Whether a seat of the request's engine other than the one it replaces stays: its pages stay held."""
    return bool(request.pages) and any(r.pages == request.pages and r.key != request.key for r in res)


def _moved(r: Resident, carries: int) -> Resident:
    host = r.bytes.get(HOST, 0) - r.carries + carries
    return replace(r, bytes={**r.bytes, HOST: host}, carries=carries)


def _last(members: list[Resident], eviction: str) -> Resident:
    """The seat of an engine that goes last: one that cannot go, else a busy one, else the last in victim order."""
    fixed = [r for r in members if r.pinned or r.protected]
    if fixed:
        return fixed[0]
    busy = [r for r in members if r.busy]
    if busy:
        return busy[0]
    return eviction_policy(eviction).order(members, (HOST,))[-1]


def pages_view(res: Sequence[Resident], request: PlanRequest, eviction: str) -> tuple[Resident, ...]:
    """The residents as a plan frees them (the module doc): each engine's pages on the seat that frees them, or on
    none when the request's own engine keeps them held. Their sum over the residents changes by what the request's
    engine keeps: the caller counts held bytes on the snapshot as given."""
    keep = request.pages if stays(res, request) else ""
    groups = {r.pages for r in res if r.carries and r.pages}
    out = {r.key: r for r in res}
    for g in groups:
        members = [r for r in res if r.pages == g]
        total = sum(r.carries for r in members)
        holder = None if g == keep else _last(members, eviction)
        for r in members:
            out[r.key] = _moved(r, total if r is holder else 0)
    return tuple(out[r.key] for r in res)
