"""The current shape of each table, for queries (lightweight ``sa.table`` constructs; no DDL).

The DDL lives in :mod:`fitevict.store.migrations`; a test checks that these columns match the
migrated database exactly.
"""

from __future__ import annotations

import sqlalchemy as sa

_big = sa.BigInteger

measurements = sa.table(
    "measurements",
    sa.column("id", _big),
    sa.column("signature", sa.Text),
    sa.column("model", sa.Text),
    sa.column("engine", sa.Text),
    sa.column("measured_at", sa.Float),
    sa.column("footprint_json", sa.Text),
    sa.column("host_committed_bytes", _big),
    sa.column("host_mapped_bytes", _big),
    sa.column("total_bytes", _big),
    sa.column("source", sa.Text),
)

compute_cache = sa.table(
    "compute_cache",
    sa.column("key", sa.Text),
    sa.column("value_json", sa.Text),
    sa.column("created_at", sa.Float),
)

events = sa.table(
    "events",
    sa.column("id", _big),
    sa.column("time", sa.Float),
    sa.column("event", sa.Text),
    sa.column("model", sa.Text),
    sa.column("engine", sa.Text),
    sa.column("seconds", sa.Float),
    sa.column("vram_bytes", _big),
    sa.column("host_bytes", _big),
    sa.column("offloaded_bytes", _big),
    sa.column("strategy", sa.Text),
    sa.column("reason", sa.Text),
    sa.column("freed_bytes", _big),
    sa.column("request_id", sa.Text),
    sa.column("predicted_bytes", _big),
    sa.column("engine_reported_bytes", _big),
    sa.column("details_json", sa.Text),
    sa.column("buffers_predicted_bytes", _big),
)

seats = sa.table(
    "seats",
    sa.column("seat_id", sa.Text),
    sa.column("model", sa.Text),
    sa.column("engine", sa.Text),
    sa.column("pid", sa.Integer),
    sa.column("pgid", sa.Integer),
    sa.column("port", sa.Integer),
    sa.column("started_at", sa.Float),
    sa.column("state", sa.Text),
    sa.column("log_path", sa.Text),
    sa.column("config_json", sa.Text),
    sa.column("fitevict_pid", sa.Integer),
)

seat_peaks = sa.table(
    "seat_peaks",
    sa.column("id", _big),
    sa.column("seat_id", sa.Text),
    sa.column("model", sa.Text),
    sa.column("engine", sa.Text),
    sa.column("config_json", sa.Text),
    sa.column("started_at", sa.Float),
    sa.column("ended_at", sa.Float),
    sa.column("samples", sa.Integer),
    sa.column("peak_pss_bytes", _big),
    sa.column("peak_rss_bytes", _big),
    sa.column("peak_gpu_bytes", _big),
    sa.column("peak_available_drop_bytes", _big),
    sa.column("baseline_available_bytes", _big),
    sa.column("details_json", sa.Text),
)

gguf_structures = sa.table(
    "gguf_structures",
    sa.column("host", sa.Text),
    sa.column("path", sa.Text),
    sa.column("size", _big),
    sa.column("mtime_ns", _big),
    sa.column("inode", _big),
    sa.column("parser", sa.Text),
    sa.column("structure_json", sa.Text),
    sa.column("parsed_at", sa.Float),
)

TABLES: tuple[sa.TableClause, ...] = (measurements, compute_cache, events, seats, seat_peaks, gguf_structures)
