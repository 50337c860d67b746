"""The relay: a body POSTed to a seat's llama-server, its answer passed to the client as it arrives.

Reusable by any route that forwards a body to a seat (the fast path's, ``fastpath``). An engine's error answer can
be rewritten whole before it goes out (``on_error``: the route's API speaks its own error shape).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from fitevict.engines.upstream import Upstream, UpstreamConn, UpstreamError

__all__ = ["ErrorMap", "Relayed", "relay"]

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
# an engine's error answer (status, body) -> what the client gets (status, body)
ErrorMap = Callable[[int, bytes], tuple[int, bytes]]
RETRYABLE = (502, 503, 504, 529)  # engine statuses a client's retry may get past (the SDKs retry 5xx unless told)


@dataclass(frozen=True, slots=True)
class Relayed:
    """What ``relay`` passed on. ``body``: a non-streamed answer's chunks as received (not joined), or the
    last two chunks of a stream (where llama-server writes usage and timings); ``events``: SSE ``data:`` events relayed (streams; ``[DONE]`` not counted);
    ``error``: the engine broke off mid-answer (the client's response is left unfinished, so the server
    closes its connection)."""

    status: int
    streamed: bool
    events: int
    body: tuple[bytes, ...]
    error: str | None = None


async def relay(upstream: Upstream, send: Send, port: int, path: str, body: bytes, request_id: str, *,
                on_chunk: Callable[[bytes], bytes] | None = None, on_finish: Callable[[], bytes] | None = None,
                on_body: Callable[[bytes], bytes] | None = None, content_type: bytes | None = None,
                headers: tuple[tuple[bytes, bytes], ...] = (),
                seat_headers: Callable[[UpstreamConn], tuple[tuple[bytes, bytes], ...]] | None = None,
                on_sent: Callable[[], object] | None = None, on_error: ErrorMap | None = None,
                on_break: Callable[[str], bytes] | None = None) -> Relayed:
    """POST ``body`` to ``path`` on the seat listening on ``port`` and relay the answer to ASGI ``send``.

    A streamed answer (no Content-Length) goes out chunk by chunk as it arrives: ``on_chunk`` maps each engine
    chunk (bytes as received: an SSE event can straddle two) to the bytes sent, ``on_finish`` gives the bytes
    sent last. A whole answer goes out as it arrives with its length, or, with ``on_body``, is read whole and
    replaced by ``on_body(answer)``. An error answer (status 400 and above) is read whole and replaced by
    ``on_error(status, answer)``'s when given. ``content_type`` replaces the engine's; ``headers`` are added, and
    ``seat_headers(conn)``'s, made once the engine's answer head has come. ``on_sent`` is called as soon as the
    request went to the engine (work there overlaps the engine's). A stream the engine breaks off (it died mid-answer)
    ends with ``on_break(why)``'s bytes, an error event in the route's shape, when given. Raises UpstreamError if the
    engine does not answer (nothing was sent then). Cancelling the calling task aborts the engine
    connection, which stops the engine's generation."""
    conn = await upstream.open(port, path, body, request_id, on_sent=on_sent)
    try:
        head = [(b"content-type", content_type or conn.content_type), (b"x-request-id", request_id.encode()),
                *headers, *(seat_headers(conn) if seat_headers is not None else ())]
        if on_error is not None and conn.status >= 400:
            return await _relay_error(conn, send, head, on_error)
        if conn.content_length is None:
            return await _relay_stream(conn, send, head, on_chunk, on_finish, on_break)
        return await _relay_whole(conn, send, head, on_body)
    finally:
        upstream.release(conn)


async def _relay_error(conn: UpstreamConn, send: Send, head: list, on_error: ErrorMap) -> Relayed:
    """An engine's error answer, read whole (a broken one is an UpstreamError: nothing was sent) and rewritten."""
    kept: list[bytes] = []
    while chunk := await conn.read():
        kept.append(chunk)
    status, out = on_error(conn.status, b"".join(kept))
    head = [(k, v) for k, v in head if k != b"content-type"]
    if status >= 500 and status not in RETRYABLE:  # the engine's own refusal: the same request fails again
        head.append((b"x-should-retry", b"false"))
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), *head,
                            (b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out, "more_body": False})
    return Relayed(status, False, 0, (out,))


async def _relay_stream(conn: UpstreamConn, send: Send, head: list, on_chunk: Callable[[bytes], bytes] | None,
                        on_finish: Callable[[], bytes] | None, on_break: Callable[[str], bytes] | None) -> Relayed:
    await send({"type": "http.response.start", "status": conn.status,
                "headers": [*head, (b"cache-control", b"no-cache")]})
    events, prev, last, finished = 0, b"", b"", False
    try:
        while chunk := await conn.read():
            while b"data: [DONE]" in chunk and not conn.drained and (more := await conn.read()):
                chunk += more  # the stream's end follows its last event at once: the client's [DONE] is final
            events += chunk.count(b"data: ")
            prev, last = last, chunk
            finished = conn.drained and on_finish is None
            await send({"type": "http.response.body", "body": on_chunk(chunk) if on_chunk else chunk,
                        "more_body": not finished})
            if finished:
                break
    except UpstreamError as e:
        if on_break is not None:  # the client is told why, in its API's shape, and its stream ends cleanly
            await send({"type": "http.response.body", "body": on_break(str(e)), "more_body": False})
        return Relayed(conn.status, True, events, (prev, last), str(e))
    if not finished:
        await send({"type": "http.response.body", "body": on_finish() if on_finish else b"", "more_body": False})
    return Relayed(conn.status, True, events - last.count(b"data: [DONE]"), (prev, last))


async def _relay_whole(conn: UpstreamConn, send: Send, head: list, on_body: Callable[[bytes], bytes] | None) -> Relayed:
    kept: list[bytes] = []
    finished = False
    if on_body is not None:  # read whole before anything is sent: a broken answer is an UpstreamError
        while chunk := await conn.read():
            kept.append(chunk)
        out = on_body(b"".join(kept))
        await send({"type": "http.response.start", "status": conn.status,
                    "headers": [*head, (b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out, "more_body": False})
        return Relayed(conn.status, False, 0, tuple(kept))
    try:
        await send({"type": "http.response.start", "status": conn.status,
                    "headers": [*head, (b"content-length", str(conn.content_length).encode())]})
        while chunk := await conn.read():
            kept.append(chunk)
            finished = conn.drained
            await send({"type": "http.response.body", "body": chunk, "more_body": not finished})
            if finished:
                break
    except UpstreamError as e:
        return Relayed(conn.status, False, 0, tuple(kept), str(e))
    if not finished:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    return Relayed(conn.status, False, 0, tuple(kept))


