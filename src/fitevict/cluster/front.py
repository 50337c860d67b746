"""The cluster's front door: the same OpenAI and Ollama routes as one machine's, answered by a node's door.

For an inference request it reads the model's name, asks the routing rule (``route``) for candidate nodes and
relays the request, as received, to the first that takes it: the answer's bytes go from the node's door to the
client as they arrive, over HTTP (never through Ray's object store). A node that refuses (507: does not fit, 503:
busy) or cannot be reached sends the request to the next candidate, with the reason logged. A node lost while
the request was on it (the answer had not begun) gets the client a 502 naming the node; an answer cut after it
began ends with an error event naming the node (streams) or a closed connection.

The list, residents and history routes merge every node's (``merge``), each row naming its node.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

import httpx

from fitevict.cluster import merge
from fitevict.cluster.fleet import Fleet
from fitevict.cluster.route import Candidate, Route, resolve, route, usable
from fitevict.config import Config
from fitevict.server.door import Door, new_request_id
from fitevict.server.errors import ApiError

log = logging.getLogger("fitevict.cluster")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

INFERENCE = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/api/chat", "/api/generate",
             "/api/embed", "/api/embeddings")
REFUSALS = (503, 507)  # the node's door does not take it now: the next candidate may
PASSED_HEADERS = (b"content-type", b"content-length", b"retry-after", b"x-request-id")


class _Keys:
    """The front door's key rule is one machine's (``Door.check_key``), over this config."""

    def __init__(self, config: Config) -> None:
        self.config = config

    def check(self, scope: Scope, *, admin: bool = False) -> None:
        h = dict(scope["headers"])
        Door.check_key(self, h.get(b"authorization", b"").decode("latin-1"),  # type: ignore[arg-type]
                       h.get(b"x-api-key", b"").decode("latin-1"), admin=admin)


class ClusterDoor:
    """ASGI app over a ``Fleet``: relays inference, merges the lists, and runs the fleet's poll."""

    def __init__(self, config: Config, fleet: Fleet) -> None:
        self.config, self.fleet = config, fleet
        self.keys = _Keys(config)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(connect=5.0, read=None, write=60.0, pool=None),
                                        limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100))
        self._poll: asyncio.Task | None = None

    # -- ASGI -------------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        path = scope["path"]
        try:
            if path in INFERENCE:
                return await self.infer(scope, receive, send)
            answer = GETS.get(path)
            if answer is None:
                raise ApiError(404, f"no route {path} at the cluster's front door", type="not_found_error")
            if scope["method"] not in ("GET", "HEAD"):
                raise ApiError(405, "Method Not Allowed", headers={"Allow": "GET"})
            if path != "/health":
                self.keys.check(scope, admin=path == "/v1/cluster/nodes")
            doc = await answer(self, scope)
        except ApiError as e:
            return await self._error(e, path, scope, receive, send)
        await _send_json(send, 200, doc)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await self.fleet.sync_nodes()
                await self.fleet.wait_started()
                self._poll = asyncio.create_task(self.fleet.run())
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                if self._poll is not None:
                    self._poll.cancel()
                await self.client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    @staticmethod
    async def _error(e: ApiError, path: str, scope: Scope, receive: Receive, send: Send) -> None:
        if path.startswith("/api/"):  # Ollama's shape
            await _send_json(send, e.status, {"error": e.message}, e.headers)
        else:
            await e.response()(scope, receive, send)

    # -- inference ----------------------------------------------------------------------------------

    async def infer(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        path = scope["path"]
        rid = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1") or new_request_id()
        try:
            if scope["method"] != "POST":
                raise ApiError(405, "Method Not Allowed", headers={"Allow": "POST"})
            self.keys.check(scope)
            raw = await _read_body(receive, self.config.server.max_body_bytes)
            key, contract = self._model_of(raw)
            plan = await self.route(key, contract)
            if not plan.candidates:
                raise _no_node(key, plan)
        except ApiError as e:
            return await self._error(e, path, scope, receive, send)
        tried: list[str] = []
        seen: set[str] = set()
        for attempt in range(2):  # a node found lost on the way: route again, without it, once
            for cand in (c for c in plan.candidates if c.node not in seen):
                seen.add(cand.node)
                if await self._try(cand, path, raw, rid, scope, receive, send, tried):
                    log.info(json.dumps({"request_id": rid, "model": key, "node": cand.node, "route": cand.why,
                                         "tried": tried, "total_s": round(time.perf_counter() - t0, 4)}))
                    return
            if attempt or not any("unreachable" in t for t in tried):
                break
            plan = await self.route(key, contract)
        err = ApiError(507, f"no node took {key}: " + "; ".join(tried), type="insufficient_memory",
                       code="no_node", headers={"x-should-retry": "false"})
        await self._error(err, path, scope, receive, send)

    def _model_of(self, raw: bytes) -> tuple[str, dict | None]:
        try:
            body = json.loads(raw or b"null")
        except ValueError as e:
            raise ApiError(400, f"request body is not valid JSON: {e}", code="invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object", code="invalid_body")
        name = body.get("model") or body.get("name")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "'model' is required: name a model from GET /v1/models", param="model",
                           code="missing_model")
        key = resolve(name, self.fleet.snapshot())
        if key is None:
            raise ApiError(404, f"model {name!r} does not exist on any node (GET /v1/models lists them)",
                           type="not_found_error", param="model", code="model_not_found")
        contract = body.get("fitevict")
        return key, contract if isinstance(contract, dict) else None

    async def route(self, key: str, contract: dict | None) -> Route:
        """The routing rule over the fleet's facts; without a hit, with the dry runs of the nodes that may load."""
        facts, now, max_age = self.fleet.snapshot(), time.time(), self.fleet.max_age_s
        if contract is None:  # a contract may need a reload on the resident's node: the dry runs say
            found = route(key, facts, None, now, max_age)
            if found.candidates:
                return found
        nodes, _out = usable(facts, key, now, max_age)
        verdicts = await self.fleet.verdicts(key, [f.node for f in nodes], contract)
        return route(key, facts, verdicts, time.time(), max_age) if verdicts else route(key, facts, [], now, max_age)

    async def _try(self, cand: Candidate, path: str, raw: bytes, rid: str, scope: Scope, receive: Receive,
                   send: Send, tried: list[str]) -> bool:
        """Relay to ``cand``'s door. True when the client got its answer (or an error naming a lost node); False
        when the node refused or could not be reached (``tried`` says why): the next candidate's turn."""
        door = self.fleet.door(cand.node)
        if door is None:
            tried.append(f"{cand.node}: left the cluster")
            return False
        url, key = door
        headers = {"authorization": f"Bearer {key}", "content-type": "application/json", "x-request-id": rid}
        for name, value in scope["headers"]:
            if name.startswith(b"x-fitevict-"):
                headers[name.decode("latin-1")] = value.decode("latin-1")
        req = self.client.build_request("POST", url + path, content=raw, headers=headers)
        try:
            resp = await self.client.send(req, stream=True)
        except httpx.ConnectError as e:  # nothing reached the node: another may take it
            self.fleet.mark_lost(cand.node, f"its door refused the connection: {e!r}")
            self.fleet.poke()
            tried.append(f"{cand.node}: unreachable ({type(e).__name__})")
            return False
        except httpx.TransportError as e:  # the node went while the request was on it
            self.fleet.mark_lost(cand.node, f"lost with a request in flight: {e!r}")
            self.fleet.poke()
            await self._error(_lost(cand.node, path, e), path, scope, receive, send)
            return True
        if resp.status_code in REFUSALS:
            why = (await resp.aread()).decode(errors="replace")[:500]
            await resp.aclose()
            tried.append(f"{cand.node}: answered {resp.status_code}: {why}")
            return False
        await self._stream(cand, resp, path, send)
        if cand.why != "hit":
            self.fleet.poke()  # it loaded (or evicted) there: fresh facts now
        return True

    async def _stream(self, cand: Candidate, resp: httpx.Response, path: str, send: Send) -> None:
        head = [(k, v) for k, v in resp.headers.raw if k.lower() in PASSED_HEADERS or k.lower().startswith(b"x-fitevict")]
        head += [(b"x-fitevict-node", cand.node.encode()), (b"x-fitevict-route", cand.why.encode())]
        await send({"type": "http.response.start", "status": resp.status_code, "headers": head})
        sse = resp.headers.get("content-type", "").startswith("text/event-stream")
        try:
            async for chunk in resp.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.TransportError as e:
            self.fleet.mark_lost(cand.node, f"lost during an answer: {e!r}")
            self.fleet.poke()
            err = _lost(cand.node, path, e)
            tail = (b"data: " + json.dumps({"error": {"message": err.message, "type": err.type, "code": err.code,
                                                      "node": cand.node}}).encode() + b"\n\n") if sse else b""
            await send({"type": "http.response.body", "body": tail, "more_body": False})
            return
        finally:
            await resp.aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # -- merged views -------------------------------------------------------------------------------

    async def each_node(self, path: str, params: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
        """``GET path`` on every routable node's door, at once; a node that fails is left out (and logged)."""
        nodes = [f.node for f in self.fleet.snapshot() if f.error is None]

        async def one(node: str) -> tuple[str, dict[str, Any] | None]:
            door = self.fleet.door(node)
            if door is None:
                return node, None
            try:
                r = await self.client.get(door[0] + path, params=params, timeout=30.0,
                                          headers={"authorization": f"Bearer {door[1]}"})
                r.raise_for_status()
                return node, r.json()
            except (httpx.HTTPError, ValueError) as e:
                log.warning("node %s: %s failed: %r", node, path, e)
                return node, None

        got = await asyncio.gather(*(one(n) for n in nodes))
        return {n: doc for n, doc in got if doc is not None}


def _lost(node: str, path: str, e: Exception) -> ApiError:
    return ApiError(502, f"node {node} was lost with this request in flight ({type(e).__name__}); its models load "
                         f"elsewhere on the next request", type="node_lost", code="node_lost",
                    headers={"x-should-retry": "true", "x-fitevict-node": node}, extra={"node": node})


def _no_node(key: str, plan: Route) -> ApiError:
    lost = [n for n, why in plan.refused if why.startswith(("facts", "lost"))]
    status = 503 if lost and all(why.startswith(("facts", "lost", "has no files")) for _n, why in plan.refused) else 507
    return ApiError(status, f"no node can serve {key} now: {plan.reasons()}",
                    type="insufficient_memory" if status == 507 else "server_busy", code="no_node",
                    headers={"x-should-retry": "false" if status == 507 else "true"},
                    extra={"nodes": [{"node": n, "reason": why} for n, why in plan.refused]})


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ApiError(499, "client disconnected")
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body exceeds {limit} bytes (server.max_body_bytes)", code="body_too_large")
        chunks.append(chunk)
        if not msg.get("more_body"):
            return b"".join(chunks)


async def _send_json(send: Send, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
    body = json.dumps(doc).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items())]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


