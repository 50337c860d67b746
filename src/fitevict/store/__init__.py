"""The store of facts and history: SQLAlchemy Core over SQLite (WAL) or Postgres, one writer.

See :mod:`fitevict.store.store` for the concurrency design.
"""

from fitevict.store.migrations import MIGRATIONS, Migration, StoreVersionError
from fitevict.store.records import EVENTS, Event, Measurement, SeatRecord, measurement_signature
from fitevict.store.store import (
    EVENT_SORT_COLUMNS,
    MAX_EVENTS_LIMIT,
    AsyncStore,
    Store,
    StoreError,
    default_url,
    make_engine,
)
from fitevict.store.writer import NestedWriteError, StoreClosedError

__all__ = [
    "EVENTS",
    "EVENT_SORT_COLUMNS",
    "MAX_EVENTS_LIMIT",
    "MIGRATIONS",
    "AsyncStore",
    "Event",
    "Measurement",
    "Migration",
    "NestedWriteError",
    "SeatRecord",
    "Store",
    "StoreClosedError",
    "StoreError",
    "StoreVersionError",
    "default_url",
    "make_engine",
    "measurement_signature",
]
