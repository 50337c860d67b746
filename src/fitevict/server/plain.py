"""The GET routes that clients and monitors poll (``/health``, ``/v1/models``, ``/v1/models/residents``,
``/metrics``), answered as raw ASGI
ahead of FastAPI like the inference routes, so that a front door that only serves and is watched never builds
the FastAPI app (FastAPI, pydantic and the route models are about 20 MiB of the process; see
``docs/benchmarks.md``). The admin API, the Ollama routes and the dashboard build it on their first request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from fitevict import __version__
from fitevict.host.pagecache import residency
from fitevict.pricing.lora import listed_adapter_bytes
from fitevict.server.door import Door
from fitevict.server.errors import ApiError
from fitevict.server.connections import REFUSALS
from fitevict.server.ollama_shapes import file_bytes_now

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
JSON = b"application/json"


def store_health(door: Door) -> dict[str, Any]:
    """What the store refused since its last successful write (``store.faults``) and what is held in memory to be
    written when it takes writes again: history events (``supervisor.history``) and memory peaks (``sampler``)."""
    held = {"history events": len(door.sup.history.unstored)}
    if door.sampler is not None:
        held["memory peaks (seat_peaks)"] = len(door.sampler.unstored)
    return {**door.store.faults.to_json(), "held": held}


def health(door: Door) -> dict[str, Any]:
    usage = door.upkeep.usage if door.upkeep is not None else None
    store = store_health(door)
    return {"status": "ok" if store["ok"] else "degraded", "version": __version__, "residents": len(door.sup.seats),
            "models": len(door.catalog.entries()), "prices_read_ahead": dict(door.sup.prices_ahead),
            "data_dir": usage.to_json() if usage is not None else None, "store": store,
            "heap": door.heap.to_json() if door.heap is not None else None,
            "clients": REFUSALS.to_json()}


def model_list(door: Door) -> dict[str, Any]:
    """``GET /v1/models``: the catalog in OpenAI's format, with fitevict's residency and bytes per model."""
    catalog, sup = door.catalog, door.sup
    views = {v["key"]: v for v in sup.resident_views()}
    adapters: dict[str, list[str]] = {}
    for e in catalog.entries():
        if e.base is not None:
            adapters.setdefault(e.base, []).append(e.key)
    data = []
    for e in catalog.entries():
        v = views.get(e.base or e.key)  # an adapter is resident with its base's seat
        path = Path(e.path)
        size, source = file_bytes_now(e.files or (path,))  # as on disk now: a file replaced since the scan shows
        data.append({
            "id": e.key, "object": "model", "created": int(path.stat().st_mtime) if path.exists() else 0,
            "owned_by": "fitevict",
            "fitevict": {"engine": e.engine, "store": e.store, "aliases": list(e.aliases), "pinned": e.pinned,
                         "file": {"bytes": size, "source": source},
                         "resident": v is not None, "state": v["state"] if v else None,
                         "resident_bytes": v["devices"] if v else None,
                         **({"base": e.base, "adapter_bytes": listed_adapter_bytes(e.kind, e.files)}
                            if e.base else {}),
                         **({"adapters": adapters[e.key]} if e.key in adapters else {}),
                         **_config_aliases(door, e.names)},
        })
    for name, target in door.aliases.table.items():  # [aliases]' exact names, as models of their own
        entry = catalog.get(target)
        if "*" not in name and entry is not None and catalog.get(name) is None:
            data.append({"id": name, "object": "model", "created": 0, "owned_by": "fitevict",
                         "fitevict": {"alias_of": entry.key}})
    return {"object": "list", "data": data}


def _config_aliases(door: Door, names: tuple[str, ...]) -> dict[str, Any]:
    """The ``[aliases]`` that name a model: its exact names and patterns (none: nothing added)."""
    if not door.aliases:
        return {}
    exact, patterns = door.aliases.of(names)
    return {k: v for k, v in (("alias_names", exact), ("alias_patterns", patterns)) if v}


async def metrics_text(door: Door) -> bytes:
    """``GET /metrics``: Prometheus' text format, the gauges read now."""
    sup = door.sup
    await sup.settle()  # counters include every event of what has already been answered
    budget = await asyncio.to_thread(sup.budget)
    door.metrics.collect(budget, sup.resident_views(), sup.queued_views())
    return generate_latest(door.metrics.registry)


def residents(door: Door) -> dict[str, Any]:
    """``GET /v1/models/residents``: what is loaded (like ``ollama ps``) and who waits for what."""
    views = door.sup.resident_views()
    for v in views:  # where each model came from (the catalog's, so a model rescanned away says none)
        entry = door.catalog.get(v["key"])
        v["store"] = entry.store if entry is not None else None
    return {"object": "list", "data": views, "waiting": door.sup.queue_view(), "queued": door.sup.queued_views()}


async def _residents(door: Door) -> tuple[bytes, bytes]:
    doc = residents(door)
    paths = [getattr(door.sup.seats.get(v["key"]), "model_path", None) for v in doc["data"]]
    cached = await asyncio.to_thread(lambda: [residency(p).to_json() if p is not None else None for p in paths])
    for v, c in zip(doc["data"], cached):  # its file's pages in the page cache, measured off the loop (mincore)
        v["page_cache"] = c
    return JSON, json.dumps(doc).encode()


async def _health(door: Door) -> tuple[bytes, bytes]:
    return JSON, json.dumps(health(door)).encode()


async def _models(door: Door) -> tuple[bytes, bytes]:
    return JSON, json.dumps(model_list(door)).encode()


async def _metrics(door: Door) -> tuple[bytes, bytes]:
    return CONTENT_TYPE_LATEST.encode(), await metrics_text(door)


# path -> (the answer, who may read it: "public", "user", or "metrics" (public when server.metrics_public))
ROUTES: dict[str, tuple[Callable[[Door], Awaitable[tuple[bytes, bytes]]], str]] = {
    "/health": (_health, "public"), "/v1/models": (_models, "user"), "/v1/models/residents": (_residents, "user"),
    "/metrics": (_metrics, "metrics"),
}


async def answer(door: Door, path: str, scope: MutableMapping[str, Any], send: Send) -> None:
    """Answer a plain route (``path`` in ``ROUTES``); errors in OpenAI's envelope, as everywhere."""
    make, who = ROUTES[path]
    try:
        if scope["method"] not in ("GET", "HEAD"):
            raise ApiError(405, "Method Not Allowed", headers={"Allow": "GET"})
        if who == "user" or (who == "metrics" and not door.config.server.metrics_public):
            auth = api_key = ""
            for name, value in scope["headers"]:
                if name == b"authorization":
                    auth = value.decode("latin-1")
                elif name == b"x-api-key":
                    api_key = value.decode("latin-1")
            door.check_key(auth, api_key, admin=False)
        content_type, body = await make(door)
    except ApiError as e:
        return await e.response()(scope, _no_body, send)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


async def _no_body() -> MutableMapping[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}