# -- the merged GET routes -------------------------------------------------------------------------------

def _query(scope: Scope) -> dict[str, str]:
    return dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))


async def _models(door: ClusterDoor, scope: Scope) -> dict[str, Any]:
    lists, res = await asyncio.gather(door.each_node("/v1/models"), door.each_node("/v1/models/residents"))
    return merge.models(lists, merge.resident_nodes(res))


async def _residents(door: ClusterDoor, scope: Scope) -> dict[str, Any]:
    return merge.residents(await door.each_node("/v1/models/residents"))


async def _history(door: ClusterDoor, scope: Scope) -> dict[str, Any]:
    q = _query(scope)
    limit = int(q.get("limit") or 100)
    return merge.history(await door.each_node("/v1/models/history", q), limit)


async def _tags(door: ClusterDoor, scope: Scope) -> dict[str, Any]:
    return merge.tags(await door.each_node("/api/tags"))


async def _health(door: ClusterDoor, scope: Scope) -> dict[str, Any]:
    facts = door.fleet.snapshot()
    return {"status": "ok", "nodes": len(door.fleet.members), "routable": sum(f.error is None for f in facts)}


async def _nodes(door: ClusterDoor, scope: Scope) -> dict[str, Any]:
    now = time.time()
    rows = []
    for m in door.fleet.members.values():
        f = m.facts
        rows.append({"node": m.node, "url": m.url, "pid": m.pid, "routable": m.lost_since is None and f is not None,
                     "lost_since": m.lost_since, "why_lost": m.why_lost or None,
                     "facts_age_s": round(f.age(now), 3) if f is not None else None,
                     "residents": [s.key for s in f.seats] if f is not None else [],
                     "budget_bytes": dict(f.budget_bytes) if f is not None else {},
                     "room_bytes": dict(f.room_bytes) if f is not None else {},
                     "models": sorted(f.models) if f is not None else []})
    return {"object": "list", "data": rows}


GETS: dict[str, Callable[[ClusterDoor, Scope], Awaitable[dict[str, Any]]]] = {
    "/health": _health, "/v1/models": _models, "/v1/models/residents": _residents,
    "/v1/models/history": _history, "/api/tags": _tags, "/v1/cluster/nodes": _nodes,
}

__all__ = ["ClusterDoor", "GETS", "INFERENCE"]
