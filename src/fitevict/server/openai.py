"""The OpenAI-compatible routes: inference proxied to the model's seat, and the model list."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from fitevict.contract import for_embeddings, unservable, with_lora
from fitevict.engines import REGISTRY
from fitevict.loadreport import report_headers
from fitevict.pricing.adapters import listed_adapter_bytes
from fitevict.server import progress
from fitevict.server.door import Door, parse_contract, until_disconnect
from fitevict.server.errors import ApiError
from fitevict.supervisor import SupervisorError

log = logging.getLogger("fitevict.request")

INFERENCE = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/embeddings": "embeddings"}


def router(door: Door) -> APIRouter:
    app = APIRouter()
    config, catalog, sup, metrics, upstream = door.config, door.catalog, door.sup, door.metrics, door.upstream
    check_auth, read_json, resolve = door.check_auth, door.read_json, door.resolve
    check_gguf_file, supervisor_error = door.check_gguf_file, door.supervisor_error

    async def proxy(request: Request, path: str) -> Response:
        t0 = time.perf_counter()
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex[:16]
        endpoint = INFERENCE[path]
        status, model_key, tokens = 500, None, None
        waits: dict[str, float] = {}
        t_seat: float | None = None  # when the seat was ours: inference latency counts from here

        def log_line(extra: dict | None = None) -> None:
            end = time.perf_counter()
            infer = end - t_seat if t_seat is not None else None
            line = {"request_id": rid, "model": model_key, "endpoint": endpoint, "status": status, "tokens": tokens,
                    "queue_wait_s": round(waits.get("queue_s", 0.0), 4), "load_wait_s": round(waits.get("load_s", 0.0), 4),
                    "latency_s": round(infer, 4) if infer is not None else None, "total_s": round(end - t0, 4),
                    **(extra or {})}
            log.info(json.dumps(line))
            metrics.requests.labels(model_key or "-", endpoint, str(status)).inc()
            metrics.total.labels(endpoint).observe(end - t0)
            if infer is not None:
                metrics.latency.labels(endpoint).observe(infer)
            if waits:
                metrics.queue_wait.labels(endpoint).observe(waits.get("queue_s", 0.0))
                metrics.load_wait.labels(endpoint).observe(waits.get("load_s", 0.0))

        try:
            check_auth(request, admin=False)
            body = await read_json(request)
            if not isinstance(body, dict):
                raise ApiError(400, "request body must be a JSON object", code="invalid_body")
            entry = resolve(body.get("model"))
            model_key = entry.key
            contract = parse_contract(body.pop("fitevict", None))
            check_gguf_file(entry, contract)
            if (why := unservable(entry, tuple(REGISTRY))) is not None:
                raise ApiError(400, why, param="model", code="engine_unavailable")
            if endpoint == "embeddings":
                contract = for_embeddings(contract)  # any model: an embeddings seat is loaded for it
            for k, v in entry.settings.request_defaults.items():
                body.setdefault(k, v)  # only when the request lacks the field
            stream = bool(body.get("stream"))
        except ApiError as e:
            status = e.status
            log_line({"error": e.code})
            return e.response()

        if stream and progress.wanted(request.headers):  # opt-in: load progress as SSE comments first
            def ended(code: int) -> None:
                nonlocal status
                status = code
                log_line({"stream": True, "progress": True})

            return progress.openai_stream(door, path, body, entry, contract, rid, waits, ended)

        stack = contextlib.AsyncExitStack()
        try:
            seat = await until_disconnect(request, stack.enter_async_context(
                sup.acquire(entry.key, contract, request_id=rid, timing=waits)))
            if seat is None:  # the client hung up while queued: it has left the queue already
                status = 499
                log_line({"error": "client disconnected while waiting for a seat"})
                return Response(status_code=499)
            t_seat = time.perf_counter()
            body = with_lora(body, seat.config.loras, entry, contract)  # adapters: one base seat, scales per request
            # A bare Request (no client defaults to merge) and our own JSON encoding: the hot path.
            req = httpx.Request("POST", seat.base_url + path, content=json.dumps(body).encode(),
                                headers={"content-type": "application/json", "x-request-id": rid})
            r = await _send_cancellable(upstream, req, request)
            if r is None:
                status = 499
                await stack.aclose()
                log_line({"error": "client disconnected"})
                return Response(status_code=499)
        except SupervisorError as e:
            await stack.aclose()
            err = supervisor_error(e)
            status = err.status
            log_line({"error": err.code})
            return err.response()
        except httpx.HTTPError as e:
            await stack.aclose()
            status = 502
            log_line({"error": "upstream"})
            return ApiError(502, f"{entry.key}: the engine did not answer: {e!r}", type="engine_error").response()
        except BaseException:
            await stack.aclose()
            raise

        status = r.status_code
        media = r.headers.get("content-type", "application/json")
        if stream and status == 200:
            async def relay() -> AsyncIterator[bytes]:
                nonlocal tokens
                chunks = 0
                try:
                    async for chunk in r.aiter_raw():
                        chunks += chunk.count(b"data: ") - chunk.count(b"data: [DONE]")
                        yield chunk
                finally:
                    tokens = chunks
                    await r.aclose()
                    await stack.aclose()
                    log_line({"stream": True})

            return StreamingResponse(relay(), status_code=status, media_type=media,
                                     headers={"x-request-id": rid, "cache-control": "no-cache",
                                              **report_headers(waits)})
        try:
            content = await r.aread()
        finally:
            await r.aclose()
            await stack.aclose()
        extra: dict[str, Any] = {}
        with contextlib.suppress(ValueError):
            doc = json.loads(content)
            usage = doc.get("usage") or {}
            tokens = usage.get("total_tokens")
            if endpoint == "embeddings" and isinstance(doc.get("data"), list):
                data = doc["data"]
                dim = _embedding_dim(data[0].get("embedding")) if data else 0
                extra["embeddings"] = {"count": len(data), "shape": [len(data), dim]}
        if config.server.debug_log_prompts:
            extra["prompt"] = body.get("messages") or body.get("prompt") or body.get("input")
        log_line(extra)
        return Response(content, status_code=status, media_type=media,
                        headers={"x-request-id": rid, **report_headers(waits)})

    @app.post("/v1/chat/completions", tags=["openai"], summary="Chat completion (proxied to the model's seat)")
    async def chat(request: Request) -> Response:
        return await proxy(request, "/v1/chat/completions")

    @app.post("/v1/completions", tags=["openai"], summary="Text completion (proxied to the model's seat)")
    async def completions(request: Request) -> Response:
        return await proxy(request, "/v1/completions")

    @app.post("/v1/embeddings", tags=["openai"], summary="Embeddings from any model (loads an embeddings seat)")
    async def embeddings(request: Request) -> Response:
        return await proxy(request, "/v1/embeddings")

    @app.get("/v1/models", tags=["openai"], summary="The catalog, OpenAI's format, plus residency and bytes")
    async def list_models(request: Request) -> dict:
        check_auth(request, admin=False)
        views = {v["key"]: v for v in sup.resident_views()}
        adapters: dict[str, list[str]] = {}
        for e in catalog.entries():
            if e.base is not None:
                adapters.setdefault(e.base, []).append(e.key)
        data = []
        for e in catalog.entries():
            v = views.get(e.base or e.key)  # an adapter is resident with its base's seat
            data.append({
                "id": e.key, "object": "model", "created": int(Path(e.path).stat().st_mtime) if Path(e.path).exists() else 0,
                "owned_by": "fitevict",
                "fitevict": {"engine": e.engine, "aliases": list(e.aliases), "pinned": e.pinned,
                             "file": {"bytes": e.file_bytes, "source": "file-size"},
                             "resident": v is not None, "state": v["state"] if v else None,
                             "resident_bytes": v["devices"] if v else None,
                             **({"base": e.base, "adapter_bytes": listed_adapter_bytes(e.kind, e.files)}
                                if e.base else {}),
                             **({"adapters": adapters[e.key]} if e.key in adapters else {})},
            })
        return {"object": "list", "data": data}

    # -- admin -------------------------------------------------------------------------------------

    @app.get("/v1/models/{model_id}", tags=["openai"], summary="One model, OpenAI's format")
    async def get_model(model_id: str, request: Request) -> dict:
        check_auth(request, admin=False)
        e = resolve(model_id)
        return {"id": e.key, "object": "model", "owned_by": "fitevict"}

    return app


async def _send_cancellable(client: httpx.AsyncClient, req: httpx.Request, request: Request) -> httpx.Response | None:
    """Send upstream; if the client disconnects first, cancel the upstream request and return None."""
    send = asyncio.create_task(_send_retrying(client, req))

    async def disconnected() -> None:
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                return

    watch = asyncio.create_task(disconnected())
    try:
        done, _ = await asyncio.wait({send, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        send.cancel()
        watch.cancel()
        raise
    if send in done:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        return send.result()
    send.cancel()
    with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
        r = await send
        await r.aclose()
    return None


async def _send_retrying(client: httpx.AsyncClient, req: httpx.Request) -> httpx.Response:
    """llama-server drops a keep-alive connection after a streamed response: retry once on a stale one."""
    try:
        return await client.send(req, stream=True)
    except (httpx.RemoteProtocolError, httpx.ConnectError, httpx.ReadError):
        return await client.send(req, stream=True)


def _embedding_dim(emb: Any) -> int:
    """Length of one embedding, given as a list of floats or base64 of float32 (encoding_format=base64)."""
    if isinstance(emb, str):
        import base64

        return len(base64.b64decode(emb)) // 4
    return len(emb) if isinstance(emb, list) else 0
