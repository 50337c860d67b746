"""The fast path: the inference routes answered by a raw ASGI handler mounted ahead of FastAPI.

Everything else (admin, /v1/models, dashboard, /metrics, /health) passes through to the FastAPI app. The
rules are the front door's own (``Door``: keys, body limit, model names, load contract, request defaults,
supervisor errors, the OpenAI envelope); only the plumbing is lean:

- the body is read straight from ``receive`` and forwarded as received unless the contract or a default
  changed it;
- the seat is held through ``Supervisor.acquire``; a client that hangs up while queued is taken out of the
  queue at once (its task is cancelled, which the supervisor turns into ``Scheduler.cancel``);
- the answer is relayed by ``relay``: the engine's bytes go to the client as they arrive (``Upstream``);
- token counts come from the response's tail (non-streamed) or the count of SSE events (streamed), and the
  log line and metrics are written after the last byte has been handed to the client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers

from fitevict import shrink
from fitevict.request.contract import with_lora
from fitevict.supervisor.loadreport import report_headers
from fitevict.server import plain, progress
from fitevict.server.clients import PRIORITY_HEADER, share_for
from fitevict.server.door import Door, Prepared, new_request_id, parse_json
from fitevict.server.kvrestore import record_restore, restore_for
from fitevict.server.metrics import Metrics
from fitevict.server.errors import ApiError, engine_error, stream_break
from fitevict.server.relay import Relayed, relay
from fitevict.server.routes import ROUTES, Route
from fitevict.engines.upstream import UpstreamConn, UpstreamError
from fitevict.schedule.fair import Share
from fitevict.supervisor import SupervisorError

__all__ = ["FastPath", "Relayed", "RequestLog", "ROUTES", "relay"]

log = logging.getLogger("fitevict.request")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

PROGRESS = progress.HEADER.encode()
PRIORITY = PRIORITY_HEADER.encode()


# -- the request log line and metrics ------------------------------------------------------------------

class RequestLog:
    """One log line (JSON, logger ``fitevict.request``) and the metrics for each inference request.
    Metric children are looked up once per label set."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._children: dict[tuple, Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*labels)
        return c

    def write(self, rec: Record, extra: dict[str, Any] | None = None) -> None:
        end = time.perf_counter()
        infer = end - rec.t_seat if rec.t_seat is not None else None
        waits, endpoint = rec.waits, rec.endpoint
        if log.isEnabledFor(logging.INFO):
            line = {"request_id": rec.request_id, "model": rec.model, "endpoint": endpoint, "status": rec.status,
                    "tokens": rec.tokens, "queue_wait_s": round(waits.get("queue_s", 0.0), 4),
                    "load_wait_s": round(waits.get("load_s", 0.0), 4),
                    "latency_s": round(infer, 4) if infer is not None else None, "total_s": round(end - rec.t0, 4),
                    **({"wait_estimate_s": round(waits["wait_estimate"].seconds, 4)} if "wait_estimate" in waits
                       else {}),
                    **({"client": rec.share.client, "class": rec.share.klass} if rec.share is not None else {}),
                    **(extra or {})}
            log.info(json.dumps(line))
        m = self.metrics
        self.child(m.requests, rec.model or "-", endpoint, str(rec.status)).inc()
        self.child(m.total, endpoint).observe(end - rec.t0)
        if infer is not None:
            self.child(m.latency, endpoint).observe(infer)
        if waits:
            self.child(m.queue_wait, endpoint).observe(waits.get("queue_s", 0.0))
            self.child(m.load_wait, endpoint).observe(waits.get("load_s", 0.0))
        est = waits.get("wait_estimate")
        if est is not None:  # the wait stated up front, against the wait it had
            self.child(m.estimate_error, endpoint).observe(
                est.seconds - waits.get("queue_s", 0.0) - waits.get("load_s", 0.0))


class Record:
    """One request's figures as it goes: ``t_seat`` is when the seat was ours (inference latency counts
    from there), ``waits`` gets the supervisor's queue_s/load_s split."""

    __slots__ = ("request_id", "endpoint", "t0", "model", "status", "tokens", "waits", "t_seat", "share")

    def __init__(self, request_id: str, endpoint: str, t0: float) -> None:
        self.request_id, self.endpoint, self.t0 = request_id, endpoint, t0
        self.model: str | None = None
        self.status = 500
        self.tokens: int | None = None
        self.waits: dict[str, float] = {}
        self.t_seat: float | None = None
        self.share: Share | None = None  # who it is, for fairness (server.clients)


# -- the ASGI handler ----------------------------------------------------------------------------------

