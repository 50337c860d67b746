"""uvicorn's httptools protocol with its writes gathered per event-loop turn.

An ASGI answer is at least two messages (the head, then the body), and uvicorn writes each at once: two system
calls, and two wake-ups of the client, for every answer. Here the writes made in one turn of the event loop go
out as one (a call scheduled with ``call_soon`` joins them), so a whole answer is one write, and a stream's chunks
still go out in the turn they were relayed. Closing writes what is gathered first.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _Gathered:
    """A transport whose ``write``s within one loop turn become one write of the real transport."""

    __slots__ = ("_transport", "_loop", "_parts")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop, self._parts = transport, loop, []

    def write(self, data: bytes) -> None:
        if not self._parts:
            self._loop.call_soon(self.flush)
        self._parts.append(data)

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

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = _Gathered(transport, self.loop)  # type: ignore[assignment]
