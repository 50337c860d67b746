"""The ASGI app: OpenAI-compatible inference routes relayed to seats on the fast path (``fastpath``), ahead
of the FastAPI app that serves the admin API, the model list, the dashboard, /metrics and /health.

Requests are validated before anything changes: a bad body, an unknown model, a bad load contract,
an oversized body or a wrong key is answered with a 4xx in OpenAI's envelope and no state changes.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fitevict import __version__
from fitevict.catalog import Catalog
from fitevict.config import Config
from fitevict.server import admin, dashboard, ollama, openai
from fitevict.server.door import Door
from fitevict.server.fastpath import FastPath
from fitevict.server.metrics import Metrics
from fitevict.server.rescan import CatalogWatch
from fitevict.server.sampler import MemorySampler
from fitevict.engines.upstream import Upstream
from fitevict.server.errors import ApiError
from fitevict.store import Store
from fitevict.supervisor import Supervisor

__all__ = ["create_app"]


def create_app(config: Config, *, engine_binary: Path, catalog: Catalog | None = None,
               store: Store | None = None, own_store: bool | None = None) -> Any:
    """The front door, an ASGI app: the fast path for inference routes, FastAPI for the rest (``.app``),
    CORS around both when configured. ``own_store``: close the store at shutdown (default: when this call
    opened it)."""
    catalog = catalog or Catalog.from_config(config)
    own_store = store is None if own_store is None else own_store
    store = store or Store.open(config.store_url)
    sup = Supervisor(config=config, catalog=catalog, store=store, engine_binary=engine_binary)
    pool = Upstream()  # kept-alive connections per seat, for the fast path and the translated (Ollama) routes
    metrics = Metrics()
    sup.on_event.append(metrics.observe_event)
    sampler = MemorySampler(sup, store, config.server.sample_seconds)
    door = Door(config, catalog, store, sup, metrics, pool, sampler)
    sup.on_event.append(sampler.poke)

    watch = CatalogWatch(config, catalog)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await sup.start()
        sampler.start()
        watch.start()
        gc.collect()
        gc.freeze()  # what start-up built lives as long as the server: full collections no longer walk it
        try:
            yield
        finally:
            await watch.stop()
            await sampler.stop()
            await sup.shutdown()
            pool.close()
            if own_store:
                store.close()

    app = FastAPI(title="fitevict", version=__version__, lifespan=lifespan,
                  description="OpenAI-compatible front door that prices, plans, loads and evicts local models.")
    app.state.supervisor = sup
    app.state.catalog = catalog
    app.state.store = store
    app.state.config = config
    app.state.sampler = sampler
    app.state.catalog_watch = watch

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

    # the admin router first: /v1/models/residents and /history must win over /v1/models/{model_id}
    app.include_router(admin.router(door))
    app.include_router(openai.router(door))
    app.include_router(ollama.router(door))
    app.include_router(dashboard.router(door))
    front = FastPath(app, door)
    if config.server.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        return CORSMiddleware(front, allow_origins=list(config.server.cors_origins), allow_methods=["*"],
                              allow_headers=["*"])
    return front
