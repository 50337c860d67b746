"""Measurements, the compute-buffer cache and seats."""

from __future__ import annotations

import asyncio
import json

import pytest
import sqlalchemy as sa

from fitevict.pricing.footprint import DeviceFootprint, Footprint, Term, as_stored
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.store import SeatRecord, Store, measurement_signature
from fitevict.pricing.footprint import footprint_from_json
from fitevict.units import MiB


def _footprint() -> Footprint:
    cpu = DeviceFootprint(
        "CPU",
        model=Term(300 * MiB, "engine-reported"),
        context=Term(64 * MiB, "engine-reported"),
        compute=Term(20 * MiB, "engine-reported"),
        output=Term.unavailable("not in the log"),
    )
    return Footprint(devices=(cpu,), host_mapped_bytes=300 * MiB, host_committed_bytes=84 * MiB,
                     host_source="engine-reported")


def _sig(**config: object) -> str:
    cfg = LoadConfig(**config).to_json()  # type: ignore[arg-type]
    return measurement_signature(path="/m/a.gguf", size=1000, mtime_ns=5, quantization="Q4_K_M", config=cfg)


def test_measurement_round_trip(store: Store) -> None:
    fp = _footprint()
    mid = store.put_measurement(
        _sig(), "a", "llama.cpp", fp.to_json(), fp.host_committed_bytes, fp.host_mapped_bytes, fp.total_bytes,
        measured_at=10.0,
    )
    got = store.last_measurement(_sig())
    assert got is not None
    assert (got.id, got.model, got.engine, got.measured_at, got.source) == (mid, "a", "llama.cpp", 10.0,
                                                                             "engine-reported")
    assert got.footprint == fp.to_json()
    assert (got.host_committed_bytes, got.host_mapped_bytes, got.total_bytes) == (84 * MiB, 300 * MiB, fp.total_bytes)


def test_a_measurement_stored_before_the_engine_reported_label_still_loads(store: Store) -> None:
    """Rows written before "engine-reported" existed label the engine's buffers "measured": they load as they are,
    and are reused as a stored measurement like a new row."""
    old = _footprint().to_json()
    text = json.dumps(old).replace('"engine-reported"', '"measured"')
    store.put_measurement(_sig(), "a", "llama.cpp", json.loads(text), 84 * MiB, 300 * MiB,
                          _footprint().total_bytes, source="measured", measured_at=10.0)
    got = store.last_measurement(_sig())
    assert got is not None and got.source == "measured"
    fp = footprint_from_json(got.footprint)
    assert fp.device("CPU").model.source == "measured" and fp.total_bytes == _footprint().total_bytes
    assert as_stored(fp).device("CPU").model.source == "stored-measurement"
    assert as_stored(footprint_from_json(_footprint().to_json())).host_source == "stored-measurement"


def test_last_measurement_is_the_newest_for_that_signature(store: Store) -> None:
    s1, s2 = _sig(n_ctx=4096), _sig(n_ctx=8192)
    for at, sig, total in [(1.0, s1, 100 * MiB), (3.0, s1, 110 * MiB), (2.0, s1, 120 * MiB), (5.0, s2, 200 * MiB)]:
        store.put_measurement(sig, "a", "llama.cpp", {}, None, None, total, measured_at=at)
    m1, m2 = store.last_measurement(s1), store.last_measurement(s2)
    assert m1 is not None and (m1.measured_at, m1.total_bytes) == (3.0, 110 * MiB)
    assert m2 is not None and (m2.measured_at, m2.total_bytes) == (5.0, 200 * MiB)
    assert store.last_measurement(_sig(n_ctx=1024)) is None
    # every signature's newest in one read: the same pick, by signature
    store.put_measurement(s2, "a", "llama.cpp", {}, None, None, 210 * MiB, measured_at=5.0)  # same time: newest id
    newest = store.newest_measurements()
    assert set(newest) == {s1, s2} and newest[s1] == store.last_measurement(s1) == m1
    assert newest[s2] == store.last_measurement(s2) and newest[s2].total_bytes == 210 * MiB


def test_unavailable_host_figures_are_null(store: Store) -> None:
    sig = _sig()
    store.put_measurement(sig, "a", "llama.cpp", {}, None, 0, 5 * MiB)
    row = store.read(lambda c: c.execute(sa.text("SELECT host_committed_bytes, host_mapped_bytes FROM measurements")).one())
    assert tuple(row) == (None, 0)
    m = store.last_measurement(sig)
    assert m is not None and m.host_committed_bytes is None and m.host_mapped_bytes == 0


