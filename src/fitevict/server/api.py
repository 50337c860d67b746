"""The FastAPI app behind the fast path: the admin API, one model by name, the Ollama routes and the dashboard,
with the OpenAPI page at /docs. Built on the first request that needs it (``FastPath``), so a front door that
only serves inference and is polled on ``plain`` routes never imports FastAPI."""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fitevict import __version__
from fitevict.server import admin, dashboard, ollama, openai
from fitevict.server.door import Door
from fitevict.server.errors import ApiError
from fitevict.store.faults import reason


def build_api(door: Door, state: Any) -> FastAPI:
    """The FastAPI app for ``door``, sharing the front door's ``state`` (supervisor, catalog, store, ...)."""
    app = FastAPI(title="fitevict", version=__version__,
                  description="OpenAI-compatible front door that prices, plans, loads and evicts local models.")
    app.state = state

    # -- errors, always in OpenAI's envelope -------------------------------------------------------

    @app.exception_handler(ApiError)
    async def _api_error(_req: Request, e: ApiError) -> JSONResponse:
        return e.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_req: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return ApiError(e.status_code, str(e.detail), type=kind).response()

    @app.exception_handler(sa.exc.DBAPIError)
    async def _store_refused(_req: Request, e: sa.exc.DBAPIError) -> JSONResponse:
        logging.getLogger("fitevict.server").warning("a store read refused: %s", reason(e))
        return ApiError(503, f"the store cannot be read now: {reason(e)}; fitevict serves on (GET /health says what "
                        "the store refuses); retry later", type="server_error", code="store_unavailable",
                        headers={"Retry-After": "5"}).response()

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
    return app
