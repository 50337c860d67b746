"""The admin routes: history, plan (dry run), load, unload (residents, /health and /metrics: ``plain``)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from fitevict import shrink
from fitevict.host.pagecache import residency
from fitevict.supervisor.loadreport import plan_hits
from fitevict.server import progress
from fitevict.server.door import Door, parse_contract
from fitevict.server.errors import ApiError
from fitevict.server.labels import history_sources, prediction_error, pss_bytes
from fitevict.store.records import EVENTS
from fitevict.supervisor import Contract, SupervisorError
from fitevict.units import GiB


def router(door: Door) -> APIRouter:
    app = APIRouter()
    catalog, sup, store = door.catalog, door.sup, door.store
    check_auth, read_json, resolve = door.check_auth, door.read_json, door.resolve
    supervisor_error = door.supervisor_error

    @app.get("/v1/models/history", tags=["admin"], summary="What fitevict did, and why")
    async def history(request: Request, since: float | None = Query(None, description="unix seconds"),
                      model: str | None = None, event: str | None = Query(None, description="|".join(EVENTS)),
                      limit: int = Query(100, ge=1, le=10000)) -> dict:
        check_auth(request, admin=False)
        if event is not None and event not in EVENTS:
            raise ApiError(400, f"event: {event!r} is not allowed; allowed: {', '.join(EVENTS)}", param="event")
        await sup.settle()  # a load that has served requests is in the history it reads
        rows = await store.aio.events(since=since, model=model, event=event, limit=limit)
        return {"object": "list", "data": [history_row(ev) for ev in rows]}

    async def contract_from_body(request: Request) -> Contract | None:
        raw = await read_json(request) if int(request.headers.get("content-length") or 0) else None
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise ApiError(400, "body must be a JSON object (a load contract, or {\"fitevict\": {...}})")
        return parse_contract(raw.get("fitevict", raw))

    @app.post("/v1/models/rescan", tags=["admin"], summary="Rescan the models directories now (as SIGHUP does)")
    async def rescan(request: Request) -> dict:
        check_auth(request, admin=True)
        watch = request.app.state.catalog_watch
        added, removed = await watch.rescan()
        if watch.last_error is not None:
            raise ApiError(400, f"rescan failed, the catalog is unchanged: {watch.last_error}", code="rescan_failed")
        return {"models": len(catalog), "added": added, "removed": removed}

    @app.post("/v1/models/{model_id:path}/plan", tags=["admin"], summary="Dry run: the Plan a load would follow now")
    async def plan(model_id: str, request: Request) -> dict:
        check_auth(request, admin=True)
        entry, contract = resolve(model_id), await contract_from_body(request)
        asked = door.ask(entry, contract)  # a gguf file it lacks, or a file that cannot be read, is answered here
        the_plan = await sup.plan_read(entry.key, contract)
        cached = await asyncio.to_thread(residency, asked.path)  # its file in the page cache: measured, reclaimable
        return {"model": entry.key, **plan_hits(entry, the_plan), "plan": the_plan.to_json(),
                "budget": sup.last_budget_json(), "page_cache": cached.to_json(),
                **shrink.dry_run_of(the_plan, sup.config.policy.shrink_ctx)}

    @app.post("/v1/models/{model_id:path}/load", tags=["admin"], summary="Load a model (with an optional contract)")
    async def load(model_id: str, request: Request,
                   stream: bool = Query(False, description="SSE: the load's phases as they happen")) -> Any:
        check_auth(request, admin=True)
        entry = resolve(model_id)
        contract = await contract_from_body(request)
        door.ask(entry, contract)  # a gguf file it lacks, or a file that cannot be read, is answered here
        if stream:
            steps = progress.admin_load(door, entry.key, contract, request.headers.get("x-request-id"))
            return StreamingResponse(steps, media_type="text/event-stream", headers={"cache-control": "no-cache"})
        try:
            await sup.load(entry.key, contract, request_id=request.headers.get("x-request-id"))
        except SupervisorError as e:
            raise supervisor_error(e) from None
        view = next((v for v in sup.resident_views() if v["key"] == entry.key), None)
        return {"model": entry.key, "resident": view}

    @app.post("/v1/models/{model_id:path}/unload", tags=["admin"],
              summary="Unload a model and verify its memory came back")
    async def unload(model_id: str, request: Request) -> dict:
        check_auth(request, admin=True)
        entry = resolve(model_id)
        try:
            res = await sup.unload(entry.key)
        except SupervisorError as e:
            raise supervisor_error(e) from None
        if res is None:
            return {"model": entry.key, "unloaded": False, "reason": "not resident"}
        freed_source = ("measured: /proc/meminfo AnonPages+Shmem fall" if res.freed_bytes is not None
                        else f"unavailable: {res.note or 'the release check gave no figure'}")
        return {"model": entry.key, "unloaded": True, "freed_bytes": res.freed_bytes,
                "freed_source": freed_source, "release_verified": res.verified,
                "exit_seconds": res.exit_seconds, "release_seconds": res.release_seconds, "note": res.note}

    return app


def _gb(b: int | None) -> float | None:
    return None if b is None else round(b / GiB, 3)


def history_row(ev) -> dict:
    """One history row. A load names its figures apart: ``predicted`` (the whole price the seat is planned at),
    ``buffers_predicted`` (the engine buffers alone, as priced), ``allocated`` (the buffers the engine reported:
    the store's ``engine_reported_bytes``) and ``measured`` (PSS of the seat's processes when it was read; an
    ``outgrew`` event's reading). ``prediction_error`` compares like with like: the buffers priced against the
    buffers the engine reported."""
    d = ev.details if isinstance(ev.details, dict) else {}
    allocated = ev.engine_reported_bytes
    reading = d.get("reading_bytes") if ev.event == "outgrew" else None
    measured = pss_bytes(d) if isinstance(d.get("measured"), dict) else reading if isinstance(reading, int) else None
    sources = history_sources(ev)
    if isinstance(d.get("measured"), dict):
        sources["measured"] = (f"measured: PSS of the seat's processes ({d['host_pss'].get('source')}) when it was "
                               f"read, engine overhead included" if measured is not None else
                               "unavailable: the seat's processes were not read")
    elif measured is not None:
        sources["measured"] = str(d.get("source") or "measured")
    else:
        sources["measured"] = "n/a"
    return {
        "id": ev.id, "time": ev.time, "event": ev.event, "model": ev.model, "engine": ev.engine,
        "seconds": ev.seconds, "vram_gb": _gb(ev.vram_bytes), "offloaded_gb": _gb(ev.offloaded_bytes),
        "host_gb": _gb(ev.host_bytes), "strategy": ev.strategy, "reason": ev.reason, "freed_gb": _gb(ev.freed_bytes),
        "request_id": ev.request_id, "predicted_gb": _gb(ev.predicted_bytes),
        "buffers_predicted_gb": _gb(ev.buffers_predicted_bytes), "allocated_gb": _gb(allocated),
        "measured_gb": _gb(measured),
        "bytes": {"vram": ev.vram_bytes, "offloaded": ev.offloaded_bytes, "host": ev.host_bytes,
                  "freed": ev.freed_bytes, "predicted": ev.predicted_bytes,
                  "buffers_predicted": ev.buffers_predicted_bytes, "allocated": allocated, "measured": measured},
        "sources": sources,
        "prediction_error": prediction_error(ev.buffers_predicted_bytes, allocated),
        "prediction_error_against": "allocated (engine-reported), from buffers_predicted",
        "engine_timings": ev.details.get("engine_timings") if isinstance(ev.details, dict) else None,
        "details": ev.details,
    }
