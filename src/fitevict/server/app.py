"""The ASGI app: OpenAI-compatible inference routes proxied to seats, the admin API, /metrics, /health.

Requests are validated before anything changes: a bad body, an unknown model, a bad load contract,
an oversized body or a wrong key is answered with a 4xx in OpenAI's envelope and no state changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from fitevict import __version__
from fitevict.catalog import Catalog, GgufFileError, UnknownModel
from fitevict.config import Config
from fitevict.store import Store
from fitevict.store.records import EVENTS
from fitevict.supervisor import Busy, Contract, LoadFailed, Refused, Supervisor, SupervisorError
from fitevict.server.errors import ApiError
from fitevict.units import GiB

log = logging.getLogger("fitevict.request")

ALLOC_MODES = ("gpu-only", "max-gpu", "max-ram", "ram-only", "explicit")
CONTRACT_KEYS = ("ctx", "kv_cache_type", "flash_attn", "alloc_mode", "gguf_file", "n_gpu_layers", "n_cpu_moe",
                 "parallel")
KV_TYPES = ("f16", "q8_0", "q4_0")
INFERENCE = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/embeddings": "embeddings"}


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("fitevict_requests_total", "Inference requests", ["model", "endpoint", "status"],
                                registry=self.registry)
        self.latency = Histogram("fitevict_request_seconds", "Request latency, queue and load wait included",
                                 ["endpoint"], registry=self.registry)
        self.resident = Gauge("fitevict_resident_bytes", "Bytes held by resident models, by device and source",
                              ["model", "device", "source"], registry=self.registry)


def parse_contract(raw: Any) -> Contract | None:
    """Validate the request's ``fitevict`` object; unknown keys and values are refused with the allowed ones."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ApiError(400, f"fitevict: expected an object with keys {', '.join(CONTRACT_KEYS)}, got {type(raw).__name__}",
                       param="fitevict")
    unknown = sorted(set(raw) - set(CONTRACT_KEYS))
    if unknown:
        raise ApiError(400, f"fitevict: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(CONTRACT_KEYS)}",
                       param=f"fitevict.{unknown[0]}")

    def integer(name: str, lo: int) -> int | None:
        v = raw.get(name)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ApiError(400, f"fitevict.{name}: {v!r} is not an integer >= {lo}", param=f"fitevict.{name}")
        return v

    kv = raw.get("kv_cache_type")
    if kv is not None and kv not in KV_TYPES:
        raise ApiError(400, f"fitevict.kv_cache_type: {kv!r} is not allowed; allowed: {', '.join(KV_TYPES)}",
                       param="fitevict.kv_cache_type")
    fa = raw.get("flash_attn")
    if fa is not None and not isinstance(fa, bool):
        raise ApiError(400, f"fitevict.flash_attn: {fa!r} is not allowed; allowed: true, false",
                       param="fitevict.flash_attn")
    mode = raw.get("alloc_mode")
    if mode is not None and mode not in ALLOC_MODES:
        raise ApiError(400, f"fitevict.alloc_mode: {mode!r} is not allowed; allowed: {', '.join(ALLOC_MODES)}",
                       param="fitevict.alloc_mode")
    gf = raw.get("gguf_file")
    if gf is not None and not isinstance(gf, str):
        raise ApiError(400, f"fitevict.gguf_file: expected a file name, got {gf!r}", param="fitevict.gguf_file")
    if kv is not None and kv != "f16" and fa is False:
        raise ApiError(400, f"fitevict: a quantized V cache ({kv}) needs flash attention; set flash_attn true "
                            f"or use kv_cache_type f16", param="fitevict.kv_cache_type")
    c = Contract(ctx=integer("ctx", 0), kv_cache_type=kv, flash_attn=fa, alloc_mode=mode, gguf_file=gf,
                 n_gpu_layers=integer("n_gpu_layers", -1), n_cpu_moe=integer("n_cpu_moe", 0),
                 parallel=integer("parallel", 1))
    if kv is not None and kv != "f16" and fa is None:
        c = Contract(**{**_contract_dict(c), "flash_attn": True})  # quantized V requires it; say so in the plan
    return c


def _contract_dict(c: Contract) -> dict:
    return {k: getattr(c, k) for k in CONTRACT_KEYS}


