"""The one writer: a dedicated thread that owns one connection and runs queued write functions.

Every write in the process goes through it, one at a time, each in its own transaction, so
writers never contend for SQLite's lock among themselves (datasette's pattern). Callers get a
:class:`concurrent.futures.Future`; block on it, or ``asyncio.wrap_future`` it.

On a server database (PostgreSQL) the one long-lived connection can be dropped by the server
(restart, failover, idle timeout). Each transaction there opens with ``SELECT 1``; when that finds
the connection gone, the write runs once more on a new connection. The write function had not
run yet, so nothing is done twice.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from fitevict.store.faults import STORE_FAULTS, StoreClosedError, StoreFaults, figure

T = TypeVar("T")

_STOP = object()


class NestedWriteError(RuntimeError):
    """A write function tried to submit another write: it would wait on itself forever."""


class _Reconnect(Exception):
    """The connection was found dead before the write function ran."""


class Writer:
    """Runs ``fn(conn)`` for each submitted write, in submission order, on one thread."""

    def __init__(self, engine: Engine, *, name: str = "fitevict-store-writer",
                 faults: StoreFaults | None = None, guard: Callable[[], None] | None = None) -> None:
        self._engine = engine
        self.guard = guard  # run before each write: raises a store fault when the write must not go there
        self.faults = faults or StoreFaults()  # what the store refused (``store.faults``)
        self.on_refused: Callable[[BaseException], None] | None = None  # called (on this thread) with each refusal
        self._ping = engine.dialect.name != "sqlite"  # a file cannot drop the connection; a server can
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._ready: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._ready.result()  # raises if the writer could not connect

    @property
    def thread_ident(self) -> int | None:
        return self._thread.ident

    def submit(self, fn: Callable[[Connection], T], *, transaction: bool = True) -> Future[T]:
        """Queue ``fn`` to run in a transaction on the writer's connection; its result (or error) lands in the future.
        ``transaction=False``: ``fn`` runs on that connection with no transaction open (what SQLite runs only so:
        ``VACUUM``; ``retention.op_compact``), still one write at a time."""
        if threading.current_thread() is self._thread:
            raise NestedWriteError(
                "a store write function submitted another write; do all of it in the one function (it already "
                "holds the transaction)"
            )
        fut: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise StoreClosedError("the store is closed; open it again to write")
            self._queue.put((fn, fut, transaction))
        return fut

    def close(self) -> None:
        """Finish every write already queued, then stop the thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        self._thread.join()

    def _run(self) -> None:
        try:
            conn = self._engine.connect().execution_options(fitevict_begin="IMMEDIATE")
        except BaseException as e:  # reported to the opener through _ready
            self._ready.set_exception(e)
            self._shut("the store writer could not connect")
            return
        self._ready.set_result(None)
        try:
            with conn:
                self._loop(conn)
        finally:
            self._shut("the store writer stopped")

    def _loop(self, conn: Connection) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            fn, fut, transaction = item
            if not fut.set_running_or_notify_cancel():
                continue  # the caller cancelled before it started
            try:
                if self.guard is not None:
                    self.guard()
                result = self._transaction(conn, fn) if transaction else fn(conn)
            except BaseException as e:
                if isinstance(e, STORE_FAULTS):
                    self.faults.refuse(figure(fn), e)
                    if self.on_refused is not None:
                        self.on_refused(e)
                fut.set_exception(e)
                if not isinstance(e, Exception):
                    raise
            else:
                self.faults.wrote()
                fut.set_result(result)

    def _transaction(self, conn: Connection, fn: Callable[[Connection], T]) -> T:
        """``fn(conn)`` in one transaction; on a server, first make sure the connection is alive (see the module doc)."""
        try:
            with conn.begin():
                self._check_alive(conn)
                return fn(conn)
        except _Reconnect:
            # the failed ping invalidated the connection and fn has not run: this begin() connects afresh
            with conn.begin():
                return fn(conn)

    def _check_alive(self, conn: Connection) -> None:
        if not self._ping:
            return
        try:
            conn.exec_driver_sql("SELECT 1")
        except sa.exc.DBAPIError as e:
            if e.connection_invalidated:
                raise _Reconnect from e
            raise

    def _shut(self, why: str) -> None:
        """Refuse new writes and fail any still queued, so no caller waits forever on a dead writer."""
        with self._lock:
            self._closed = True
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP and item[1].set_running_or_notify_cancel():
                item[1].set_exception(StoreClosedError(f"{why} before this write ran"))
