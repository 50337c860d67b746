"""Load progress: the phases of a load, as far as they can be observed from outside the engine.

``follow`` watches one load (an admin load, or a request waiting for its seat) and yields a ``Step`` per
change: ``plan`` (the dry run at the start: action, planned evictions, bytes needed), ``evict`` (each
eviction as it is recorded, with the bytes it freed), ``start`` (the engine process exists), ``weights``
(the seat's measured resident bytes, PSS of its process tree, against the predicted bytes), ``ready``
(load seconds, measured bytes) or ``error``. Nothing here changes what the load does.

Two ways out: ``sse`` (``event: progress`` messages, for ``POST /v1/models/{id}/load?stream=true``) and
``comment`` (SSE comment lines, ``: fitevict ...``, which every OpenAI client skips, sent before the first
chunk of a streamed request that asked for them with ``x-fitevict-progress: 1``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from starlette.responses import StreamingResponse

from fitevict.host import procmem
from fitevict.pricing.footprint import HOST
from fitevict.pricing.gguf import PricingError
from fitevict.request.ask import Ask
from fitevict.request.contract import Contract, with_lora
from fitevict.store.records import Event
from fitevict.supervisor import Supervisor, SupervisorError
from fitevict.schedule.fair import Share
from fitevict.schedule.seats import PLACING
from fitevict.server import seatcall
from fitevict.server.errors import ApiError
from fitevict.units import MiB, format_size

if TYPE_CHECKING:
    from fitevict.server.door import Door

PHASES = ("plan", "evict", "start", "weights", "ready", "error")
HEADER = "x-fitevict-progress"
RESIDENT_SOURCE = "measured: /proc smaps_rollup PSS of the seat's process tree (anon + shmem + file)"


@dataclass(frozen=True, slots=True)
class Step:
    phase: str  # one of PHASES
    message: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "message": self.message, **self.data}


def wanted(headers: Any) -> bool:
    """Whether a request asked for progress comments (``x-fitevict-progress: 1``)."""
    return headers.get(HEADER, "").strip().lower() in ("1", "true", "yes", "on")


def _ours(ev: Event, key: str, request_id: str | None, t0: float) -> bool:
    """An eviction (or a replacement of this model's own seat) made for this load."""
    if ev.time < t0 or ev.event not in ("evict", "unload"):
        return False
    if request_id is not None and ev.request_id == request_id:
        return True
    reason = ev.reason or ""
    return reason.startswith(f"evicted for {key}:") or (ev.model == key and reason.startswith("replaced:"))


async def follow(sup: Supervisor, key: str, contract: Contract | None, done: asyncio.Future, *,
                 request_id: str | None = None, interval: float = 0.1) -> AsyncIterator[Step]:
    """Steps of the load of ``key`` until ``done`` (the task that waits for the seat) finishes."""
    t0 = sup.clock()
    before = sup.seats.get(key)
    # keep_alive never changes the seat a request needs; a dry run with it would ask for an exact configuration
    asked = replace(contract, keep_alive=None) if contract is not None else None
    try:
        plan = sup.plan(key, None if asked == Contract() else asked)
        needed = sum(plan.needed_bytes.values()) if plan.needed_bytes else 0
        evicts = [{"model": e.key, "bytes": sum(e.bytes.values())} for e in plan.evict]
        msg = f"{plan.action}: {plan.reason}"
        yield Step("plan", msg, {"action": plan.action, "needed_bytes": needed, "needed_source": "predicted",
                                 "evict": evicts})
    except (SupervisorError, PricingError) as e:  # the load itself meets the same error and reports it below
        yield Step("plan", f"no plan: {e}", {"action": None, "error": type(e).__name__})
    seen: set[int | None] = set()
    started = False
    last_bytes: int | None = None

    def new(ev: Event) -> bool:
        return ev.id not in seen and _ours(ev, key, request_id, t0)

    while True:
        # wake on the next history event or the load's end, or after ``interval`` to sample memory
        wake = asyncio.ensure_future(sup.wait_for_event(new, timeout=3600))
        await asyncio.wait({done, wake}, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
        wake.cancel()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await wake
        # every eviction already recorded, before the seat it made room for: evictions are recorded
        # before the scheduler starts the next load, so this keeps their order
        while True:
            try:
                ev = await sup.wait_for_event(new, timeout=0.01)
            except TimeoutError:
                break
            seen.add(ev.id)
            yield Step("evict", f"{ev.event} {ev.model}: freed {format_size(ev.freed_bytes)}",
                       {"model": ev.model, "event": ev.event, "freed_bytes": ev.freed_bytes,
                        "freed_source": "measured: /proc/meminfo AnonPages+Shmem fall (host), NVML free (GPU)"
                        if ev.freed_bytes is not None else "unavailable, because the release was not measured",
                        "seconds": ev.seconds})
        seat = sup.seats.get(key)
        if seat is not None and seat is not before and seat.state in PLACING and seat.pid:
            predicted = seat.predicted.bytes_on(HOST)
            if not started:
                started = True
                yield started_step(seat)
            mem = procmem.read_tree(seat.pid)
            step = max(MiB, predicted // 100)  # report a change of 1% (at least 1 MiB), not every page
            if mem.host_bytes is not None and (last_bytes is None or abs(mem.host_bytes - last_bytes) >= step):
                last_bytes = mem.host_bytes
                yield Step("weights", f"{format_size(mem.host_bytes)} of {format_size(predicted)} in memory",
                           {"resident_bytes": mem.host_bytes, "resident_source": RESIDENT_SOURCE,
                            "predicted_bytes": predicted, "predicted_source": seat.predicted.host_source})
        if done.done():
            break
    if done.cancelled():
        return
    exc = done.exception()
    if exc is not None:
        yield Step("error", str(exc), {"error": type(exc).__name__})
        return
    seat = sup.seats.get(key)
    if seat is None:
        return
    measured = seat.bytes_on(HOST)
    hit = seat is before
    if not hit and not started and seat.pid:  # a load quicker than one look: its start is said before its end
        yield started_step(seat)
    yield Step("ready", ("already resident" if hit else f"ready in {seat.load_seconds or 0:.2f} s") +
               f": {format_size(measured)} on {HOST}",
               {"hit": hit, "load_seconds": seat.load_seconds, "host_bytes": measured,
                "host_source": seat.source_on(HOST), "predicted_bytes": seat.predicted.bytes_on(HOST),
                "predicted_source": seat.predicted.host_source, "pid": seat.pid})


def started_step(seat: Any) -> Step:
    """The ``start`` step of a seat whose engine process runs."""
    return Step("start", f"engine started: {seat.engine} pid {seat.pid}",
                {"pid": seat.pid, "engine": seat.engine, "predicted_bytes": seat.predicted.bytes_on(HOST),
                 "predicted_whole_bytes": seat.predicted.whole_bytes,
                 "buffers_predicted_bytes": seat.predicted.total_bytes,
                 "predicted_source": seat.predicted.host_source})


def sse(step: Step) -> bytes:
    return event("progress", step.to_json())


def event(name: str, doc: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(doc)}\n\n".encode()


def error_doc(e: ApiError) -> dict[str, Any]:
    """fitevict's error object, with the HTTP status it would have had before the stream started."""
    return {"message": e.message, "type": e.type, "code": e.code, "status": e.status}


def comment(step: Step) -> bytes:
    """An SSE comment line: OpenAI clients skip it; a reader that wants it parses the JSON after the tag."""
    return f": fitevict-progress {json.dumps(step.to_json())}\n\n".encode()


def openai_stream(door: Door, path: str, body: dict[str, Any], asked: Ask, request_id: str, timing: dict,
                  on_end: Callable[[int], None], share: Share | None = None) -> StreamingResponse:
    """A streamed OpenAI request that asked for progress: the response starts at once, the load's steps go out
    as SSE comments while the seat is made ready, then the engine's stream is relayed as it comes. An error
    after the start is an SSE ``data: {"error": ...}`` event (what OpenAI clients raise on)."""
    sup, entry, contract = door.sup, asked.entry, asked.contract
    stack = contextlib.AsyncExitStack()
    seat_task = asyncio.ensure_future(stack.enter_async_context(
        sup.acquire(asked, request_id=request_id, timing=timing, share=share)))

    async def relay() -> AsyncIterator[bytes]:
        status, r = 200, None
        try:
            async for step in follow(sup, entry.key, contract, seat_task, request_id=request_id):
                if step.phase != "error":
                    yield comment(step)
            exc = seat_task.exception()
            if exc is not None:
                raise door.supervisor_error(exc) if isinstance(exc, SupervisorError) else exc
            seat = seat_task.result()
            sent = with_lora(body, seat.config.loras, entry, contract)  # adapters: scales per request
            r = await seatcall.send(door.pool, seat, path, sent, request_id)
            async for chunk in r.aiter_raw():
                yield chunk
        except ApiError as e:
            status = e.status
            yield b"data: " + json.dumps({"error": error_doc(e)}).encode() + b"\n\n"
        except asyncio.CancelledError:
            status = 499  # the client hung up
            raise
        finally:
            if not seat_task.done():
                seat_task.cancel()
            if r is not None:
                await r.aclose()
            await stack.aclose()
            on_end(status)

    return StreamingResponse(relay(), media_type="text/event-stream",
                             headers={"x-request-id": request_id, "cache-control": "no-cache"})


async def admin_load(door: Door, key: str, contract: Contract | None, request_id: str | None) -> AsyncIterator[bytes]:
    """``POST /v1/models/{id}/load?stream=true``: the load's steps as SSE ``progress`` events, then ``done``
    (the resident view) or ``error`` (fitevict's error envelope with its status). Hanging up cancels a load
    nobody else waits for."""
    sup = door.sup
    request_id = request_id or uuid.uuid4().hex[:16]  # names the evictions made for this load
    task = asyncio.ensure_future(sup.load(key, contract, request_id=request_id))
    try:
        async for step in follow(sup, key, contract, task, request_id=request_id):
            if step.phase != "error":
                yield sse(step)
        if task.cancelled():
            return  # fitevict is shutting down
        exc = task.exception()
        if isinstance(exc, SupervisorError):
            err = door.supervisor_error(exc)
            yield event("error", {"status": err.status, "error": error_doc(err)})
            return
        if exc is not None:
            raise exc
        view = next((v for v in sup.resident_views() if v["key"] == key), None)
        yield event("done", {"model": key, "resident": view})
    finally:
        if not task.done():
            task.cancel()
