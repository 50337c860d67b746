"""History: vocabulary, filters, ordering, bounds, bound parameters, NULL for unavailable."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from fitevict.store import EVENTS, MAX_EVENTS_LIMIT, Event, Store


def _seed(store: Store) -> list[Event]:
    """Nine events at t = 100..108 across two models and three kinds."""
    rows = [
        Event(time=100.0 + i, event=kind, model=model, seconds=float(10 - i))
        for i, (kind, model) in enumerate(
            [
                ("load", "a"),
                ("load", "b"),
                ("evict", "a"),
                ("load", "a"),
                ("unload", "b"),
                ("fail", "b"),
                ("idle-unload", "a"),
                ("refuse", "c"),
                ("load", "b"),
            ]
        )
    ]
    for e in rows:
        store.record_event(e)
    return rows


def test_every_vocabulary_word_round_trips(store: Store) -> None:
    for i, kind in enumerate(EVENTS):
        store.record_event(Event(time=float(i), event=kind, model="m"))
    assert [e.event for e in store.events(order="asc")] == list(EVENTS)


def test_event_outside_vocabulary_is_rejected_by_record_and_by_table(store: Store) -> None:
    with pytest.raises(ValueError, match="vocabulary"):
        Event(time=1.0, event="explode")
    # the table's CHECK refuses it even when the record is bypassed
    raw = sa.text("INSERT INTO events (time, event, details_json) VALUES (:t, :e, '{}')")
    with pytest.raises(sa.exc.IntegrityError):
        store.write(lambda conn: conn.execute(raw, {"t": 1.0, "e": "explode"}))
    assert store.events() == []


def test_record_returns_id_and_round_trips_all_fields(store: Store) -> None:
    e = Event(
        time=1234.5,
        event="evict",
        model="qwen",
        engine="llama.cpp",
        seconds=0.75,
        vram_bytes=3 << 30,
        host_bytes=1 << 30,
        offloaded_bytes=512 << 20,
        strategy="lru",
        reason="make room for big",
        freed_bytes=3 << 30,
        request_id="req-1",
        predicted_bytes=(4 << 30) + (64 << 20),
        buffers_predicted_bytes=4 << 30,
        engine_reported_bytes=(4 << 30) + 123,
        details={"release_verified": True, "pids": [10, 11], "exit_s": 0.2},
    )
    new_id = store.record_event(e)
    (got,) = store.events()
    assert got.id == new_id
    assert got == Event(**{**{f: getattr(e, f) for f in e.__slots__}, "id": new_id})


def test_filters_since_model_event_and_limit(store: Store) -> None:
    _seed(store)
    assert [e.time for e in store.events(since=106.0, order="asc")] == [106.0, 107.0, 108.0]
    assert [e.time for e in store.events(until=102.0, order="asc")] == [100.0, 101.0]
    assert [e.time for e in store.events(model="a", order="asc")] == [100.0, 102.0, 103.0, 106.0]
    assert [e.time for e in store.events(event="load", order="asc")] == [100.0, 101.0, 103.0, 108.0]
    assert [e.time for e in store.events(model="b", event="load", since=101.5)] == [108.0]
    assert [e.time for e in store.events(limit=2)] == [108.0, 107.0]
    assert [e.time for e in store.events(limit=2, order="asc")] == [100.0, 101.0]


def test_ordering_by_whitelisted_columns(store: Store) -> None:
    _seed(store)
    # seconds = 10 - i, so ascending seconds is descending time
    assert [e.seconds for e in store.events(sort_by="seconds", order="asc", limit=3)] == [2.0, 3.0, 4.0]
    by_model = store.events(sort_by="model", order="asc")
    assert [e.model for e in by_model] == sorted(e.model for e in by_model)
    # ties in the sort column break by id in the same direction
    assert [e.time for e in by_model if e.model == "a"] == [100.0, 102.0, 103.0, 106.0]
    with pytest.raises(ValueError, match="cannot sort history by 'time; DROP TABLE events'"):
        store.events(sort_by="time; DROP TABLE events")
    with pytest.raises(ValueError, match="order must be"):
        store.events(order="sideways")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, MAX_EVENTS_LIMIT + 1, True, "10", 2.5])
def test_limit_out_of_bounds_is_refused(store: Store, bad: object) -> None:
    with pytest.raises(ValueError, match=f"from 1 to {MAX_EVENTS_LIMIT}"):
        store.events(limit=bad)  # type: ignore[arg-type]


def test_limit_bounds_inclusive(store: Store) -> None:
    _seed(store)
    assert len(store.events(limit=1)) == 1
    assert len(store.events(limit=MAX_EVENTS_LIMIT)) == 9


@pytest.mark.parametrize(
    "hostile",
    ["x' OR '1'='1", "a'; DROP TABLE events; --", 'a" OR 1=1 --', "%", "_"],
)
def test_injection_looking_filters_are_data(store: Store, hostile: str) -> None:
    _seed(store)
    assert store.events(model=hostile) == []
    store.record_event(Event(time=200.0, event="load", model=hostile))
    (only,) = store.events(model=hostile)
    assert only.model == hostile
    assert len(store.events(limit=100)) == 10  # the table is intact, nothing else matched


def test_event_filter_outside_vocabulary_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="vocabulary"):
        store.events(event="load' OR '1'='1")


def test_unavailable_figures_are_null_and_real_zero_is_zero(store: Store) -> None:
    store.record_event(Event(time=1.0, event="unload", model="m", vram_bytes=None, freed_bytes=0, seconds=None))
    row = store.read(
        lambda c: c.execute(sa.text("SELECT vram_bytes, freed_bytes, seconds, host_bytes FROM events")).one()
    )
    assert tuple(row) == (None, 0, None, None)
    nulls = store.read(lambda c: c.execute(sa.text("SELECT COUNT(*) FROM events WHERE vram_bytes IS NULL")).scalar())
    assert nulls == 1


def test_bad_figures_are_refused_before_writing(store: Store) -> None:
    with pytest.raises(ValueError, match="vram_bytes"):
        Event(time=1.0, event="load", vram_bytes=-1)
    with pytest.raises(TypeError, match="host_bytes"):
        Event(time=1.0, event="load", host_bytes=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        store.record_event(Event(time=1.0, event="load", details={"when": object()}))
    assert store.events() == []


def test_async_history(store: Store) -> None:
    async def go() -> list[Event]:
        await asyncio.gather(*(store.aio.record_event(Event(time=float(i), event="load", model="m")) for i in range(20)))
        return await store.aio.events(model="m", limit=5, order="asc")

    got = asyncio.run(go())
    assert [e.time for e in got] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_unavailable_figures_sort_last_in_either_direction(store: Store) -> None:
    # SQLite alone puts NULL first ascending, PostgreSQL alone first descending; the store puts it last in both
    store.record_event(Event(time=1.0, event="unload", model="m", seconds=None, freed_bytes=None))
    store.record_event(Event(time=2.0, event="unload", model="m", seconds=2.0, freed_bytes=20))
    store.record_event(Event(time=3.0, event="unload", model=None, seconds=1.0, freed_bytes=10))
    assert [e.seconds for e in store.events(sort_by="seconds", order="asc")] == [1.0, 2.0, None]
    assert [e.seconds for e in store.events(sort_by="seconds", order="desc")] == [2.0, 1.0, None]
    assert [e.freed_bytes for e in store.events(sort_by="freed_bytes", order="desc")] == [20, 10, None]
    assert [e.model for e in store.events(sort_by="model", order="asc")] == ["m", "m", None]
    assert [e.model for e in store.events(sort_by="model", order="desc")] == ["m", "m", None]


MIXED_NAMES = ["b", "B", "a", "A", "_x", "é", "Z", "a-2", "a10", "a9"]


def test_model_sort_is_by_code_point_on_every_backend(store: Store) -> None:
    for i, name in enumerate(MIXED_NAMES):
        store.record_event(Event(time=float(i), event="load", model=name))
    # Python's str order is code point order: "A" < "B" < "Z" < "_x" < "a" ... < "é"
    assert [e.model for e in store.events(sort_by="model", order="asc")] == sorted(MIXED_NAMES)
    assert [e.model for e in store.events(sort_by="model", order="desc")] == sorted(MIXED_NAMES, reverse=True)