def create_app(config: Config, *, engine_binary: Path, catalog: Catalog | None = None,
               store: Store | None = None) -> FastAPI:
    catalog = catalog or Catalog.from_config(config)
    own_store = store is None
    store = store or Store.open(config.store_url)
    sup = Supervisor(config=config, catalog=catalog, store=store, engine_binary=engine_binary)
    metrics = Metrics()
    upstream = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0),
                                 limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await sup.start()
        try:
            yield
        finally:
            await sup.shutdown()
            await upstream.aclose()
            if own_store:
                store.close()

    app = FastAPI(title="fitevict", version=__version__, lifespan=lifespan,
                  description="OpenAI-compatible front door that prices, plans, loads and evicts local models.")
    app.state.supervisor = sup
    app.state.catalog = catalog
    app.state.store = store
    app.state.config = config

    if config.server.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(config.server.cors_origins), allow_methods=["*"],
                           allow_headers=["*"])

    # -- errors, always in OpenAI's envelope -------------------------------------------------------

    @app.exception_handler(ApiError)
    async def _api_error(_req: Request, e: ApiError) -> JSONResponse:
        return e.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_req: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return ApiError(e.status_code, str(e.detail), type=kind).response()

    @app.exception_handler(Exception)
    async def _unexpected(_req: Request, e: Exception) -> JSONResponse:
        logging.getLogger("fitevict.server").exception("unhandled error")
        return ApiError(500, f"internal error in fitevict: {type(e).__name__}: {e}; see the server log",
                        type="server_error").response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_req: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        loc = ".".join(str(x) for x in first.get("loc", ()) if x not in ("body", "query", "path"))
        return ApiError(400, f"{loc or 'request'}: {first.get('msg', 'invalid')}", param=loc or None).response()

    # -- request helpers ---------------------------------------------------------------------------

    def check_auth(request: Request, *, admin: bool) -> None:
        s = config.server
        if not s.auth_enabled:
            return
        header = request.headers.get("authorization", "")
        key = header[7:].strip() if header.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
        if _key_in(key, s.admin_keys):
            return
        if _key_in(key, s.api_keys):
            if not admin:
                return
            hint = "" if s.admin_keys else "; no admin key is configured: set server.admin_keys"
            raise ApiError(403, f"this endpoint needs an admin key (server.admin_keys); the key given is a user "
                                f"key{hint}", type="permission_error", code="admin_key_required")
        raise ApiError(401, "invalid or missing API key; send Authorization: Bearer <key> (server.api_keys)",
                       type="authentication_error", code="invalid_api_key")

    async def read_json(request: Request) -> Any:
        limit = config.server.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body is {int(declared)} bytes; the limit is {limit} (server.max_body_bytes)",
                           code="body_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"request body exceeds {limit} bytes (server.max_body_bytes)", code="body_too_large")
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks) or b"null")
        except ValueError as e:
            raise ApiError(400, f"request body is not valid JSON: {e}", code="invalid_json") from None

    def resolve(name: Any):
        if not isinstance(name, str) or not name:
            raise ApiError(400, "'model' is required: name a model from GET /v1/models", param="model",
                           code="missing_model")
        try:
            return catalog.resolve(name)
        except UnknownModel as e:
            hint = f"; did you mean {', '.join(e.close_matches)}?" if e.close_matches else ""
            raise ApiError(404, f"model {name!r} does not exist{hint} (GET /v1/models lists them)",
                           type="not_found_error", param="model", code="model_not_found",
                           extra={"close_matches": list(e.close_matches)}) from None

    def check_gguf_file(entry, contract: Contract | None) -> None:
        if contract is not None and contract.gguf_file is not None:
            from fitevict.catalog import resolve_gguf_file

            try:
                resolve_gguf_file(entry, contract.gguf_file)
            except GgufFileError as e:
                raise ApiError(400, str(e), param="fitevict.gguf_file", code="invalid_gguf_file") from None

    def supervisor_error(e: SupervisorError) -> ApiError:
        if isinstance(e, Busy):
            return ApiError(503, str(e), type="server_busy", code="busy", headers={"Retry-After": str(e.retry_after)})
        if isinstance(e, Refused):
            return ApiError(507, str(e), type="insufficient_memory", code="does_not_fit",
                            headers={"x-should-retry": "false"}, extra={"plan": e.plan.to_json()})
        if isinstance(e, LoadFailed):
            return ApiError(502, str(e), type="engine_error", code="load_failed", headers={"x-should-retry": "false"})
        return ApiError(500, str(e), type="server_error")

    # -- inference ---------------------------------------------------------------------------------

    async def proxy(request: Request, path: str) -> Response:
        t0 = time.perf_counter()
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex[:16]
        endpoint = INFERENCE[path]
        status, model_key, tokens, queue_wait, load_wait = 500, None, None, 0.0, 0.0

        def log_line(extra: dict | None = None) -> None:
            line = {"request_id": rid, "model": model_key, "endpoint": endpoint, "status": status, "tokens": tokens,
                    "queue_wait_s": round(queue_wait, 4), "load_wait_s": round(load_wait, 4),
                    "latency_s": round(time.perf_counter() - t0, 4), **(extra or {})}
            log.info(json.dumps(line))
            metrics.requests.labels(model_key or "-", endpoint, str(status)).inc()
            metrics.latency.labels(endpoint).observe(time.perf_counter() - t0)

        try:
            check_auth(request, admin=False)
            body = await read_json(request)
            if not isinstance(body, dict):
                raise ApiError(400, "request body must be a JSON object", code="invalid_body")
            entry = resolve(body.get("model"))
            model_key = entry.key
            contract = parse_contract(body.pop("fitevict", None))
            check_gguf_file(entry, contract)
            if endpoint == "embeddings" and not entry.settings.embeddings:
                raise ApiError(400, f"model {entry.key!r} is not configured for embeddings; set "
                                    f"models.{entry.key}.embeddings = true in the config", param="model")
            for k, v in entry.settings.request_defaults.items():
                body.setdefault(k, v)  # only when the request lacks the field
            stream = bool(body.get("stream"))
        except ApiError as e:
            status = e.status
            log_line({"error": e.code})
            return e.response()

        stack = contextlib.AsyncExitStack()
        try:
            tq = time.perf_counter()
            was_resident = sup.seats.get(entry.key) is not None and sup.seats[entry.key].state == "ready"
            seat = await stack.enter_async_context(sup.acquire(entry.key, contract, request_id=rid))
            waited = time.perf_counter() - tq
            queue_wait, load_wait = (waited, 0.0) if was_resident else (0.0, waited)
            req = upstream.build_request("POST", seat.base_url + path, json=body,
                                         headers={"x-request-id": rid})
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
                                     headers={"x-request-id": rid, "cache-control": "no-cache"})
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
        return Response(content, status_code=status, media_type=media, headers={"x-request-id": rid})

    @app.post("/v1/chat/completions", tags=["openai"], summary="Chat completion (proxied to the model's seat)")
    async def chat(request: Request) -> Response:
        return await proxy(request, "/v1/chat/completions")

    @app.post("/v1/completions", tags=["openai"], summary="Text completion (proxied to the model's seat)")
    async def completions(request: Request) -> Response:
        return await proxy(request, "/v1/completions")

    @app.post("/v1/embeddings", tags=["openai"], summary="Embeddings (models configured with embeddings = true)")
    async def embeddings(request: Request) -> Response:
        return await proxy(request, "/v1/embeddings")

    @app.get("/v1/models", tags=["openai"], summary="The catalog, OpenAI's format, plus residency and bytes")
    async def list_models(request: Request) -> dict:
        check_auth(request, admin=False)
        views = {v["key"]: v for v in sup.resident_views()}
        data = []
        for e in catalog.entries():
            v = views.get(e.key)
            data.append({
                "id": e.key, "object": "model", "created": int(Path(e.path).stat().st_mtime) if Path(e.path).exists() else 0,
                "owned_by": "fitevict",
                "fitevict": {"engine": e.engine, "aliases": list(e.aliases), "pinned": e.pinned,
                             "file": {"bytes": e.file_bytes, "source": "file-size"},
                             "resident": v is not None, "state": v["state"] if v else None,
                             "resident_bytes": v["devices"] if v else None},
            })
        return {"object": "list", "data": data}

    # -- admin -------------------------------------------------------------------------------------

    @app.get("/v1/models/residents", tags=["admin"], summary="What is loaded (like `ollama ps`)")
    async def residents(request: Request) -> dict:
        check_auth(request, admin=False)
        return {"object": "list", "data": sup.resident_views()}

    @app.get("/v1/models/history", tags=["admin"], summary="What fitevict did, and why")
    async def history(request: Request, since: float | None = Query(None, description="unix seconds"),
                      model: str | None = None, event: str | None = Query(None, description="|".join(EVENTS)),
                      limit: int = Query(100, ge=1, le=10000)) -> dict:
        check_auth(request, admin=False)
        if event is not None and event not in EVENTS:
            raise ApiError(400, f"event: {event!r} is not allowed; allowed: {', '.join(EVENTS)}", param="event")
        rows = await asyncio.to_thread(store.events, since=since, model=model, event=event, limit=limit)
        return {"object": "list", "data": [history_row(ev) for ev in rows]}

    async def contract_from_body(request: Request) -> Contract | None:
        raw = await read_json(request) if int(request.headers.get("content-length") or 0) else None
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise ApiError(400, "body must be a JSON object (a load contract, or {\"fitevict\": {...}})")
        return parse_contract(raw.get("fitevict", raw))

    @app.post("/v1/models/{model_id}/plan", tags=["admin"], summary="Dry run: the Plan a load would follow now")
    async def plan(model_id: str, request: Request) -> dict:
        check_auth(request, admin=True)
        entry = resolve(model_id)
        contract = await contract_from_body(request)
        check_gguf_file(entry, contract)
        the_plan = sup.plan(entry.key, contract)
        return {"model": entry.key, "plan": the_plan.to_json(), "budget": sup.last_budget_json()}

    @app.post("/v1/models/{model_id}/load", tags=["admin"], summary="Load a model (with an optional contract)")
    async def load(model_id: str, request: Request) -> dict:
        check_auth(request, admin=True)
        entry = resolve(model_id)
        contract = await contract_from_body(request)
        check_gguf_file(entry, contract)
        try:
            await sup.load(entry.key, contract, request_id=request.headers.get("x-request-id"))
        except SupervisorError as e:
            raise supervisor_error(e) from None
        view = next((v for v in sup.resident_views() if v["key"] == entry.key), None)
        return {"model": entry.key, "resident": view}

    @app.post("/v1/models/{model_id}/unload", tags=["admin"], summary="Unload a model and verify its memory came back")
    async def unload(model_id: str, request: Request) -> dict:
        check_auth(request, admin=True)
        entry = resolve(model_id)
        try:
            res = await sup.unload(entry.key)
        except SupervisorError as e:
            raise supervisor_error(e) from None
        if res is None:
            return {"model": entry.key, "unloaded": False, "reason": "not resident"}
        return {"model": entry.key, "unloaded": True, "freed_bytes": res.freed_bytes,
                "freed_source": "measured: /proc/meminfo AnonPages+Shmem fall", "release_verified": res.verified,
                "exit_seconds": res.exit_seconds, "release_seconds": res.release_seconds, "note": res.note}

    @app.get("/v1/models/{model_id}", tags=["openai"], summary="One model, OpenAI's format")
    async def get_model(model_id: str, request: Request) -> dict:
        check_auth(request, admin=False)
        e = resolve(model_id)
        return {"id": e.key, "object": "model", "owned_by": "fitevict"}

    @app.get("/health", tags=["admin"])
    async def health() -> dict:
        return {"status": "ok", "version": __version__, "residents": len(sup.seats),
                "models": len(catalog.entries())}

    @app.get("/metrics", tags=["admin"], include_in_schema=True)
    async def prom() -> Response:
        metrics.resident.clear()
        for v in sup.resident_views():
            for dev, d in v["devices"].items():
                if d["measured_bytes"] is not None:
                    metrics.resident.labels(v["key"], dev, "measured").set(d["measured_bytes"])
                metrics.resident.labels(v["key"], dev, "predicted").set(d["predicted_bytes"])
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

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


