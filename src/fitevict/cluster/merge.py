"""One view over the nodes: the model list, the residents and the history of every node's door, each row naming its
node. Pure: the nodes' answers in, the merged answer out (``front`` fetches them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def models(per_node: Mapping[str, dict[str, Any]], resident_on: Mapping[str, list[str]]) -> dict[str, Any]:
    """``/v1/models`` of every node as one list: each model once, with the nodes that have its files
    (``fitevict.nodes``) and those where it (its base, for an adapter) is resident (``fitevict.resident_on``)."""
    out: dict[str, dict[str, Any]] = {}
    for node in sorted(per_node):
        for m in per_node[node].get("data") or ():
            row = out.get(m["id"])
            if row is None:
                row = out[m["id"]] = {**m, "fitevict": {**(m.get("fitevict") or {}), "nodes": []}}
            row["fitevict"]["nodes"].append(node)
    for key, row in out.items():
        seat = row["fitevict"].get("base") or key
        row["fitevict"]["resident_on"] = sorted(resident_on.get(seat, ()))
        row["fitevict"]["resident"] = bool(row["fitevict"]["resident_on"])
    return {"object": "list", "data": list(out.values())}


def residents(per_node: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """``/v1/models/residents`` of every node: the rows with their ``node``; ``waiting`` summed per model, and per
    node in ``waiting_by_node``."""
    data: list[dict[str, Any]] = []
    waiting: dict[str, int] = {}
    by_node: dict[str, dict[str, int]] = {}
    for node in sorted(per_node):
        got = per_node[node]
        data += [{**row, "node": node} for row in got.get("data") or ()]
        by_node[node] = dict(got.get("waiting") or {})
        for key, n in by_node[node].items():
            waiting[key] = waiting.get(key, 0) + n
    return {"object": "list", "data": data, "waiting": waiting, "waiting_by_node": by_node}


def history(per_node: Mapping[str, dict[str, Any]], limit: int) -> dict[str, Any]:
    """``/v1/models/history`` of every node, newest first, at most ``limit`` rows, each with its ``node``. A row's
    measurements stay its node's: they were taken on that machine."""
    rows = [{**row, "node": node} for node in sorted(per_node) for row in per_node[node].get("data") or ()]
    rows.sort(key=lambda r: (-(r.get("time") or 0.0), r["node"], -(r.get("id") or 0)))
    return {"object": "list", "data": rows[:limit]}


def tags(per_node: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """Ollama's ``/api/tags`` of every node: each name once, with the nodes that have it."""
    out: dict[str, dict[str, Any]] = {}
    for node in sorted(per_node):
        for m in per_node[node].get("models") or ():
            row = out.setdefault(m.get("name") or m.get("model"), {**m, "nodes": []})
            row["nodes"].append(node)
    return {"models": list(out.values())}


def resident_nodes(per_node: Mapping[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Seat key -> the nodes where it is resident, from their residents answers."""
    out: dict[str, list[str]] = {}
    for node, got in per_node.items():
        for row in got.get("data") or ():
            out.setdefault(row["key"], []).append(node)
    return out


def short(node: str) -> str:
    """A node id's head, as tables show it (Ray's node ids are 56 hex digits; 8 tell a fleet's nodes apart)."""
    return node[:8]
