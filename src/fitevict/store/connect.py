"""Opening the store's database: SQLite (WAL, one writer, many readers) or PostgreSQL by URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, make_url

from fitevict.paths import data_dir

INCREMENTAL = 2  # SQLite's PRAGMA auto_vacuum value for INCREMENTAL (0: NONE, 1: FULL)
SQLITE_HEAP_BYTES = 4 * 2**20
"""What SQLite may hold in the door's memory, all connections together (``PRAGMA soft_heap_limit``, process-wide):
beyond it the page caches give pages up before taking new ones. Unbounded, each pooled connection's cache grows to
2 MiB as the history grows (SQLite's default), one more steady climb in a door that runs for days; the file's pages
stay in the kernel's page cache, so a read that misses costs a copy, not a disk read."""

SQLITE_READERS = 4
"""Reader connections a SQLite store holds beside its writer's, all opened with the store (:func:`open_readers`), and
no more: its descriptors are then as many from the first request as after a week (two per connection, the file and
its WAL, and one ``-shm`` for the process). A read beyond that many at once waits for a reader (a read takes about
0.1 ms). Readers opened on demand climbed with each new peak of reads at once, a step over hours of traffic, and
closing the extra ones after does not give their descriptors back: SQLite keeps a closed connection's file open
for the next connection while others hold locks on it, as a WAL store's connections always do."""


class StoreError(RuntimeError):
    """The store cannot be opened or used as configured."""


class StoreFileLost(OSError):
    """The store's SQLite file is no longer the one fitevict opened: deleted, or another file put in its place, while
    fitevict ran. A write there would go to a file no one can open again."""


def file_identity(url: str) -> tuple[int, int] | None:
    """(device, inode) of a SQLite store's file, as it is now; None for a server's store or a file not there."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database:
        return None
    try:
        st = Path(u.database).expanduser().stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_same_file(url: str, identity: tuple[int, int] | None) -> None:
    """Raise ``StoreFileLost`` when the file at ``url`` is not the one opened (``identity``): deleted, or replaced.
    Nothing when it is, when the store is not a file, or when it cannot be read now (the write then says why)."""
    if identity is None:
        return
    path = Path(make_url(url).database or "").expanduser()
    try:
        st = path.stat()
    except FileNotFoundError:
        raise StoreFileLost(f"the store's file {path} was deleted while fitevict ran") from None
    except OSError:
        return
    if (st.st_dev, st.st_ino) != identity:
        raise StoreFileLost(f"the store's file {path} was replaced by another file while fitevict ran")


def default_url() -> str:
    """``sqlite:///<data_dir>/fitevict.db`` (an absolute path, so four slashes)."""
    return f"sqlite:///{(data_dir() / 'fitevict.db').resolve()}"


def make_engine(url: str, *, busy_timeout_s: float = 5.0) -> Engine:
    """A SQLAlchemy engine for ``url``. SQLite: parent directories created, auto_vacuum=INCREMENTAL, WAL,
    synchronous=NORMAL, busy_timeout, foreign_keys on, its memory bounded (``SQLITE_HEAP_BYTES``), and real transactions (fitevict issues BEGIN itself, so DDL is
    transactional and the writer takes the write lock up front with BEGIN IMMEDIATE). PostgreSQL:
    see :func:`_postgres_engine` (its driver opens transactions itself; DDL is transactional there too).
    Any other backend raises :class:`StoreError`."""
    u = make_url(url)
    backend = u.get_backend_name()
    if backend == "postgresql":
        return _postgres_engine(u)
    if backend != "sqlite":
        raise StoreError(
            f"store URL {u.render_as_string(hide_password=True)!r} names the backend {backend!r}; the store runs on "
            "SQLite (sqlite:////path/to/fitevict.db) or PostgreSQL (postgresql+psycopg://user:pass@host/db)"
        )
    db = u.database or ""
    if db in ("", ":memory:") or "mode=memory" in db:
        raise StoreError(
            f"store URL {url!r} is an in-memory SQLite database, which each connection sees separately; "
            "the store needs a file (one writer, many readers). Use sqlite:////path/to/fitevict.db"
        )
    Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(u, pool_size=1 + SQLITE_READERS, max_overflow=0,  # the writer's and the readers
                              connect_args={"timeout": busy_timeout_s})
    busy_ms = int(busy_timeout_s * 1000)

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # no implicit BEGIN from the driver; see _on_begin
        cur = dbapi_conn.cursor()
        try:
            if cur.execute("PRAGMA page_count").fetchone()[0] == 0:
                # a new file: it hands freed pages back to the disk on demand (retention.op_compact). Asked only
                # here: on a file with pages this PRAGMA writes its header, so it would wait on the writer's lock
                cur.execute(f"PRAGMA auto_vacuum={INCREMENTAL}")
            mode = cur.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(
                    f"SQLite refused WAL mode for {db} (journal_mode is {mode!r}); WAL needs a local filesystem "
                    "that supports shared memory. Put the store on a local disk, or use Postgres by URL."
                )
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute(f"PRAGMA busy_timeout={busy_ms:d}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA soft_heap_limit={SQLITE_HEAP_BYTES:d}")
        finally:
            cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get("fitevict_begin") == "IMMEDIATE"
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def open_readers(engine: Engine) -> None:
    """Open a SQLite store's ``SQLITE_READERS`` reader connections now, its writer's already held, so that the pool
    holds all it ever will. A server's store opens its connections on demand (each one a server process; checked
    before use)."""
    if engine.dialect.name != "sqlite":
        return
    held = [engine.connect() for _ in range(SQLITE_READERS)]
    for conn in held:
        conn.close()  # back to the pool, open


POSTGRES_DRIVER = "psycopg"
"""The driver a bare ``postgresql://`` URL gets (psycopg 3: ``pip install 'fitevict[postgres]'``)."""


def _postgres_engine(u: sa.URL) -> Engine:
    """PostgreSQL: psycopg 3 unless the URL names another driver; connections checked before use, so a
    restarted server costs a reconnect rather than an error; fitevict's name in ``pg_stat_activity``."""
    if u.drivername == "postgresql":
        u = u.set(drivername=f"postgresql+{POSTGRES_DRIVER}")
    connect_args: dict[str, Any] = {}
    if "application_name" not in u.query:
        connect_args["application_name"] = "fitevict"
    if "connect_timeout" not in u.query:
        connect_args["connect_timeout"] = 10
    try:
        return sa.create_engine(u, pool_pre_ping=True, connect_args=connect_args)
    except ImportError as e:
        raise StoreError(
            f"store URL {u.render_as_string(hide_password=True)!r} needs the PostgreSQL driver {u.get_driver_name()!r}, "
            f"which is not installed ({e}). Install fitevict with its postgres extra: pip install 'fitevict[postgres]' "
            "(psycopg 3), and use postgresql:// or postgresql+psycopg://"
        ) from e


# what SQLite says of a file that is not (or no longer) a database: never a lock or a busy file
CORRUPT = ("file is not a database", "database disk image is malformed")


def corrupt(url: str, error: BaseException) -> bool:
    """``error`` is SQLite saying that the store file at ``url`` is not (or no longer) a database: never a lock, a
    full disk or a busy file, and never a server's store."""
    import sqlite3

    u = sa.engine.make_url(url)
    orig = getattr(error, "orig", None)
    return (u.get_backend_name() == "sqlite" and bool(u.database) and u.database != ":memory:"
            and isinstance(orig, sqlite3.DatabaseError) and not isinstance(orig, sqlite3.OperationalError)
            and str(orig).startswith(CORRUPT))


def move_aside_sidecars(url: str) -> list[Path]:
    """After the store's file was lost (deleted or replaced) and its connections closed, the ``-wal`` and ``-shm``
    files left at its path are the lost file's: SQLite would replay that write-ahead log into whatever file now has
    the name. Each is renamed to ``<name>-wal.lost-<unix time>`` (kept, never read); returns the new names."""
    import time

    path = Path(sa.engine.make_url(url).database or "").expanduser()
    moved = []
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            moved.append(side.rename(side.with_name(f"{side.name}.lost-{int(time.time())}")))
    return moved


def move_aside_corrupt(url: str, error: BaseException) -> Path | None:
    """A SQLite store file that SQLite cannot read as a database (``error`` says so) is renamed, with its ``-wal``
    and ``-shm`` files, to ``<name>.corrupt-<unix time>``, so that a new, empty store can start in its place and
    nothing it held is deleted. Returns the new name; None (nothing moved) for any other error or store."""
    import time

    if not corrupt(url, error):
        return None
    path = Path(sa.engine.make_url(url).database or "").expanduser()
    aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(aside.with_name(aside.name + suffix))
    path.rename(aside)
    return aside