class _Hangup:
    """Watches ``receive`` for the client's disconnect while armed, and cancels the request's task then:
    in the queue that takes the request out of it; during inference it aborts the engine connection."""

    __slots__ = ("task", "armed", "gone", "watch")

    def __init__(self, receive: Receive) -> None:
        self.task = asyncio.current_task()
        self.armed, self.gone = True, False
        self.watch = asyncio.ensure_future(receive())
        self.watch.add_done_callback(self._seen)

    def _seen(self, t: asyncio.Future) -> None:
        if self.armed and not t.cancelled() and t.exception() is None and t.result()["type"] == "http.disconnect":
            self.gone = True
            assert self.task is not None
            self.task.cancel()

    def disarm(self) -> None:
        self.armed = False
        self.watch.cancel()


class FastPath:
    """ASGI app: ``ROUTES`` and ``plain.ROUTES`` here, the ASGI lifespan (``startup``, ``shutdown``), anything
    else to the app that ``build`` makes on the first request that needs it (the FastAPI app)."""

    def __init__(self, door: Door, *, build: Callable[[], Any], startup: Callable[[], Awaitable[None]],
                 shutdown: Callable[[], Awaitable[None]], state: Any) -> None:
        self.door = door
        self.state = state
        self.log = RequestLog(door.metrics)
        self._build, self._startup, self._shutdown = build, startup, shutdown
        self._app: Any = None

    @property
    def app(self) -> Any:
        """The app behind the fast path, built now if no request needed it yet."""
        if self._app is None:
            self._app = self._build()
        return self._app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            route = ROUTES.get(path)
            if route is not None:
                return await self.serve(route, scope, receive, send)
            if path in plain.ROUTES:
                return await plain.answer(self.door, path, scope, send)
        elif kind == "lifespan":
            return await self._lifespan(receive, send)
        await self.app(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """ASGI's lifespan protocol: start the supervisor and its helpers, and stop them at the end."""
        while True:
            msg = await receive()
            step = msg["type"].rsplit(".", 1)[-1]  # "startup" or "shutdown"
            try:
                await (self._startup() if step == "startup" else self._shutdown())
            except BaseException as e:
                await send({"type": f"lifespan.{step}.failed", "message": f"{type(e).__name__}: {e}"})
                raise
            await send({"type": f"lifespan.{step}.complete"})
            if step == "shutdown":
                return

    async def serve(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        auth = api_key = rid = length = priority = ""
        progress_asked = False
        for name, value in scope["headers"]:
            if name == b"authorization":
                auth = value.decode("latin-1")
            elif name == b"x-api-key":
                api_key = value.decode("latin-1")
            elif name == b"content-length":
                length = value.decode("latin-1")
            elif name == b"x-request-id":
                rid = value.decode("latin-1")
            elif name == PROGRESS:
                progress_asked = True
            elif name == PRIORITY:
                priority = value.decode("latin-1")
        rec = Record(rid or new_request_id(), route.endpoint, t0)
        door = self.door
        try:
            if scope["method"] != "POST":
                raise ApiError(405, "Method Not Allowed", headers={"Allow": "POST"})
            client = door.check_key(auth, api_key, admin=False)
            if length.isdigit():
                door.check_body_size(int(length), declared=True)
            raw = await self._read_body(receive)
            if raw is None:
                rec.status = 499
                return self.log.write(rec, {"error": "client disconnected"})
            body = parse_json(raw)
            prep = door.prepare(body, route)
            rec.model = prep.entry.key
            rec.share = share_for(door.config, client, priority, body)
        except ApiError as e:
            response = e.response(route.api)
            rec.status = response.status_code
            await response(scope, receive, send)
            return self.log.write(rec, {"error": e.code})
        if progress_asked and body.get("stream") and progress.wanted(Headers(scope=scope)):
            return await self._with_progress(scope, receive, send, rec, body, prep)
        payload = json.dumps(body).encode() if prep.changed else raw
        await self._infer(scope, receive, send, rec, body, prep, payload, route)

    async def _with_progress(self, scope: Scope, receive: Receive, send: Send, rec: Record, body: dict,
                             prep: Prepared) -> None:
        """A stream that asked for load progress (``progress``): its own response, started before the seat."""
        def ended(code: int) -> None:
            rec.status = code
            self.log.write(rec, {"stream": True, "progress": True})

        await progress.openai_stream(self.door, scope["path"], body, prep.ask, rec.request_id,
                                     rec.waits, ended, share=rec.share)(scope, receive, send)

    async def _read_body(self, receive: Receive) -> bytes | None:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        raw = msg.get("body", b"")
        if not msg.get("more_body"):
            self.door.check_body_size(len(raw), declared=False)
            return raw
        chunks, size = [raw], len(raw)
        while msg.get("more_body"):
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return None
            chunk = msg.get("body", b"")
            size += len(chunk)
            self.door.check_body_size(size, declared=False)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _infer(self, scope: Scope, receive: Receive, send: Send, rec: Record, body: dict, prep: Prepared,
                     payload: bytes, route: Route) -> None:
        door, path = self.door, scope["path"]
        hangup = _Hangup(receive)
        held = None
        out: Relayed | None = None
        extra: dict[str, Any] = {}
        restored = None
        try:
            need = shrink.need(body, prep.entry.settings.request_defaults) if door.config.policy.shrink_ctx else None
            cm = door.sup.acquire(prep.ask, request_id=rec.request_id, timing=rec.waits, need=need,
                                  origin=prep.origin(rec.endpoint), share=rec.share,
                                  max_tokens=shrink.max_tokens(body, prep.entry.settings.request_defaults))
            seat = await cm.__aenter__()
            held = cm
            rec.t_seat = time.perf_counter()
            sent = with_lora(body, seat.config.loras, prep.entry, prep.contract)  # adapters: scales per request
            if seat.kv_candidates:  # a saved prompt of this seat's signature may spare the prefill
                sent, restored = await restore_for(door.sup, seat, rec.endpoint, sent, rec.request_id)
                if restored is not None:
                    extra["kv_restore"] = restored.to_json()
                    rec.waits["kv_restore"] = restored.to_json()
            if sent is not body:
                payload = json.dumps(sent).encode()
            report: list = []  # the load report's header, made while the engine works (again if the seat says more)

            def seat_headers(conn: UpstreamConn) -> tuple[tuple[bytes, bytes], ...]:
                if conn.adapter is not None or not report:
                    report[:] = [report_headers(rec.waits, conn.adapter)]
                return tuple((k.encode(), v.encode()) for k, v in report[0].items())

            out = await relay(door.pool, send, seat.port, path, payload, rec.request_id, headers=named(prep, extra),
                              seat_headers=seat_headers,
                              on_sent=lambda: report.append(report_headers(rec.waits)),
                              on_error=lambda status, raw: engine_error(route.api, seat.key, status, raw),
                              on_break=lambda why: stream_break(route.api, seat.key, seat.killed_for or why))
            hangup.disarm()
        except asyncio.CancelledError:
            hangup.disarm()
            if not hangup.gone:
                raise
            assert hangup.task is not None
            hangup.task.uncancel()
            rec.status, extra["error"] = 499, "client disconnected"
        except SupervisorError as e:
            hangup.disarm()
            err = door.supervisor_error(e)
            response = err.response(route.api)
            rec.status, extra["error"] = response.status_code, err.code
            await response(scope, receive, send)
        except UpstreamError as e:
            hangup.disarm()
            rec.status, extra["error"] = 502, "upstream"
            await ApiError(502, f"{rec.model}: the engine did not answer: {e}", type="engine_error").response(
                route.api)(scope, receive, send)
        except BaseException:
            hangup.disarm()
            raise
        finally:
            try:
                if out is not None:  # the answer has gone out: its figures, and the seat's timing totals
                    rec.status = out.status if out.error is None else 502
                    self._account(rec, out, body, extra, seat)
                if restored is not None:  # whether it counted, by the answer's own timings
                    seen = {**extra.get("engine_timings", {}), **_cache_n(out)}
                    extra["kv_restore"] = {**restored.to_json(),
                                           **await record_restore(door.sup, seat, restored, seen, rec.request_id)}
            finally:
                if held is not None:
                    await held.__aexit__(None, None, None)
        self.log.write(rec, extra)

    def _account(self, rec: Record, out: Relayed, body: dict, extra: dict[str, Any], seat: Any) -> None:
        """Token counts and embedding shapes for the log line, and the engine's timings added to the seat's totals
        (``seat.timings``, history when the seat ends), read after the answer went out."""
        if out.error is not None:
            extra["error"] = f"upstream broke off: {out.error}"
        content = out.body[0] if len(out.body) == 1 else b"".join(out.body)
        timings = engine_timings(content)
        if timings:  # the engine's own account: prompt and generation time, tokens/s
            extra["engine_timings"] = timings
            seat.timings.add(timings)
            if "predicted_n" in timings:  # the wait estimate's measured generation (supervisor.acquire)
                rec.waits["generated_tokens"] = int(timings["predicted_n"])
            m, model, child = self.door.metrics, rec.model or "-", self.log.child
            if "prompt_ms" in timings:
                child(m.prompt, model).observe(timings["prompt_ms"] / 1000)
            if "predicted_ms" in timings:
                child(m.generation, model).observe(timings["predicted_ms"] / 1000)
            if "predicted_per_second" in timings:
                child(m.gen_tps, model).set(timings["predicted_per_second"])
            if "prompt_per_second" in timings:
                child(m.prompt_tps, model).set(timings["prompt_per_second"])
        if out.streamed:
            rec.tokens = total_tokens(content)  # None when the answer says nothing: never a count of events
            extra["stream"] = True
            extra["events"] = out.events
        elif rec.endpoint == "embeddings":
            _embeddings_extra(content, rec, extra)
        else:
            rec.tokens = total_tokens(content)
        if self.door.config.server.debug_log_prompts:
            extra["prompt"] = body.get("messages") or body.get("prompt") or body.get("input")


def named(prep: Prepared, extra: dict[str, Any]) -> tuple[tuple[bytes, bytes], ...]:
    """The answer's headers that name the model that served it, and the ``[aliases]`` name it was asked by (the
    log line's ``asked_as`` and ``alias``)."""
    model = (b"x-fitevict-model", prep.entry.key.encode())
    a = prep.aliased
    if a is None:
        return (model,)
    extra["asked_as"], extra["alias"] = a.name, a.alias
    return model, (b"x-fitevict-alias", a.name.encode("latin-1", "replace"))


def total_tokens(content: bytes) -> int | None:
    """Prompt plus generated tokens of an answer, read from its tail: ``usage.total_tokens`` where llama-server
    writes OpenAI's usage, Anthropic's ``input_tokens + output_tokens (+ cache_read_input_tokens)``, else its ``timings`` (``prompt_n + predicted_n``, a chat stream's last event)."""
    total = _int_after(content, b'"total_tokens":')
    if total is not None:
        return total
    prompt = _int_after(content, b'"input_tokens":')  # Anthropic's usage (and a count of tokens)
    if prompt is not None:
        return prompt + (_int_after(content, b'"output_tokens":') or 0) + (
            _int_after(content, b'"cache_read_input_tokens":') or 0)
    prompt, predicted = _int_after(content, b'"prompt_n":'), _int_after(content, b'"predicted_n":')
    return prompt + predicted if prompt is not None and predicted is not None else None


def _cache_n(out: Relayed | None) -> dict[str, int]:
    """The prompt tokens the engine took from its cache for this answer (its ``timings.cache_n``), if it said."""
    if out is None:
        return {}
    n = _int_after(out.body[0] if len(out.body) == 1 else b"".join(out.body), b'"cache_n":')
    return {} if n is None else {"cache_n": n}


TIMING_KEYS = ("prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_second")
_TIMING_FIELDS = tuple((k, f'"{k}":'.encode()) for k in TIMING_KEYS)


def engine_timings(content: bytes) -> dict[str, float]:
    """llama-server's ``timings`` of an answer (the last ones in a stream), read from its tail: prompt and generation
    tokens, milliseconds and tokens/s as the engine measured them. Empty when the answer carries none."""
    i = content.rfind(b'"timings":')
    if i < 0:
        return {}
    tail = content[i:]
    out: dict[str, float] = {}
    for key, field in _TIMING_FIELDS:
        v = _number_after(tail, field)
        if v is not None:
            out[key] = v
    return out


_NUMBER = re.compile(rb"[ \t]*([0-9.eE+-]+)")


def _number_after(content: bytes, key: bytes) -> float | None:
    i = content.find(key)
    m = _NUMBER.match(content, i + len(key)) if i >= 0 else None
    if m is None:
        return None
    try:
        return float(m[1])
    except ValueError:
        return None


def _int_after(content: bytes, key: bytes) -> int | None:
    """The last integer after ``key`` in ``content`` (a usage or timings figure)."""
    i = content.rfind(key)
    v = _number_after(content[i:], key) if i >= 0 else None
    return int(v) if v is not None and v == int(v) else None


def _embeddings_extra(content: bytes, rec: Record, extra: dict[str, Any]) -> None:
    try:
        doc = json.loads(content)
    except ValueError:
        return
    rec.tokens = (doc.get("usage") or {}).get("total_tokens")
    if isinstance(doc.get("data"), list):
        data = doc["data"]
        dim = _embedding_dim(data[0].get("embedding")) if data else 0
        extra["embeddings"] = {"count": len(data), "shape": [len(data), dim]}


def _embedding_dim(emb: Any) -> int:
    """Length of one embedding, given as a list of floats or base64 of float32 (encoding_format=base64)."""
    if isinstance(emb, str):
        import base64

        return len(base64.b64decode(emb)) // 4
    return len(emb) if isinstance(emb, list) else 0
