"""Shared state and request helpers of the front door: auth, bodies, model names, contracts, errors."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import Request

from fitevict.catalog import Catalog, CatalogEntry, GgufFileError, UnknownModel, resolve_gguf_file
from fitevict.config import Config
from fitevict.server.errors import ApiError
from fitevict.server.metrics import Metrics
from fitevict.server.sampler import MemorySampler
from fitevict.store import Store
from fitevict.contract import Contract, ContractError
from fitevict.contract import parse_contract as _parse_contract
from fitevict.supervisor import Busy, LoadFailed, Refused, Supervisor, SupervisorError


def parse_contract(raw: Any) -> Contract | None:
    """The request's ``fitevict`` object, validated (``fitevict.contract``), as an OpenAI-style 400 when bad."""
    try:
        return _parse_contract(raw)
    except ContractError as e:
        raise ApiError(400, str(e), param=e.param) from None


@dataclass
class Door:
    """What every route shares: configuration, catalog, store, supervisor, metrics and the upstream client."""

    config: Config
    catalog: Catalog
    store: Store
    sup: Supervisor
    metrics: Metrics
    upstream: httpx.AsyncClient
    sampler: MemorySampler | None = None  # the memory report's live windows (fitevict.server.sampler)

    def check_auth(self, request: Request, *, admin: bool) -> None:
        s = self.config.server
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

    async def read_json(self, request: Request) -> Any:
        limit = self.config.server.max_body_bytes
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

    def resolve(self, name: Any) -> CatalogEntry:
        if not isinstance(name, str) or not name:
            raise ApiError(400, "'model' is required: name a model from GET /v1/models", param="model",
                           code="missing_model")
        try:
            return self.catalog.resolve(name)
        except UnknownModel as e:
            hint = f"; did you mean {', '.join(e.close_matches)}?" if e.close_matches else ""
            raise ApiError(404, f"model {name!r} does not exist{hint} (GET /v1/models lists them)",
                           type="not_found_error", param="model", code="model_not_found",
                           extra={"close_matches": list(e.close_matches)}) from None

    @staticmethod
    def check_gguf_file(entry: CatalogEntry, contract: Contract | None) -> None:
        if contract is not None and contract.gguf_file is not None:
            try:
                resolve_gguf_file(entry, contract.gguf_file)
            except GgufFileError as e:
                raise ApiError(400, str(e), param="fitevict.gguf_file", code="invalid_gguf_file") from None

    @staticmethod
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


async def until_disconnect(request: Request, awaitable: Any) -> Any:
    """Await ``awaitable`` unless the client hangs up first: then cancel it and return None. Cancelling a wait
    for a seat takes the request out of the scheduler's queue at once (and cancels a load nobody waits for)."""
    task = asyncio.ensure_future(awaitable)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        watch.cancel()
        raise
    if task.done():
        watch.cancel()
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


def _key_in(key: str, keys: tuple[str, ...]) -> bool:
    """Constant-time membership, so a key cannot be guessed from response timing."""
    return any(hmac.compare_digest(key.encode(), k.encode()) for k in keys) if key else False
