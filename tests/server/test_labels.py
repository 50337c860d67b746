"""History labels follow each event's own data: predicted (the whole price), buffers_predicted, allocated
(engine-reported), measured, host, vram and freed sources."""

from __future__ import annotations

import time
from pathlib import Path

from fitevict.pricing.footprint import DeviceFootprint, Footprint, Term, as_stored
from fitevict.server.admin import history_row
from fitevict.server.labels import NA, footprint_sources, history_sources
from fitevict.store.records import Event
from fitevict.units import MiB

PRICED = Footprint((DeviceFootprint("CPU", Term(10 * MiB, "formula"), Term(2 * MiB, "formula"),
                                    Term(3 * MiB, "dry-run"), Term(MiB, "formula")),),
                   host_mapped_bytes=10 * MiB, host_committed_bytes=6 * MiB, host_source="formula")
MEASURED = Footprint((DeviceFootprint("CPU", *(Term(n * MiB, "measured") for n in (10, 2, 3, 1))),),
                     host_mapped_bytes=10 * MiB, host_committed_bytes=6 * MiB, host_source="measured")
PSS = {"committed_bytes": 15 * MiB, "mapped_bytes": 10 * MiB, "rss_bytes": 26 * MiB, "source": "smaps_rollup",
       "reason": "", "pids": [1]}


def _load(predicted: Footprint, **details: object) -> Event:
    return Event(time=1.0, event="load", model="m", host_bytes=26 * MiB, predicted_bytes=predicted.whole_bytes,
                 buffers_predicted_bytes=predicted.total_bytes, engine_reported_bytes=MEASURED.total_bytes,
                 details={"predicted": predicted.to_json(), "measured": MEASURED.to_json(), "host_pss": PSS,
                          **details})


def test_a_priced_load_names_each_source_it_used() -> None:
    src = history_sources(_load(PRICED))
    assert src["predicted"] == "dry-run+formula" and src["buffers_predicted"] == "dry-run+formula"
    assert src["allocated"] == "engine-reported: the engine's own buffers (its load log or allocator trace)"
    assert src["host"] == ("planned: the larger of measured PSS (smaps_rollup) and the engine-reported buffers + "
                           "engine overhead")
    assert src["vram"] == NA and src["freed"] == NA  # a CPU load frees nothing and has no GPU figure


def test_a_load_predicted_from_a_stored_measurement_says_so() -> None:
    stored = as_stored(MEASURED)
    assert {t.source for d in stored.devices for t in (d.model, d.context, d.compute, d.output)} == \
        {"stored-measurement"}
    assert history_sources(_load(stored))["predicted"] == "stored-measurement"


def test_a_load_without_measurements_says_why() -> None:
    ev = Event(time=1.0, event="load", model="m", host_bytes=16 * MiB, predicted_bytes=PRICED.whole_bytes,
               details={"predicted": PRICED.to_json(), "measured": "the log had no buffer lines",
                        "host_pss": {"committed_bytes": None, "reason": "the process exited", "source": "unavailable"}})
    src = history_sources(ev)
    assert src["allocated"] == "unavailable: the log had no buffer lines"
    assert src["host"] == "unavailable: the process exited"


def test_stop_events_label_freed_memory_from_their_release() -> None:
    freed = Event(time=1.0, event="evict", model="m", freed_bytes=20 * MiB, host_bytes=26 * MiB,
                  details={"release_verified": True, "freed_source": "measured: /proc/meminfo AnonPages+Shmem fall",
                           "host_source": "measured"})
    assert history_sources(freed)["freed"] == "measured: /proc/meminfo AnonPages+Shmem fall"
    assert history_sources(freed)["host"] == "measured"
    lost = Event(time=1.0, event="unload", model="m", freed_bytes=None,
                 details={"release_verified": False,
                          "release_note": "unverified: held memory on CPU was never measured"})
    assert history_sources(lost)["freed"] == "unavailable: unverified: held memory on CPU was never measured"


def test_a_refusal_labels_its_prediction_from_the_plan() -> None:
    ev = Event(time=1.0, event="refuse", model="m", predicted_bytes=PRICED.whole_bytes,
               details={"plan": {"action": "refuse", "footprint": PRICED.to_json()}})
    src = history_sources(ev)
    assert src["predicted"] == "dry-run+formula" and src["allocated"] == NA and src["host"] == NA


def test_history_rows_carry_the_labels_and_the_error() -> None:
    row = history_row(_load(PRICED))
    src = history_sources(_load(PRICED))
    assert row["sources"]["allocated"] == src["allocated"] and row["sources"]["predicted"] == src["predicted"]
    # four figures, each under its own name: the whole price, the buffers priced, the engine's buffers, PSS read
    assert row["bytes"]["predicted"] == PRICED.whole_bytes == 16 * MiB  # host mapped + committed
    assert row["bytes"]["buffers_predicted"] == PRICED.total_bytes == 16 * MiB
    assert row["bytes"]["allocated"] == MEASURED.total_bytes
    assert row["bytes"]["measured"] == 25 * MiB and row["sources"]["measured"].startswith("measured: PSS")
    assert row["prediction_error_against"] == "allocated (engine-reported), from buffers_predicted"
    err = row["prediction_error"]
    assert err["bytes"] == PRICED.total_bytes - MEASURED.total_bytes == 0 and err["fraction"] == 0.0
    assert history_row(Event(time=1.0, event="fail", model="m"))["prediction_error"] is None


def test_footprint_sources_reads_combined_host_labels() -> None:
    fp = Footprint(PRICED.devices, host_source="formula+measured").to_json()  # type: ignore[arg-type]
    assert footprint_sources(fp) == "dry-run+formula+measured"
    assert footprint_sources("not a footprint") is None


def test_dashboard_history_labels_follow_the_data(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from fitevict.config import load_config
    from fitevict.request.catalog import Catalog
    from fitevict.server.app import create_app
    from fitevict.store import Store

    engine = tmp_path / "llama-server"
    engine.write_text("#!/bin/sh\necho 'usage: --fit --cache-ram --no-webui --log-verbosity'\n")
    engine.chmod(0o755)
    cfg = load_config(None, env={}, overrides={"data_dir": str(tmp_path / "data"), "models_dirs": []})
    store = Store.open(cfg.store_url)
    try:
        # now: an event of 1970 would be pruned at start-up (logs.history_days)
        store.record_event(Event(time=time.time(), event="unload", model="m", freed_bytes=None, host_bytes=3 * MiB,
                                 details={"release_verified": False, "release_note": "unverified: never measured",
                                          "host_source": "predicted (formula)"}))
    finally:
        store.close()
    with TestClient(create_app(cfg, engine_binary=engine, catalog=Catalog([]))) as c:
        html = c.get("/dashboard/live").text.split('<ol class="timeline">')[1]
    assert 'title="unavailable: unverified: never measured"' in html
    assert 'title="measured' not in html.split('class="bytes"')[1]  # nothing in this history was measured
