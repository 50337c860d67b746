"""The cluster's front door: the same OpenAI and Ollama routes as one machine's, answered by a node's door.

For an inference request it reads the model's name, asks the routing rule (``route``) for candidate nodes and
relays the request, as received, to the first that takes it: the answer's bytes go from the node's door to the
client as they arrive, over HTTP (never through Ray's object store). A node that refuses (507: does not fit, 503:
busy), says it is shutting down (503: it leaves routing), cannot be reached, is lost before the first byte of its
answer (the client has been sent nothing), or whose seat routed as a hit is gone (its engine refused the
connection) sends the request to the next candidate, with the reason logged; when a node was lost or a residence
gone on the way, the request is routed again without them, once. A request in flight on a node that leaves
routing, answered 502 by its door, is cut: 502 ``node_lost``, ``x-should-retry: true``; an answer cut after its
first byte ends with an error naming the node: an error event (``node_lost``) for a stream, a closed connection
for a whole answer. When no node takes it, the client gets 507 when every node refused it on bytes, else 503
(retry), with each node's reason.

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
from fitevict.cluster.route import Candidate, Route, meaning, no_node_status, resolve, route, usable
from fitevict.cluster.wire import Receive, Scope, Send, query, read_body, send_error, send_json
from fitevict.config import Config
from fitevict.server.door import Door, new_request_id
from fitevict.request.aliases import Aliases
from fitevict.server.errors import ApiError
from fitevict.server.routes import ROUTES

log = logging.getLogger("fitevict.cluster")

# every route a node's fast path relays to a seat (server.routes), and Ollama's
INFERENCE = frozenset((*ROUTES, "/api/chat", "/api/generate", "/api/embed", "/api/embeddings"))
# answers read whole before anything is sent, for what they mean (route.meaning): the node's door does not take it
# now (503, 507; 529 on Anthropic's routes), it is shutting down (503), or its engine is gone or was cut (502)
READ_FIRST = (502, 503, 507, 529)
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
        seen: set[tuple[str, str]] = set()  # (node, route) offered: a node whose hit was gone may still load it
        for attempt in range(2):  # a node lost or a residence gone on the way: route again, without them
            for cand in (c for c in plan.candidates if (c.node, c.why) not in seen and c.node not in tried.lost):
                seen.add((cand.node, cand.why))
                if await self._try(cand, raw, rid, scope, receive, send, tried, name_node):
                    self.routed[cand.node, cand.why] = self.routed.get((cand.node, cand.why), 0) + 1
                    log.info(json.dumps({"request_id": rid, "model": key, "path": path, "node": cand.node,
                                         "route": cand.why, "tried": [f"{n}: {w}" for n, w in tried.reasons],
                                         "total_s": round(time.perf_counter() - t0, 4)}))
                    return
            if attempt or not (tried.lost or tried.gone):
                break
            plan = await self.route(key, contract)
        offered = {n for n, _why in seen}
        tried.refused += [(n, why) for n, why in plan.refused if n not in offered]
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
            tried.reasons.append((cand.node, "left the cluster"))
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
        if resp.status_code in READ_FIRST:
            try:
                body = await resp.aread()
            except httpx.TransportError as e:
                self._lost_before(cand.node, e, tried)
                return False
            finally:
                await resp.aclose()
            if not await self._error_answer(cand, resp, body, path, scope, receive, send, tried, name_node):
                return False
        elif not await self._stream(cand, resp, path, send, name_node, tried):
            return False
        if cand.why != "hit":
            self.fleet.poke()  # it loaded (or evicted) there: fresh facts now
        return True

    async def _error_answer(self, cand: Candidate, resp: httpx.Response, body: bytes, path: str, scope: Scope,
                            receive: Receive, send: Send, tried: Tried, name_node: bool) -> bool:
        """A node's error answer, read whole, by what it means (``route.meaning``): False when the request goes
        on to the next candidate (``tried`` says why); True when the client got an answer (the node's own, or
        502 ``node_lost`` for a request in flight on a node that left routing)."""
        text = body.decode(errors="replace")
        what = meaning(resp.status_code, text, cand.why, self.fleet.routable(cand.node))
        if what == "stopping":
            self.fleet.mark_lost(cand.node, f"its door is shutting down (answered {resp.status_code})",
                                 stopping=True)
            self.fleet.poke()
            tried.lost.add(cand.node)
        elif what == "gone":
            self.fleet.drop_resident(cand.node, cand.seat, "its engine refused the connection of a hit")
            self.fleet.poke()
            tried.gone.add(cand.node)
        elif what == "cut":
            await send_error(_lost(cand.node, path, None), path, scope, receive, send)
            return True
        elif what in ("refused", "busy"):
            tried.busy = tried.busy or what == "busy"
        else:
            await self._send_read(cand, resp, body, send, name_node)
            return True
        tried.reasons.append((cand.node, f"answered {resp.status_code}: {text[:500]}"))
        return False

    def _lost_before(self, node: str, e: Exception, tried: Tried) -> None:
        """``node`` was lost before the first byte of its answer: it leaves routing, and the request may go on."""
        why = ("its door refused the connection" if isinstance(e, httpx.ConnectError) else
               "lost before the first byte of its answer")
        self.fleet.mark_lost(node, f"{why}: {e!r}")
        self.fleet.poke()
        tried.lost.add(node)
        tried.reasons.append((node, f"{why} ({type(e).__name__})"))

    async def _send_read(self, cand: Candidate, resp: httpx.Response, body: bytes, send: Send,
                         name_node: bool) -> None:
        """Send a node's answer read whole (``body``), as it came (a JSON one naming its node if ``name_node``)."""
        head = _head(cand, resp)
        if name_node and resp.headers.get("content-type", "").startswith("application/json"):
            try:
                doc = json.loads(body)
            except ValueError:
                doc = None
            if isinstance(doc, dict):
                body = json.dumps({**doc, "node": cand.node, "route": cand.why}).encode()
        head = [(k, v) for k, v in head if k.lower() != b"content-length"]
        head.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": resp.status_code, "headers": head})
        await send({"type": "http.response.body", "body": body})

    async def _stream(self, cand: Candidate, resp: httpx.Response, path: str, send: Send, name_node: bool,
                      tried: Tried) -> bool:
        """Relay ``resp`` to the client; False, with nothing sent, when the node was lost before the answer's first
        byte (its status line is held until then)."""
        head = _head(cand, resp)
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
            body = await resp.aread()
            json.loads(body)
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
        await self._send_read(cand, resp, body, send, True)
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
    """The nodes a request was offered to and why each did not take it (``reasons``), those lost on the way (lost,
    or shutting down), those whose residence was gone, whether one was busy, and the route's other refusals."""

    def __init__(self) -> None:
        self.reasons: list[tuple[str, str]] = []  # (node, why it did not take it), in the order offered
        self.lost: set[str] = set()
        self.gone: set[str] = set()
        self.busy = False
        self.refused: list[tuple[str, str]] = []  # the route's reasons for the nodes never offered it

    def error(self, key: str) -> ApiError:
        """No node took it: 507 when every node refused it on bytes, else 503 (a retry is routed afresh)."""
        refused = self.reasons + self.refused
        status = no_node_status(refused, lost=bool(self.lost), busy=self.busy or bool(self.gone))
        return _no_node_error(status, f"no node took {key}: {'; '.join(f'{n}: {w}' for n, w in refused)}",
                              refused, sorted(self.lost))


