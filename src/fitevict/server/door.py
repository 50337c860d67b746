"""Shared state and request helpers of the front door: auth, bodies, model names, contracts, errors."""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import Request
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fitevict.catalog import Catalog, CatalogEntry, GgufFileError, UnknownModel, resolve_gguf_file
from fitevict.config import Config
from fitevict.planner import ALLOC_MODES
from fitevict.server.errors import ApiError
from fitevict.store import Store
from fitevict.supervisor import Busy, Contract, LoadFailed, Refused, Supervisor, SupervisorError

CONTRACT_KEYS = ("ctx", "kv_cache_type", "flash_attn", "alloc_mode", "gguf_file", "n_gpu_layers", "n_cpu_moe",
                 "parallel")
KV_TYPES = ("f16", "q8_0", "q4_0")


class Metrics:
    """The /metrics registry: requests, latency, resident bytes by source."""

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
        raise ApiError(400, f"fitevict: expected an object with keys {', '.join(CONTRACT_KEYS)}, "
                            f"got {type(raw).__name__}",
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



@dataclass
class Door:
    """What every route shares: configuration, catalog, store, supervisor, metrics and the upstream client."""

    config: Config
    catalog: Catalog
    store: Store
    sup: Supervisor
    metrics: Metrics
    upstream: httpx.AsyncClient

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


def _key_in(key: str, keys: tuple[str, ...]) -> bool:
    """Constant-time membership, so a key cannot be guessed from response timing."""
    return any(hmac.compare_digest(key.encode(), k.encode()) for k in keys) if key else False