def test_unstorable_measurements_are_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="never stored"):
        store.put_measurement(_sig(), "a", "llama.cpp", {}, None, None, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="source 'unavailable'"):
        store.put_measurement(_sig(), "a", "llama.cpp", {}, None, None, 1, source="unavailable")
    with pytest.raises(ValueError, match="host_mapped_bytes"):
        store.put_measurement(_sig(), "a", "llama.cpp", {}, None, -5, 1)
    assert store.last_measurement(_sig()) is None


def test_signature_is_stable_and_sensitive() -> None:
    base = dict(path="/m/a.gguf", size=1000, mtime_ns=5, quantization="Q4_K_M", config={"n_ctx": 4096, "ngl": 0})
    same = measurement_signature(**{**base, "config": {"ngl": 0, "n_ctx": 4096}})  # key order does not matter
    assert measurement_signature(**base) == same
    assert same.startswith("sha256:")
    variants = [
        {"size": 1001},
        {"mtime_ns": 6},
        {"path": "/m/b.gguf"},
        {"quantization": "Q8_0"},
        {"config": {"n_ctx": 8192, "ngl": 0}},
    ]
    sigs = {measurement_signature(**{**base, **v}) for v in variants}  # type: ignore[arg-type]
    assert len(sigs) == len(variants) and same not in sigs
    assert _sig(devices=("CUDA0",)) != _sig() != _sig(cache_type_k="q8_0") != _sig(n_parallel=2)


def test_compute_cache(store: Store) -> None:
    assert store.compute_get("k") is None
    store.compute_put("k", {"CPU": 10, "CUDA0": 20})
    assert store.compute_get("k") == {"CPU": 10, "CUDA0": 20}
    store.compute_put("k", {"CPU": 11})
    assert store.compute_get("k") == {"CPU": 11}
    with pytest.raises(ValueError, match="device name -> bytes"):
        store.compute_put("k", {"CPU": -1})
    assert store.compute_get("k") == {"CPU": 11}


def _seat(seat_id: str, started: float, **kw: object) -> SeatRecord:
    base: dict = dict(seat_id=seat_id, model="a", engine="llama.cpp", state="starting", started_at=started, fitevict_pid=4242)
    return SeatRecord(**{**base, **kw})


def test_seats_crud(store: Store) -> None:
    assert store.seats() == []
    s2 = _seat("s2", 2.0, pid=101, pgid=101, port=8081, log_path="/l/s2.log", config={"n_ctx": 4096})
    s1 = _seat("s1", 1.0)
    store.seat_upsert(s2)
    store.seat_upsert(s1)
    assert store.seats() == [s1, s2]  # oldest first
    running = _seat("s1", 1.0, state="ready", pid=99, pgid=99, port=8080)
    store.seat_upsert(running)
    assert store.seat("s1") == running
    assert len(store.seats()) == 2
    assert store.seat_remove("s1") is True
    assert store.seat_remove("s1") is False
    assert store.seats() == [s2]
    assert store.seat("s1") is None


def test_seat_validation() -> None:
    with pytest.raises(ValueError, match="port 70000"):
        _seat("s", 1.0, port=70000)
    with pytest.raises(ValueError, match="pid"):
        _seat("s", 1.0, pid=0)


def test_async_facts(store: Store) -> None:
    async def go() -> tuple:
        await store.aio.put_measurement("sig", "a", "llama.cpp", {}, 1, 2, 3 * MiB, measured_at=1.0)
        await store.aio.compute_put("k", {"CPU": 7})
        await store.aio.seat_upsert(_seat("s", 1.0))
        out = (await store.aio.last_measurement("sig"), await store.aio.compute_get("k"), await store.aio.seats())
        removed = await store.aio.seat_remove("s")
        return (*out, removed, await store.aio.seat("s"))

    m, c, seats, removed, gone = asyncio.run(go())
    assert m is not None and m.total_bytes == 3 * MiB
    assert c == {"CPU": 7}
    assert [s.seat_id for s in seats] == ["s"] and removed is True and gone is None


def test_measurement_record_form(store: Store) -> None:
    from fitevict.store import Measurement

    m = Measurement(signature="sig", model="a", engine="llama.cpp", measured_at=7.0, footprint={"k": 1},
                    host_committed_bytes=None, host_mapped_bytes=3, total_bytes=9 * MiB)
    mid = store.put_measurement(m)
    got = store.last_measurement("sig")
    assert got is not None and got.id == mid
    assert got == Measurement(**{**{f: getattr(m, f) for f in m.__slots__}, "id": mid})
    with pytest.raises(TypeError, match="not both"):
        store.put_measurement(m, "a")
