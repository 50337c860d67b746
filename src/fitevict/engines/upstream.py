"""The lean upstream client: HTTP/1.1 to a seat on loopback, a pool of kept-alive connections per seat port.

One asyncio Protocol per connection, parsed by httptools (the C parser uvicorn uses). The response body is
handed over as the bytes objects the parser produced: nothing is copied or joined on the way through.

    conn = await upstream.open(port, "/v1/chat/completions", body, request_id)
    conn.status, conn.content_type
    while (chunk := await conn.read()):
        ...
    upstream.release(conn)        # back to the pool if the response allows keep-alive, else closed

llama-server drops a kept-alive connection after a streamed response; a pooled connection that turns out to
be closed before any byte of the answer arrives is retried once on a fresh one.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

import httptools

__all__ = ["Upstream", "UpstreamConn", "UpstreamError", "health_status"]

HIGH_WATER = 1 << 20  # bytes buffered from the engine before reading from it pauses (a slow client)
LOW_WATER = 1 << 18


class UpstreamError(Exception):
    """The engine did not answer: connection refused, reset, or a malformed response."""


class _Stale(Exception):
    """A pooled connection was closed by the engine before it answered: safe to send again."""


class UpstreamConn(asyncio.Protocol):
    """One connection to a seat, and the response in progress on it."""

    def __init__(self, port: int, on_lost: Callable[[UpstreamConn], object] | None = None) -> None:
        self.port = port
        self.on_lost = on_lost  # the pool's: a connection the engine closed leaves it at once
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.paused = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.content_type = b"application/json"
        self.content_length: int | None = None
        self.adapter: bytes | None = None  # a transformers seat's x-fitevict-adapter answer (its activation)
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.complete = False
        self.keep_alive = False
        self.error: BaseException | None = None
        self.answered = False  # any byte of this response arrived
        self.waiter: asyncio.Future[None] | None = None
        self.waiting_since: float | None = None  # monotonic time since when the reader has waited for the engine

    # -- the transport's callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self.error = UpstreamError(f"malformed response from the engine on port {self.port}: {e}")
            self.abort()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.complete and self.error is None:
            self.error = exc or ConnectionResetError(f"the engine on port {self.port} closed the connection")
        self._wake()
        if self.on_lost is not None:
            self.on_lost(self)

    # -- the parser's callbacks ------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        n = name.lower()
        if n == b"content-type":
            self.content_type = value
        elif n == b"content-length":
            self.content_length = int(value)
        elif n == b"x-fitevict-adapter":
            self.adapter = value

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()  # llhttp answers this only within the callbacks
        self.complete = True

    # -- the consumer's side ---------------------------------------------------------------------

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        self.waiting_since = time.monotonic()
        try:
            await self.waiter
        finally:
            self.waiter = self.waiting_since = None

    async def _send(self, request: bytes, on_sent: Callable[[], object] | None = None) -> None:
        """Write the request, call ``on_sent`` (work that overlaps the engine's), wait for the response's head."""
        self._reset()
        assert self.transport is not None
        self.transport.write(request)
        if on_sent is not None:
            on_sent()
        while not self.status:
            if self.error is not None:
                raise self.error
            await self._wait()

    async def read(self) -> bytes:
        """The next body chunk as received; b"" at the end of the response."""
        while True:
            if self.chunks:
                chunk = self.chunks.popleft()
                self.buffered -= len(chunk)
                if self.paused and self.buffered < LOW_WATER and self.transport is not None:
                    self.paused = False
                    self.transport.resume_reading()
                return chunk
            if self.complete:
                return b""
            if self.error is not None:
                raise UpstreamError(f"the engine on port {self.port} broke off its answer: {self.error!r}")
            await self._wait()

    @property
    def drained(self) -> bool:
        """The whole response is read: nothing buffered and nothing more to come."""
        return self.complete and not self.chunks

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class Upstream:
    """Kept-alive connections to seats, by port (a seat's port is unique while it lives). A kept connection the
    engine closes (after a stream, or because its seat stopped) leaves the pool when it closes, and a port with no
    connection left leaves it too: seats come and go on fresh ports, and the pool holds only live connections."""

    def __init__(self, *, connect_timeout: float = 10.0) -> None:
        self.connect_timeout = connect_timeout
        self.idle: dict[int, list[UpstreamConn]] = {}
        self.busy: dict[int, set[UpstreamConn]] = {}  # connections with a request in progress, by port
        self.closed = False

    async def open(self, port: int, path: str, body: bytes, request_id: str,
                   content_type: bytes = b"application/json", on_sent: Callable[[], object] | None = None
                   ) -> UpstreamConn:
        """Send ``POST path`` to the seat on ``port`` and return the connection once the response head is in.
        ``on_sent`` is called once the request is written (each time it is). Raises UpstreamError when the engine
        cannot be reached or breaks off before answering."""
        request = b"".join((b"POST ", path.encode(), b" HTTP/1.1\r\nHost: 127.0.0.1:", str(port).encode(),
                            b"\r\nContent-Type: ", content_type, b"\r\nContent-Length: ", str(len(body)).encode(),
                            b"\r\nX-Request-Id: ", request_id.encode(), b"\r\n\r\n", body))
        conn = self._pooled(port)
        if conn is not None:
            try:
                return await self._sent(conn, request, pooled=True, on_sent=on_sent)
            except _Stale:
                pass  # the engine closed it after an earlier stream: once more on a fresh connection
        conn = await self._connect(port)
        return await self._sent(conn, request, pooled=False, on_sent=on_sent)

    async def _sent(self, conn: UpstreamConn, request: bytes, *, pooled: bool,
                    on_sent: Callable[[], object] | None) -> UpstreamConn:
        """``conn`` counted busy (until ``release``) with ``request`` sent and the response's head in."""
        busy = self.busy.setdefault(conn.port, set())
        busy.add(conn)
        try:
            await self._send(conn, request, pooled=pooled, on_sent=on_sent)
        except BaseException:
            busy.discard(conn)
            raise
        return conn

    def silent_for(self, port: int) -> float | None:
        """Seconds the longest-waiting reader of the seat on ``port`` has waited for its next byte; None when no
        reader waits on it (no request in progress, or every one busy passing bytes on to its client)."""
        since = [c.waiting_since for c in self.busy.get(port, ()) if c.waiting_since is not None]
        return time.monotonic() - min(since) if since else None

    async def _send(self, conn: UpstreamConn, request: bytes, *, pooled: bool,
                    on_sent: Callable[[], object] | None = None) -> None:
        try:
            await conn._send(request, on_sent)
        except asyncio.CancelledError:
            conn.abort()
            raise
        except (OSError, UpstreamError) as e:
            conn.abort()
            if pooled and not conn.answered:
                raise _Stale from e
            raise UpstreamError(f"the engine on port {conn.port} did not answer: {e!r}") from e

    def _pooled(self, port: int) -> UpstreamConn | None:
        conns = self.idle.get(port)
        while conns:
            conn = conns.pop()
            if not conns:
                del self.idle[port]
            if not conn.lost and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    async def _connect(self, port: int) -> UpstreamConn:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: UpstreamConn(port, self._lost), "127.0.0.1", port),
                self.connect_timeout)
        except (OSError, asyncio.TimeoutError) as e:
            raise UpstreamError(f"cannot connect to the engine on 127.0.0.1:{port}: {e!r}") from e
        return conn

    def release(self, conn: UpstreamConn) -> None:
        """Done with ``conn``: keep it for the next request if its response ended cleanly and allows it."""
        busy = self.busy.get(conn.port)
        if busy is not None:
            busy.discard(conn)
            if not busy:
                del self.busy[conn.port]
        if (not self.closed and conn.drained and conn.error is None and not conn.lost
                and conn.keep_alive):
            self.idle.setdefault(conn.port, []).append(conn)
        else:
            conn.abort()

    def _lost(self, conn: UpstreamConn) -> None:
        """``conn`` closed: out of the idle pool, and its port with it once none is left."""
        conns = self.idle.get(conn.port)
        if conns is not None and conn in conns:
            conns.remove(conn)
            if not conns:
                del self.idle[conn.port]

    def close(self) -> None:
        self.closed = True
        for conns in self.idle.values():
            for conn in conns:
                conn.abort()
        self.idle.clear()


async def health_status(port: int, path: str = "/health", *, timeout: float = 2.0) -> int | None:
    """One readiness probe: ``GET path`` on 127.0.0.1:``port`` over a fresh connection; the status code, or None
    when nothing listens there yet or the answer does not come within ``timeout``. No client object to build
    (an httpx client loads a TLS context first, which takes longer than a small model's whole load)."""
    loop = asyncio.get_running_loop()
    try:  # asyncio.timeout, not wait_for: a cancellation of the caller is never swallowed
        async with asyncio.timeout(timeout):
            transport, conn = await loop.create_connection(lambda: UpstreamConn(port), "127.0.0.1", port)
    except (OSError, TimeoutError):
        return None
    try:
        async with asyncio.timeout(timeout):
            await conn._send(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                             f"Connection: close\r\n\r\n".encode())
        return conn.status
    except (OSError, UpstreamError, TimeoutError):
        return None
    finally:
        transport.abort()
