"""The seat table: one record per seat, one state, and only the moves a seat's life draws."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fitevict.pricing.footprint import HOST
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.schedule.seats import MOVES, Exit, Seat, SeatMoveError, SeatStatus, SeatTable

S = SeatStatus


def seat(key: str = "m", status: SeatStatus = S.STARTING) -> Seat:
    return Seat(key, LoadConfig(n_ctx=512), key, 0.0, status)


def test_a_seat_lives_starting_loading_ready_draining_stopping_gone() -> None:
    t = SeatTable()
    s = t.place(seat())
    for status in (S.LOADING, S.READY, S.DRAINING, S.READY, S.STOPPING):
        t.move(s, status)
        assert t.get("m") is s and s.status is status
    t.move(s, S.GONE, exit=Exit.STOPPED)
    assert "m" not in t and s.status is S.GONE and s.exit is Exit.STOPPED


@given(st.lists(st.sampled_from(list(SeatStatus)), max_size=12))
def test_only_the_drawn_moves_are_allowed(path: list[SeatStatus]) -> None:
    t = SeatTable()
    s = t.place(seat())
    for status in path:
        before = s.status
        allowed = status in MOVES[before] or (status is before and status is not S.GONE)
        if allowed:
            t.move(s, status, exit=Exit.FAILED if status is S.GONE else None)
            assert s.status is status
        else:
            with pytest.raises(SeatMoveError, match=f"{before} -> {status}"):
                t.move(s, status, exit=Exit.FAILED if status is S.GONE else None)
            assert s.status is before  # a refused move changes nothing
        if s.status is S.GONE:
            assert "m" not in t
            break
        assert t.get("m") is s


def test_gone_and_only_gone_says_how_it_left() -> None:
    t = SeatTable()
    s = t.place(seat())
    with pytest.raises(SeatMoveError, match="how it left"):
        t.move(s, S.GONE)
    with pytest.raises(SeatMoveError, match="how it left"):
        t.move(s, S.LOADING, exit=Exit.CRASHED)
    t.move(s, S.GONE, exit=Exit.CRASHED)
    assert s.exit is Exit.CRASHED


def test_one_seat_per_key_and_a_new_one_starts_or_is_adopted_ready() -> None:
    t = SeatTable()
    t.place(seat())
    with pytest.raises(SeatMoveError, match="still starting"):
        t.place(seat())
    with pytest.raises(SeatMoveError, match="not stopping"):
        t.place(seat("n", S.STOPPING))
    assert t.place(seat("n", S.READY)).status is S.READY  # adopted from an earlier fitevict


class _Process:
    def __init__(self, n: int) -> None:
        self.n = n
        self.outgrowing = False

    def held(self) -> tuple[dict[str, int], str]:
        return {HOST: self.n}, "measured"


def test_the_running_view_and_the_bytes_follow_the_process() -> None:
    t = SeatTable()
    s = t.place(seat())
    s.loaded_bytes, s.loaded_source = {HOST: 10}, "predicted"
    assert dict(t.running()) == {} and s.bytes == {HOST: 10} and s.bytes_source == "predicted"
    p = _Process(25)
    t.attach(s, p)
    assert dict(t.running()) == {"m": p} and s.bytes == {HOST: 25} and s.bytes_source == "measured"
    p.n = 40  # what the planner counts is what the process holds now, not a copy
    assert s.bytes == {HOST: 40} and not s.outgrowing
    p.outgrowing = True  # and whether it outgrew its price
    assert s.outgrowing
    t.detach(s, _Process(1))  # another process: nothing changes
    assert t.running()["m"] is p
    t.detach(s, p)
    assert "m" not in t.running() and s.bytes == {HOST: 10} and "m" in t


def test_the_view_cannot_be_changed_through() -> None:
    t = SeatTable()
    t.place(seat())
    with pytest.raises(TypeError):
        t.view()["x"] = seat("x")  # type: ignore[index]


def test_a_seat_view_reads_every_field_of_the_seat_live_and_sets_none() -> None:
    t = SeatTable()
    s = t.place(seat())
    v = t.view()["m"]
    readable = {f.name for f in dataclasses.fields(Seat)} | {n for n, x in vars(Seat).items() if isinstance(x, property)}
    assert readable <= set(dir(Seat)) and {"key", "status", "in_flight", "loaded_bytes", "bytes", "outgrowing"} <= readable
    for name in readable:
        assert getattr(v, name) == getattr(s, name), name  # every field, read through
        with pytest.raises(AttributeError, match="read-only"):
            setattr(v, name, getattr(s, name))
        with pytest.raises(AttributeError, match="read-only"):
            delattr(v, name)
    t.move(s, S.LOADING)
    s.in_flight = 3
    assert v.status is S.LOADING and v.in_flight == 3  # the record itself, never a copy
    with pytest.raises(AttributeError, match="no such field"):
        v.room(None)  # a seat's methods are the scheduler's