def _key_in(key: str, keys: tuple[str, ...]) -> bool:
    """Constant-time membership, so a key cannot be guessed from response timing."""
    import hmac

    return any(hmac.compare_digest(key.encode(), k.encode()) for k in keys) if key else False


def _embedding_dim(emb: Any) -> int:
    """Length of one embedding, given as a list of floats or base64 of float32 (encoding_format=base64)."""
    if isinstance(emb, str):
        import base64

        return len(base64.b64decode(emb)) // 4
    return len(emb) if isinstance(emb, list) else 0


def _gb(b: int | None) -> float | None:
    return None if b is None else round(b / GiB, 3)


def history_row(ev) -> dict:
    return {
        "id": ev.id, "time": ev.time, "event": ev.event, "model": ev.model, "engine": ev.engine,
        "seconds": ev.seconds, "vram_gb": _gb(ev.vram_bytes), "offloaded_gb": _gb(ev.offloaded_bytes),
        "host_gb": _gb(ev.host_bytes), "strategy": ev.strategy, "reason": ev.reason, "freed_gb": _gb(ev.freed_bytes),
        "request_id": ev.request_id, "predicted_gb": _gb(ev.predicted_bytes), "measured_gb": _gb(ev.measured_bytes),
        "bytes": {"vram": ev.vram_bytes, "offloaded": ev.offloaded_bytes, "host": ev.host_bytes,
                  "freed": ev.freed_bytes, "predicted": ev.predicted_bytes, "measured": ev.measured_bytes},
        "sources": {"predicted": "formula/dry-run pricing", "measured": "engine log + /proc PSS",
                    "freed": "measured: /proc/meminfo AnonPages+Shmem fall (host), NVML free (GPU)"},
        "details": ev.details,
    }
