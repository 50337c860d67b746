"""The cluster's front door: the same OpenAI and Ollama routes as one machine's, answered by a node's door.

For an inference request it reads the model's name, asks the routing rule (``route``) for candidate nodes and
relays the request, as received, to the first that takes it: the answer's bytes go from the node's door to the
client as they arrive, over HTTP (never through Ray's object store). A node that refuses (507: does not fit, 503:
busy), cannot be reached, or is lost before the first byte of its answer (the client has been sent nothing) sends
the request to the next candidate, with the reason logged; a node lost on the way has the request routed again
without it, once. Only an answer cut after its first byte ends with an error naming the node: an error event
(``node_lost``) for a stream, a closed connection for a whole answer. When no node takes it, the client gets
503 (a node was lost: retry) or 507, with each node's reason.

The admin routes (load, unload, plan, rescan) go to the nodes they concern (``admin``). The list, residents and
history routes merge every node's (``merge``), each row naming its node; ``/metrics`` and the dashboard too
(``page``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from fitevict.cluster import admin, merge, page
from fitevict.cluster.fleet import Fleet
from fitevict.cluster.route import Candidate, Route, resolve, route, usable
from fitevict.cluster.wire import Receive, Scope, Send, query, read_body, send_error, send_json
from fitevict.config import Config
from fitevict.server.door import Door, new_request_id
from fitevict.request.aliases import Aliases
from fitevict.server.errors import ApiError
from fitevict.server.routes import ROUTES

log = logging.getLogger("fitevict.cluster")

# every route a node's fast path relays to a seat (server.routes), and Ollama's
INFERENCE = frozenset((*ROUTES, "/api/chat", "/api/generate", "/api/embed", "/api/embeddings"))
REFUSALS = (503, 507, 529)  # the node's door does not take it now (529: on Anthropic's routes): the next may
PASSED_HEADERS = (b"content-type", b"content-length", b"retry-after", b"x-request-id", b"cache-control")


class _Keys:
    """The front door's key rule is one machine's (``Door.check_key``), over this config."""

    def __init__(self, config: Config) -> None:
        self.config = config

    def check(self, scope: Scope, *, admin: bool = False) -> None:
        h = dict(scope["headers"])
        Door.check_key(self, h.get(b"authorization", b"").decode("latin-1"),  # type: ignore[arg-type]
                       h.get(b"x-api-key", b"").decode("latin-1"), admin=admin)


class ClusterDoor:
    """ASGI app over a ``Fleet``: relays inference and the admin routes, merges the lists, and runs the fleet's
    poll."""

    def __init__(self, config: Config, fleet: Fleet) -> None:
        self.config, self.fleet = config, fleet
        self.keys = _Keys(config)
        self.aliases = Aliases(config.aliases)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(connect=5.0, read=None, write=60.0, pool=None),
                                        limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100))
        self.routed: dict[tuple[str, str], int] = {}  # (node, route) -> requests served there
        self._poll: asyncio.Task | None = None

    # -- ASGI -------------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        path = scope["path"]
        try:
            if path in INFERENCE:
                return await self.infer(scope, receive, send)
            if admin.is_admin(scope["method"], path):
                return await admin.answer(self, scope, receive, send)
            if path in page.PAGES:
                return await page.answer(self, scope, send)
            answer = GETS.get(path)
            if answer is None:
                raise ApiError(404, f"no route {path} at the cluster's front door", type="not_found_error")
            if scope["method"] not in ("GET", "HEAD"):
                raise ApiError(405, "Method Not Allowed", headers={"Allow": "GET"})
            if path != "/health":
                self.keys.check(scope, admin=path == "/v1/cluster/nodes")
            doc = await answer(self, scope)
        except ApiError as e:
            return await send_error(e, path, scope, receive, send)
        await send_json(send, 200, doc)

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

    # -- inference ----------------------------------------------------------------------------------

    async def infer(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        try:
            if scope["method"] != "POST":
                raise ApiError(405, "Method Not Allowed", headers={"Allow": "POST"})
            self.keys.check(scope)
            raw = await read_body(receive, self.config.server.max_body_bytes)
            key, contract, raw = self._model_of(raw)
        except ApiError as e:
            return await send_error(e, path, scope, receive, send)
        await self.relay(key, contract, raw, scope, receive, send)

    async def relay(self, key: str, contract: dict | None, raw: bytes, scope: Scope, receive: Receive, send: Send,
                    *, name_node: bool = False) -> None:
        """Route ``key`` and relay the request as received (its path, query and body ``raw``) to the first
        candidate node that takes it. ``name_node``: a JSON answer gets the node's id as ``node``."""
        t0 = time.perf_counter()
        path = scope["path"]
        rid = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1") or new_request_id()
        try:
            plan = await self.route(key, contract)
            if not plan.candidates:
                raise _no_node(key, plan)
        except ApiError as e:
            return await send_error(e, path, scope, receive, send)
        tried = Tried()
        seen: set[str] = set()
        for attempt in range(2):  # a node lost on the way (nothing sent to the client): route again, without it
            for cand in (c for c in plan.candidates if c.node not in seen):
                seen.add(cand.node)
                if await self._try(cand, raw, rid, scope, receive, send, tried, name_node):
                    self.routed[cand.node, cand.why] = self.routed.get((cand.node, cand.why), 0) + 1
                    log.info(json.dumps({"request_id": rid, "model": key, "path": path, "node": cand.node,
                                         "route": cand.why, "tried": tried.reasons,
                                         "total_s": round(time.perf_counter() - t0, 4)}))
                    return
            if attempt or not tried.lost:
                break
            plan = await self.route(key, contract)
        tried.reasons += [f"{n}: {why}" for n, why in plan.refused if n not in seen]
        await send_error(tried.error(key), path, scope, receive, send)

    def _model_of(self, raw: bytes) -> tuple[str, dict | None, bytes]:
        """The model key the body names, its contract, and the body to relay (naming the key where the body named
        an ``[aliases]`` name: the node's door need not know the alias)."""
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
        contract = body.get("fitevict")
        key = self.resolve(name)
        if key.lower() != name.lower() and self.aliases.match(name) is not None and "model" in body:
            raw = json.dumps({**body, "model": key}).encode()
        return key, contract if isinstance(contract, dict) else None, raw

    def resolve(self, name: str) -> str:
        """The model key ``name`` means on the nodes (a name of the config's ``[aliases]``: its model's), or a 404."""
        facts = self.fleet.snapshot()
        key = resolve(name, facts)
        aliased = self.aliases.match(name) if key is None and self.aliases else None
        if aliased is not None:
            key = resolve(aliased.target, facts)
        if key is None:
            raise ApiError(404, f"model {name!r} does not exist on any node (GET /v1/models lists them)",
                           type="not_found_error", param="model", code="model_not_found")
        return key

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

    async def _try(self, cand: Candidate, raw: bytes, rid: str, scope: Scope, receive: Receive, send: Send,
                   tried: Tried, name_node: bool) -> bool:
        """Relay to ``cand``'s door. True when the client got its answer (or an answer cut after it began); False
        when the node refused, could not be reached or was lost before the answer's first byte (``tried`` says
        why): the next candidate's turn."""
        door = self.fleet.door(cand.node)
        if door is None:
            tried.reasons.append(f"{cand.node}: left the cluster")
            return False
        url, key = door
        path, qs = scope["path"], scope.get("query_string", b"").decode("latin-1")
        headers = {"authorization": f"Bearer {key}", "content-type": "application/json", "x-request-id": rid}
        for name, value in scope["headers"]:
            if name.startswith(b"x-fitevict-"):
                headers[name.decode("latin-1")] = value.decode("latin-1")
        req = self.client.build_request("POST", url + path + (f"?{qs}" if qs else ""), content=raw, headers=headers)
        try:
            resp = await self.client.send(req, stream=True)
        except httpx.TransportError as e:  # no byte of an answer came back: another node may take it
            self._lost_before(cand.node, e, tried)
            return False
        if resp.status_code in REFUSALS:
            why = (await resp.aread()).decode(errors="replace")[:500]
            await resp.aclose()
            tried.reasons.append(f"{cand.node}: answered {resp.status_code}: {why}")
            return False
        if not await self._stream(cand, resp, path, send, name_node, tried):
            return False
        if cand.why != "hit":
            self.fleet.poke()  # it loaded (or evicted) there: fresh facts now
        return True

    def _lost_before(self, node: str, e: Exception, tried: Tried) -> None:
        """``node`` was lost before the first byte of its answer: it leaves routing, and the request may go on."""
        why = ("its door refused the connection" if isinstance(e, httpx.ConnectError) else
               "lost before the first byte of its answer")
        self.fleet.mark_lost(node, f"{why}: {e!r}")
        self.fleet.poke()
        tried.lost.add(node)
        tried.reasons.append(f"{node}: {why} ({type(e).__name__})")

    async def _stream(self, cand: Candidate, resp: httpx.Response, path: str, send: Send, name_node: bool,
                      tried: Tried) -> bool:
        """Relay ``resp`` to the client; False, with nothing sent, when the node was lost before the answer's first
        byte (its status line is held until then)."""
        head = [(k, v) for k, v in resp.headers.raw if k.lower() in PASSED_HEADERS or k.lower().startswith(b"x-fitevict")]
        head += [(b"x-fitevict-node", cand.node.encode()), (b"x-fitevict-route", cand.why.encode())]
        ctype = resp.headers.get("content-type", "")
        if name_node and ctype.startswith("application/json"):  # a whole JSON answer: it names its node
            return await self._named(cand, resp, head, send, tried)
        chunks = resp.aiter_raw()
        try:
            first = await anext(chunks, b"")
        except httpx.TransportError as e:
            await resp.aclose()
            self._lost_before(cand.node, e, tried)
            return False
        await send({"type": "http.response.start", "status": resp.status_code, "headers": head})
        try:
            await send({"type": "http.response.body", "body": first, "more_body": True})
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.TransportError as e:
            self.fleet.mark_lost(cand.node, f"lost during an answer: {e!r}")
            self.fleet.poke()
            err = _lost(cand.node, path, e)
            tail = (b"data: " + json.dumps({"error": {"message": err.message, "type": err.type, "code": err.code,
                                                      "node": cand.node}}).encode() + b"\n\n"
                    ) if ctype.startswith("text/event-stream") else b""
            await send({"type": "http.response.body", "body": tail, "more_body": False})
            return True
        finally:
            await resp.aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True

    async def _named(self, cand: Candidate, resp: httpx.Response, head: list, send: Send, tried: Tried) -> bool:
        try:
            doc = json.loads(await resp.aread())
        except httpx.TransportError as e:  # nothing was sent: another node may take it
            self._lost_before(cand.node, e, tried)
            return False
        except ValueError as e:
            err = ApiError(502, f"node {cand.node} answered what is not JSON: {e}", type="node_error",
                           code="bad_answer", headers={"x-fitevict-node": cand.node}, extra={"node": cand.node})
            await send_json(send, 502, {"error": {"message": err.message, "type": err.type, "param": None,
                                                  "code": err.code, "node": cand.node}}, err.headers)
            return True
        finally:
            await resp.aclose()
        if isinstance(doc, dict):
            doc = {**doc, "node": cand.node, "route": cand.why}
        body = json.dumps(doc).encode()
        head = [(k, v) for k, v in head if k.lower() != b"content-length"]
        head.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": resp.status_code, "headers": head})
        await send({"type": "http.response.body", "body": body})
        return True

    # -- the nodes' own answers -----------------------------------------------------------------------

    async def ask_each(self, method: str, path: str, *, nodes: list[str] | None = None,
                       params: dict[str, str] | None = None, content: bytes | None = None,
                       timeout: float = 30.0) -> dict[str, httpx.Response]:
        """``method path`` on every routable node's door (or on ``nodes``), at once: each node's answer, read. A
        node that cannot be reached is left out (and logged)."""
        if nodes is None:
            nodes = [f.node for f in self.fleet.snapshot() if f.error is None]

        async def one(node: str) -> tuple[str, httpx.Response | None]:
            door = self.fleet.door(node)
            if door is None:
                return node, None
            headers = {"authorization": f"Bearer {door[1]}", **({"content-type": "application/json"}
                                                                 if content else {})}
            try:
                return node, await self.client.request(method, door[0] + path, params=params, content=content,
                                                       headers=headers, timeout=timeout)
            except httpx.HTTPError as e:
                log.warning("node %s: %s %s failed: %r", node, method, path, e)
                return node, None

        got = await asyncio.gather(*(one(n) for n in nodes))
        return {n: r for n, r in got if r is not None}

    async def each_node(self, path: str, params: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
        """``GET path`` on every routable node's door, at once, as JSON; a node that fails is left out (and
        logged). A node's 400 is the query's fault (every node runs the same rules): it is the client's answer."""
        out = {}
        for node, r in (await self.ask_each("GET", path, params=params)).items():
            if r.status_code == 400:
                raise _refused_by(node, r)
            try:
                r.raise_for_status()
                out[node] = r.json()
            except (httpx.HTTPError, ValueError) as e:
                log.warning("node %s: %s failed: %r", node, path, e)
        return out


def _refused_by(node: str, r: httpx.Response) -> ApiError:
    """A node's 400 passed through, its message and param kept, naming the node."""
    try:
        err = r.json()["error"]
        message, param = str(err["message"]), err.get("param")
    except (ValueError, KeyError, TypeError):
        message, param = r.text[:500], None
    return ApiError(400, message, param=param, headers={"x-fitevict-node": node}, extra={"node": node})


class Tried:
    """The nodes a request was offered to and why each did not take it (``reasons``), and those lost on the way."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.lost: set[str] = set()

    def error(self, key: str) -> ApiError:
        """No node took it: 503 when a node was lost on the way (a retry is routed afresh), else 507."""
        why = "; ".join(self.reasons)
        if self.lost:
            return ApiError(503, f"no node took {key}: {why}", type="server_busy", code="no_node",
                            headers={"x-should-retry": "true", "retry-after": "1"},
                            extra={"lost": sorted(self.lost)})
        return ApiError(507, f"no node took {key}: {why}", type="insufficient_memory", code="no_node",
                        headers={"x-should-retry": "false"})


def _lost(node: str, path: str, e: Exception) -> ApiError:
    return ApiError(502, f"node {node} was lost during this answer, after it began ({type(e).__name__}); its models "
                         f"load elsewhere on the next request", type="node_lost", code="node_lost",
                    headers={"x-should-retry": "true", "x-fitevict-node": node}, extra={"node": node})


def _no_node(key: str, plan: Route) -> ApiError:
    lost = [n for n, why in plan.refused if why.startswith(("facts", "lost"))]
    status = 503 if lost and all(why.startswith(("facts", "lost", "has no files")) for _n, why in plan.refused) else 507
    return ApiError(status, f"no node can serve {key} now: {plan.reasons()}",
                    type="insufficient_memory" if status == 507 else "server_busy", code="no_node",
                    headers={"x-should-retry": "false" if status == 507 else "true"},
                    extra={"nodes": [{"node": n, "reason": why} for n, why in plan.refused]})


# -- the merged GET routes -------------------------------------------------------------------------------

async def _models(door: ClusterDoor, scope: Scope) -> dict[str, Any]:
    lists, res = await asyncio.gather(door.each_node("/v1/models"), door.each_node("/v1/models/residents"))
    return merge.models(lists, merge.resident_nodes(res))


async def _residents(door: ClusterDoor, scope: Scope) -> dict[str, Any]:
    return merge.residents(await door.each_node("/v1/models/residents"))


async def _history(door: ClusterDoor, scope: Scope) -> dict[str, Any]:
    q = query(scope)
    limit = int(q.get("limit") or 100)
    return merge.history(await door.each_node("/v1/models/history", q), limit)


async def _tags(door: ClusterDoor, scope: Scope) -> dict[str, Any]:
    return merge.tags(await door.each_node("/api/tags"))


async def _health(door: ClusterDoor, scope: Scope) -> dict[str, Any]:
    facts = door.fleet.snapshot()
    return {"status": "ok", "nodes": len(door.fleet.members), "routable": sum(f.error is None for f in facts),
            "ray": door.fleet.membership.row(time.time())}


async def _nodes(door: ClusterDoor, scope: Scope) -> dict[str, Any]:
    now = time.time()
    return {"object": "list", "data": door.fleet.rows(now), "ray": door.fleet.membership.row(now)}


GETS: dict[str, Callable[[ClusterDoor, Scope], Awaitable[dict[str, Any]]]] = {
    "/health": _health, "/v1/models": _models, "/v1/models/residents": _residents,
    "/v1/models/history": _history, "/api/tags": _tags, "/v1/cluster/nodes": _nodes,
}

__all__ = ["ClusterDoor", "GETS", "INFERENCE"]
