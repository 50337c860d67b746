"""uvicorn's httptools protocol with its writes gathered per event-loop turn.

An ASGI answer is at least two messages (the head, then the body), and uvicorn writes each at once: two system
calls, and two wake-ups of the client, for every answer. Here a write is held until the next write or the end of
the event loop's turn (``call_soon``), whichever comes first: a whole answer (head and body) is one write, made
when its body is sent, so what the handler does after its last ``send`` (the log line, the metrics) is not in the
client's wait; a stream's chunk goes out in the turn it was relayed. Closing writes what is held first.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from fitevict.server.connections import REFUSALS, Limits, refuse_app


class _Gathered:
    """A transport that joins a write to the one after it, when that comes in the same loop turn."""

    __slots__ = ("_transport", "_loop", "_parts")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop, self._parts = transport, loop, []

    def write(self, data: bytes) -> None:
        parts = self._parts
        if not parts:  # held until the next write or the end of this turn, whichever comes first
            parts.append(data)
            self._loop.call_soon(self.flush)
            return
        parts.append(data)  # the next write: both go now, so an answer's last bytes never wait for the turn
        self.flush()

    def flush(self) -> None:
        parts = self._parts
        if not parts:
            return
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        parts.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._parts))

    def __getattr__(self, name: str) -> Any:  # pause_reading, get_extra_info, is_closing, abort, ...
        return getattr(self._transport, name)


class GatheredHttpToolsProtocol(HttpToolsProtocol):
    """``--http httptools`` with ``_Gathered`` writes (pass the class as ``uvicorn.Config(http=...)``)."""

    limits: Limits | None = None  # the door's (``connections``), set on a subclass by ``server.runner``
    refusals = REFUSALS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        lim = self.limits
        if lim is not None and len(self.connections) > lim.connections:  # refused before a byte of it is read
            self.refusals.note("connections", len(self.connections), len(self.tasks), lim)
            transport.close()
            return
        self.transport = _Gathered(transport, self.loop)  # type: ignore[assignment]

    def on_headers_complete(self) -> None:
        lim = self.limits
        if lim is None or len(self.tasks) < lim.requests:
            super().on_headers_complete()
            return
        self.refusals.note("requests", len(self.connections), len(self.tasks), lim)
        app, self.app = self.app, refuse_app(len(self.tasks), lim)  # 503 in the route's API's shape, then close
        try:
            super().on_headers_complete()
        finally:
            self.app = app
