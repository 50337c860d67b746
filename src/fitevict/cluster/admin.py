"""The admin routes at the cluster's front door (admin key), each sent to the nodes it concerns:

- ``POST /v1/models/{id}/load``: to the node the routing rule picks, as an inference request for the model would
  go (a hit where it is resident; else the node where it fits with the most room left; else the cheapest
  eviction), the next candidate when a node refuses; ``?stream=true`` relays the load's progress events as they
  come. The answer names the node (``node``, ``route``, and the ``x-fitevict-node`` header).
- ``POST /v1/models/{id}/unload``: to every routable node with the model's files (the facts may be a poll behind
  a load just made): the nodes where it is resident unload it. ``unloaded_on`` names them; ``nodes`` has each
  node's answer.
- ``POST /v1/models/{id}/plan``: every such node's own dry run (``nodes``), and the node the routing rule would
  pick (``node``, ``route``), whose plan and budget lead the answer in one machine's shape (``plan``,
  ``budget``): ``fitevict plan --server`` reads the cluster's front door as it reads a node's.
- ``POST /v1/models/rescan``: every routable node rescans its folders (its model list reaches routing within the
  agent's model-list period).

``answer_*`` are pure: the nodes' answers in, the cluster's answer out.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from typing import Any

import httpx

from fitevict.cluster.facts import verdict_of
from fitevict.cluster.route import Route, route, usable
from fitevict.cluster.door_port import Front
from fitevict.cluster.wire import Receive, Scope, Send, read_body, send_error, send_json
from fitevict.server.errors import ApiError


ADMIN = re.compile(r"^/v1/models/(?P<model>.+)/(?P<act>load|unload|plan)$")
RESCAN = "/v1/models/rescan"
UNLOAD_TIMEOUT_S = 300.0  # a stop waits for its requests in flight and verifies its memory came back


def is_admin(method: str, path: str) -> bool:
    return method == "POST" and (path == RESCAN or ADMIN.match(path) is not None)


async def answer(door: Front, scope: Scope, receive: Receive, send: Send) -> None:
    path = scope["path"]
    try:
        door.keys.check(scope, admin=True)
        raw = await read_body(receive, door.config.server.max_body_bytes)
        if path == RESCAN:
            got = await door.ask_each("POST", RESCAN, timeout=120.0)
            door.fleet.poke()
            return await send_json(send, 200, answer_each({n: _read(r) for n, r in got.items()}))
        m = ADMIN.match(path)
        assert m is not None
        key, contract = door.resolve(m["model"]), contract_of(raw)
        if m["act"] == "load":
            return await door.relay(key, contract, raw, scope, receive, send, name_node=True)
        facts = door.fleet.snapshot()
        nodes = [f.node for f in usable(facts, key, time.time(), door.fleet.max_age_s)[0]]
        if m["act"] == "unload":
            got = await door.ask_each("POST", path, nodes=nodes, timeout=UNLOAD_TIMEOUT_S)
            door.fleet.poke()
            return await send_json(send, 200, answer_unload(key, {n: _read(r) for n, r in got.items()}))
        got = await door.ask_each("POST", path, nodes=nodes, content=raw or None)
        runs: dict[str, tuple[int | None, Any]] = {n: (None, {"error": {"message": "its door did not answer"}})
                                                   for n in nodes}
        runs.update({n: _read(r) for n, r in got.items()})
        verdicts = [verdict_of(n, st or 0, body) for n, (st, body) in runs.items()]
        chosen = route(key, facts, verdicts, time.time(), door.fleet.max_age_s)
        return await send_json(send, 200, answer_plan(key, chosen, runs))
    except ApiError as e:
        return await send_error(e, path, scope, receive, send)


def contract_of(raw: bytes) -> dict | None:
    """The load contract in an admin body (the contract, or ``{"fitevict": {...}}``), as the nodes read it; None
    for none. The nodes check it."""
    if not raw.strip():
        return None
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise ApiError(400, f"request body is not valid JSON: {e}", code="invalid_json") from None
    if body is None:
        return None
    if not isinstance(body, dict):
        raise ApiError(400, "body must be a JSON object (a load contract, or {\"fitevict\": {...}})")
    c = body.get("fitevict", body)
    return c if isinstance(c, dict) and c else None


def _read(r: httpx.Response) -> tuple[int, Any]:
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, {"error": {"message": r.text[:500]}}


def _row(node: str, status: int | None, body: Any) -> dict[str, Any]:
    return {"node": node, "status": status, **(body if isinstance(body, dict) else {"answer": body})}


def answer_each(answers: Mapping[str, tuple[int | None, Any]]) -> dict[str, Any]:
    """Each node's answer, with its node and status, by node id."""
    return {"object": "list", "data": [_row(n, *answers[n]) for n in sorted(answers)]}


def answer_unload(key: str, answers: Mapping[str, tuple[int | None, Any]]) -> dict[str, Any]:
    """The nodes' unload answers: where the model was unloaded (``unloaded_on``) and each node's answer."""
    rows = answer_each(answers)["data"]
    on = [r["node"] for r in rows if r["status"] == 200 and r.get("unloaded")]
    return {"model": key, "unloaded": bool(on), "unloaded_on": on,
            **({} if on else {"reason": "not resident on any routable node"}), "nodes": rows}


def _plan(body: Any) -> dict[str, Any]:
    p = body.get("plan") if isinstance(body, dict) else None
    return p if isinstance(p, dict) else {}


def answer_plan(key: str, chosen: Route, runs: Mapping[str, tuple[int | None, Any]]) -> dict[str, Any]:
    """The nodes' dry runs, led by the node the routing rule picks (``node``, ``route``: its plan and budget as
    one machine answers them); with no candidate, the first node (by id) whose dry run answered leads, with
    ``route`` refuse."""
    if chosen.candidates:
        lead, why = chosen.candidates[0].node, str(chosen.candidates[0].why)
    else:
        lead = next((n for n in sorted(runs) if _plan(runs[n][1])), None)
        why = "refuse"
    body = runs[lead][1] if lead in runs else {}
    nodes = []
    for n in sorted(runs):
        status, got = runs[n]
        p = _plan(got)
        err = got.get("error") if isinstance(got, dict) else None
        nodes.append({"node": n, "status": status, "action": p.get("action") or "refuse",
                      "reason": p.get("reason") or (err.get("message") if isinstance(err, dict) else str(err)),
                      "plan": p or None, "budget": got.get("budget") if isinstance(got, dict) else None})
    return {"model": key, "node": lead, "route": why,
            "candidates": [{"node": c.node, "route": c.why, "detail": c.detail} for c in chosen.candidates],
            "refused": [{"node": n, "reason": r} for n, r in chosen.refused],
            "plan": _plan(body) or None, "budget": body.get("budget") if isinstance(body, dict) else None,
            "nodes": nodes}


__all__ = ["ADMIN", "answer", "answer_plan", "answer_unload", "contract_of", "is_admin"]
