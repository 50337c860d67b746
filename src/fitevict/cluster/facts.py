"""The nodes' reports as routing records: a node agent's ``facts()`` and ``plan()`` answers (JSON, as its door
wrote them) to ``NodeFacts`` and ``Verdict``. Pure."""

from __future__ import annotations

from typing import Any

from fitevict.budget import charged
from fitevict.cluster.route import NodeFacts, NodeSeat, Verdict


def seat_of(view: dict[str, Any]) -> NodeSeat:
    """One row of a door's ``/v1/models/residents``."""
    gd = view.get("greedy_dual") or {}
    credit = gd["priority"] - gd.get("floor", 0.0) if isinstance(gd.get("priority"), (int, float)) else None
    planned = charged({d: int(f["planned_bytes"]) for d, f in (view.get("devices") or {}).items()
                       if isinstance(f, dict) and f.get("planned_bytes") is not None}, tuple(view.get("unified") or ()))
    return NodeSeat(key=view["key"], state=str(view.get("state") or ""), bytes=planned,
                in_flight=int(view.get("in_flight") or 0), waiting=int(view.get("waiting") or 0), credit=credit)


def catalog_of(models: dict[str, Any]) -> tuple[dict[str, str | None], dict[str, str]]:
    """A door's ``/v1/models``: seat key -> base (adapters) or None, and every name -> key."""
    bases: dict[str, str | None] = {}
    names: dict[str, str] = {}
    for m in models.get("data") or ():
        key = m["id"]
        fx = m.get("fitevict") or {}
        bases[key] = fx.get("base")
        names[key] = key
        for alias in fx.get("aliases") or ():
            names.setdefault(alias, key)
    return bases, names


def node_facts(raw: dict[str, Any]) -> NodeFacts:
    """An agent's ``facts()`` answer as a record (an answer with ``error`` makes a node that takes nothing)."""
    base = {"node": raw["node"], "url": raw.get("url", ""), "taken_at": float(raw.get("taken_at") or 0.0)}
    if raw.get("error"):
        return NodeFacts(**base, error=str(raw["error"]))
    residents = raw.get("residents") or {}
    seats = tuple(seat_of(v) for v in residents.get("data") or ())
    budget = {d: int(n) for d, n in (raw.get("budget_bytes") or {}).items()}
    held: dict[str, int] = {}
    for s in seats:
        for d, n in s.bytes.items():
            held[d] = held.get(d, 0) + n
    room = {d: budget[d] - held.get(d, 0) for d in budget}
    bases, names = catalog_of(raw.get("models") or {})
    return NodeFacts(**base, seats=seats, budget_bytes=budget, room_bytes=room,
                     waiting={k: int(n) for k, n in (residents.get("waiting") or {}).items()},
                     models=bases, names=names)


def verdict_of(node: str, status: int, body: dict[str, Any]) -> Verdict:
    """A node's answer to ``POST /v1/models/{id}/plan``: its plan's action, victims, room after and reason; any
    other answer is a refusal with the door's own message."""
    p = body.get("plan") if isinstance(body, dict) else None
    if status != 200 or not isinstance(p, dict):
        err = body.get("error") if isinstance(body, dict) else None
        msg = err.get("message") if isinstance(err, dict) else str(err or body)
        return Verdict(node, "refuse", f"dry run answered {status}: {msg}")
    return Verdict(node, str(p["action"]), reason=str(p.get("reason") or ""), key=str(p.get("key") or ""),
                   evict=tuple(e["key"] for e in p.get("evict") or ()),
                   free_after={d: int(n) for d, n in (p.get("free_bytes_after") or {}).items()},
                   wait_for=tuple(p.get("wait_for") or ()))
