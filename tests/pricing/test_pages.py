"""The attribution rule of an engine binary's shared file pages (``pricing.pages.carriers``): the first seat of a
binary carries them whole, the others nothing, and when the carrier is gone the next oldest carries them."""

from __future__ import annotations

import pytest

from fitevict.pricing.pages import Holder, SharedPages, carriers

MiB = 1024**2
LLAMA = SharedPages("llama-server", 12 * MiB, "measured: test figure", ("llama-server",))
OTHER = SharedPages("other-engine", 5 * MiB, "rule: test figure", ("other",))


def test_the_first_seat_of_a_binary_carries_its_pages_and_the_others_do_not() -> None:
    seats = [Holder("b", LLAMA, since=20.0), Holder("a", LLAMA, since=10.0), Holder("c", LLAMA, since=30.0)]
    assert carriers(seats) == {"a": 12 * MiB, "b": 0, "c": 0}  # placed first: a, whatever the listing order


def test_the_pages_move_to_the_next_oldest_seat_when_the_carrier_stops() -> None:
    seats = [Holder("a", LLAMA, 10.0), Holder("b", LLAMA, 20.0), Holder("c", LLAMA, 30.0)]
    assert carriers(seats)["a"] == 12 * MiB
    after = [s for s in seats if s.key != "a"]  # a is stopping: it holds nothing the planner counts
    assert carriers(after) == {"b": 12 * MiB, "c": 0}
    assert carriers([Holder("c", LLAMA, 30.0)]) == {"c": 12 * MiB}  # the last seat carries them alone


def test_each_binary_carries_its_own_pages_once_and_a_seat_without_pages_carries_none() -> None:
    seats = [Holder("a", LLAMA, 10.0), Holder("x", OTHER, 15.0), Holder("b", LLAMA, 5.0), Holder("t", None, 1.0),
             Holder("y", OTHER, 40.0)]
    got = carriers(seats)
    assert got == {"a": 0, "b": 12 * MiB, "x": 5 * MiB, "y": 0, "t": 0}
    assert sum(got.values()) == LLAMA.bytes + OTHER.bytes  # once per binary, whatever the number of seats


def test_a_tie_on_placement_time_is_broken_by_the_key_so_one_seat_carries() -> None:
    got = carriers([Holder("b", LLAMA, 10.0), Holder("a", LLAMA, 10.0)])
    assert got == {"a": 12 * MiB, "b": 0}


def test_shared_pages_round_trip_and_name_their_files() -> None:
    assert SharedPages.from_json(LLAMA.to_json()) == LLAMA
    assert SharedPages.from_json(None) is None
    assert LLAMA.maps("/root/.cache/x/bin/llama-server") and not LLAMA.maps("/usr/lib/libc.so.6")
    with pytest.raises(ValueError, match="negative"):
        SharedPages("g", -1, "rule")
