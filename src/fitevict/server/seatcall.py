"""Talking to a seat over llama-server's own routes: hold a seat, send one JSON request, read one SSE stream.

Small and shared by the routes that translate another API (Ollama's) onto the engine's OpenAI-style routes:
``held`` holds a seat for the block (supervisor errors become HTTP errors), ``send`` opens the upstream
response over the front door's own kept-alive pool (``Upstream``, which retries once on a connection
llama-server dropped after a streamed response), ``read_json`` and ``events`` read it back as one document or as
the stream's parsed ``data:`` events.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from fitevict.engines.upstream import Upstream, UpstreamConn, UpstreamError
from fitevict.request.catalog import CatalogEntry
from fitevict.request.contract import Contract
from fitevict.schedule.fair import Share
from fitevict.shrink import Need
from fitevict.server.door import Door
from fitevict.server.errors import ApiError
from fitevict.supervisor import SupervisorError
from fitevict.seat.running import SeatState


class SeatResponse:
    """An engine's answer being read: its status, its raw chunks, lines or whole body. ``aclose`` gives the
    connection back to the pool (kept alive only when the answer was read to its end)."""

    def __init__(self, pool: Upstream, conn: UpstreamConn) -> None:
        self.pool, self.conn, self.closed = pool, conn, False

    @property
    def status_code(self) -> int:
        return self.conn.status

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        while chunk := await self.conn.read():
            yield chunk

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_raw()])

    async def aiter_lines(self) -> AsyncIterator[str]:
        pending = b""
        async for chunk in self.aiter_raw():
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode()
        if pending:
            yield pending.decode()

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool.release(self.conn)


@contextlib.asynccontextmanager
async def held(door: Door, entry: CatalogEntry, contract: Contract | None, request_id: str,
               timing: dict | None = None, need: Need | None = None,
               share: Share | None = None) -> AsyncIterator[SeatState]:
    """A seat of ``entry`` under ``contract`` for the block (loading it if needed); what the door refuses to ask
    (``Door.ask``) and the supervisor's refusals as ``ApiError``. ``need``: the request's tokens, for
    ``policy.shrink_ctx``; ``share``: who asks, for fairness (``schedule.fair``)."""
    asked = door.ask(entry, contract)
    try:
        async with door.sup.acquire(asked, request_id=request_id, timing=timing, need=need, share=share) as seat:
            yield seat
    except SupervisorError as e:
        raise door.supervisor_error(e) from None


async def send(pool: Upstream, seat: SeatState, path: str, body: dict[str, Any],
               request_id: str) -> SeatResponse:
    """POST ``body`` to the seat's ``path``; the response is open (streamed) and an HTTP error from the engine
    is raised as ``ApiError`` with the engine's own message. The caller closes the response."""
    try:
        r = SeatResponse(pool, await pool.open(seat.port, path, json.dumps(body).encode(), request_id))
    except UpstreamError as e:
        raise ApiError(502, f"{seat.key}: the engine did not answer {path}: {e}", type="engine_error") from None
    if r.status_code >= 400:
        text = (await r.aread()).decode(errors="replace")
        await r.aclose()
        raise ApiError(r.status_code if r.status_code < 500 else 502,
                       f"{seat.key}: the engine answered {r.status_code} on {path}: {engine_message(text)}",
                       type="engine_error" if r.status_code >= 500 else "invalid_request_error")
    return r


async def read_json(r: SeatResponse) -> dict[str, Any]:
    try:
        return json.loads(await r.aread())
    except UpstreamError as e:
        raise ApiError(502, f"the engine broke off its answer: {e}", type="engine_error") from None
    finally:
        await r.aclose()


async def events(r: SeatResponse) -> AsyncIterator[dict[str, Any]]:
    """The parsed ``data:`` events of an SSE response, until ``[DONE]``; an ``error`` event is raised."""
    try:
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            doc = json.loads(data)
            if isinstance(doc, dict) and "error" in doc:
                raise ApiError(502, f"the engine failed mid-stream: {engine_message(data)}", type="engine_error")
            yield doc
    except UpstreamError as e:
        raise ApiError(502, f"the engine broke off mid-stream: {e}", type="engine_error") from None
    finally:
        await r.aclose()


def engine_message(text: str) -> str:
    """The message of an engine error body (``{"error": {"message": ...}}``), else the text itself."""
    with contextlib.suppress(ValueError, AttributeError, TypeError, KeyError):
        err = json.loads(text)["error"]
        return err["message"] if isinstance(err, dict) else str(err)
    return text.strip()[:500]
