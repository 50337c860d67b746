"""Run the front door under uvicorn with fitevict's own shutdown.

On SIGTERM or SIGINT fitevict stops taking work and answers every queued and loading request at once
(503, ``Retry-After``, "shutting down"), starts no new load, lets requests in flight finish within
``policy.shutdown_grace_seconds``, then stops every seat with its release verified, and exits 0 with one
summary line. SIGHUP rescans the models directories. A second signal stops waiting for requests in flight; the seats are still stopped, so no
engine is left behind. Signal handlers only enqueue work on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn

from fitevict.server.connections import limits
from fitevict.server.gathered import GatheredHttpToolsProtocol
from fitevict.supervisor import ShutdownSummary, Supervisor


class CleanExitServer(uvicorn.Server):
    """A uvicorn server whose SIGINT/SIGTERM go to ``handle_exit`` while serving; unlike uvicorn's own, the signal
    is not raised again afterwards, so a clean shutdown exits 0 (the cluster's door runs one too)."""

    def signal_handlers(self) -> dict[int, Any]:
        return {signal.SIGINT: self.handle_exit, signal.SIGTERM: self.handle_exit}

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {s: signal.signal(s, h) for s, h in self.signal_handlers().items()}
        try:
            yield
        finally:
            for s, h in original.items():
                signal.signal(s, h)


class _Server(CleanExitServer):
    def __init__(self, config: uvicorn.Config, sup: Supervisor, watch=None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(config)
        self.sup = sup
        self.watch = watch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signals = 0

    def signal_handlers(self) -> dict[int, Any]:
        return {**super().signal_handlers(), signal.SIGHUP: self.handle_hangup}

    def handle_hangup(self, sig: int, frame: FrameType | None) -> None:
        """SIGHUP: rescan the models directories (enqueued on the event loop)."""
        if self._loop is not None and not self._loop.is_closed() and self.watch is not None:
            self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self.watch.rescan()))

    async def startup(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._signals += 1
        super().handle_exit(sig, frame)
        if self._signals > 1:
            self.force_exit = True  # any second signal, SIGTERM too
        if self._loop is None or self._loop.is_closed():
            return
        if self._signals == 1:
            self._loop.call_soon_threadsafe(self._begin)
        else:
            self._loop.call_soon_threadsafe(self.sup.hurry)

    def _begin(self) -> None:
        # answers the queue at once, so uvicorn's wait for open connections ends as soon as in-flight work does
        asyncio.ensure_future(self.sup.shutdown())

    async def shutdown(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        await super().shutdown(sockets)
        await self.sup.shutdown()  # forced exits skip the lifespan: the seats are stopped all the same


def serve(app, sup: Supervisor, *, host: str, port: int, log_level: str) -> ShutdownSummary | None:
    grace = sup.config.policy.shutdown_grace_seconds
    # proxy_headers off: fitevict reads no client address, so X-Forwarded-* need no parsing per request
    # ws "none": fitevict has no WebSocket route, so no WebSocket library is loaded; http: one write per answer
    lim = limits(sup.config.server.max_connections)  # a burst beyond the descriptors is refused cleanly
    protocol = type("DoorProtocol", (GatheredHttpToolsProtocol,), {"limits": lim})
    protocol.refusals.limits = lim  # /health says them
    cfg = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, proxy_headers=False,
                         ws="none", http=protocol, timeout_graceful_shutdown=int(grace + sup.config.engine.stop_grace_seconds + 5))
    server = _Server(cfg, sup, getattr(app.state, "catalog_watch", None))
    server.run()
    return sup.summary


__all__ = ["CleanExitServer", "serve"]
