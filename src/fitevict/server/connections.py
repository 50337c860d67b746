"""How many clients the front door holds at once, so that a burst beyond its file descriptors is refused cleanly.

Every client connection holds a descriptor, and a request being answered holds a second one (its connection to the
seat); the door's own files (its store, logs, the seats' logs and pipes, the event loop) need some too. Past
RLIMIT_NOFILE, ``accept`` fails and so would everything else that opens a file. So the door holds at most
``server.max_connections`` client connections (derived from RLIMIT_NOFILE when not set): a connection beyond it is
closed as soon as it is accepted (a refused connection, before any byte of it is read), and a request that arrives
while half as many requests are already in progress is refused in its API's shape with a ``Retry-After`` and its
connection closed: OpenAI's error envelope with ``503`` (the Responses API's too), Anthropic's ``529``
``overloaded_error`` on ``/v1/messages`` (its status for an overloaded service, which its SDK retries), Ollama's
``{"error"}`` with ``503`` on ``/api/``.
Connections plus requests then stay within what the limit leaves of the descriptors.
"""

from __future__ import annotations

import json
import logging
import resource
import time
from dataclasses import dataclass

from fitevict.server.errors import ANTHROPIC, OPENAI, ApiError

log = logging.getLogger("fitevict.server")
RESERVED_FDS = 128  # kept for the door's own files: its store, logs, the seats' logs and pipes, the event loop
RETRY_AFTER_S = 1


@dataclass(frozen=True, slots=True)
class Limits:
    """The most client connections held at once, the most requests in progress, and where they came from."""

    connections: int
    requests: int
    source: str


def limits(configured: int | None) -> Limits:
    """``server.max_connections`` when set, else derived from this process's RLIMIT_NOFILE: connections plus
    requests (half as many) within the descriptors left after ``RESERVED_FDS``."""
    if configured is not None:
        return Limits(configured, max(1, configured // 2), f"server.max_connections = {configured}")
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fds = soft if soft != resource.RLIM_INFINITY else 1 << 20
    most = max(2, (fds - RESERVED_FDS) * 2 // 3)
    return Limits(most, max(1, most // 2),
                  f"derived from RLIMIT_NOFILE {fds}: 2/3 of the {fds - RESERVED_FDS} descriptors left after "
                  f"{RESERVED_FDS} for the door's own files (server.max_connections)")


class Refusals:
    """Counts what was refused and says so in the server log at most once a second (a burst is one line)."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests = 0
        self.limits: Limits | None = None  # the serving door's, once it serves (``server.runner``)
        self._said = 0.0

    def note(self, what: str, held: int, in_progress: int, lim: Limits) -> None:
        setattr(self, what, getattr(self, what) + 1)
        now = time.monotonic()
        if now - self._said >= 1.0:
            self._said = now
            log.warning("too many clients: %d connections held (at most %d), %d requests in progress (at most %d), "
                        "%s; refused so far: %d connections, %d requests (503)", held, lim.connections,
                        in_progress, lim.requests, lim.source, self.connections, self.requests)


    def to_json(self) -> dict:
        """``/health``'s ``clients``: the limits the door holds and what it refused since it started."""
        lim = self.limits
        return {"max_connections": lim.connections if lim else None, "max_requests": lim.requests if lim else None,
                "limits": lim.source if lim else "none: this door is not served by fitevict's own HTTP server",
                "refused": {"connections": self.connections, "requests": self.requests}}


REFUSALS = Refusals()  # the serving door's one count (its HTTP protocol notes them, /health reads them)


def too_busy(path: str, in_progress: int, lim: Limits) -> tuple[int, bytes]:
    """The status and JSON body of a request refused for the door's load, in the API's shape of ``path`` (503;
    Anthropic's 529 ``overloaded_error``)."""
    message = (f"fitevict is serving {in_progress} requests at once, its most ({lim.requests}: half of "
               f"{lim.connections} connections, {lim.source}); retry in {RETRY_AFTER_S} s")
    if path.startswith("/api/"):  # Ollama's routes: {"error": "..."}
        return 503, json.dumps({"error": message}).encode()
    api = ANTHROPIC if path.startswith("/v1/messages") else OPENAI
    status, body = ApiError(503, message, type="server_busy", code="too_many_requests").shaped(api)
    return status, json.dumps(body).encode()


def refuse_app(in_progress: int, lim: Limits):  # type: ignore[no-untyped-def]
    """An ASGI app that answers ``too_busy`` with ``Retry-After`` and closes the connection."""
    async def refuse(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        status, body = too_busy(scope.get("path", ""), in_progress, lim)
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(RETRY_AFTER_S).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
    return refuse