def _no_node_error(status: int, message: str, refused: list[tuple[str, str]], lost: list[str]) -> ApiError:
    """503 or 507 ``no_node`` with each node's reason (``error.nodes``) and the nodes lost (``error.lost``)."""
    extra: dict[str, Any] = {"nodes": [{"node": n, "reason": why} for n, why in refused]}
    if lost:
        extra["lost"] = lost
    if status == 507:
        return ApiError(507, message, type="insufficient_memory", code="no_node",
                        headers={"x-should-retry": "false"}, extra=extra)
    return ApiError(503, message, type="server_busy", code="no_node",
                    headers={"x-should-retry": "true", "retry-after": "1"}, extra=extra)


def _head(cand: Candidate, resp: httpx.Response) -> list[tuple[bytes, bytes]]:
    """The headers relayed from a node's answer, and where it was served."""
    head = [(k, v) for k, v in resp.headers.raw if k.lower() in PASSED_HEADERS or k.lower().startswith(b"x-fitevict")]
    return head + [(b"x-fitevict-node", cand.node.encode()), (b"x-fitevict-route", cand.why.encode())]


def _lost(node: str, path: str, e: Exception | None) -> ApiError:
    how = (f"after it began ({type(e).__name__})" if e is not None else
           "before it began: its door answered 502 as the node left routing")
    return ApiError(502, f"node {node} was lost during this answer, {how}; its models load elsewhere on the next "
                         f"request", type="node_lost", code="node_lost",
                    headers={"x-should-retry": "true", "x-fitevict-node": node}, extra={"node": node})


def _no_node(key: str, plan: Route) -> ApiError:
    status = no_node_status(plan.refused, lost=False, busy=False)
    return _no_node_error(status, f"no node can serve {key} now: {plan.reasons()}", list(plan.refused), [])


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
