"""What a finished load teaches (``seat.learning.Learning``), over a real price book and a real SQLite store, with
the real llama-server engine reading the seat's log: an accepted measurement is stored under the seat's signature
and the book prices again; one the guard rejects (under the floor, or a collapse against the last one stored) is
not stored and the book is left as it was; a load that showed more process overhead than the book knew raises it,
in the book and in the store, and one that showed less leaves it; a repack crash is kept with its file."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from fitevict.engines import engine_class
from fitevict.host.procmem import ProcessMemory
from fitevict.pricing.footprint import HOST, DeviceFootprint, Footprint, Term
from fitevict.prices.book import PriceBook
from fitevict.prices.learned import overhead_key
from fitevict.seat.crash import RepackCrash
from fitevict.seat.learning import Learned, Learning
from fitevict.store import Store
from fitevict.store.records import Measurement
from fitevict.units import KiB, MiB

from . import fakeparts

CLOCK = 123.0
KNOWN = 40 * MiB  # the book's calibrated host overhead


def measured(model: int, context: int) -> Footprint:
    """What the engine's log reported of the seat's buffers."""
    return Footprint((DeviceFootprint(HOST, Term(model, "measured"), Term(context, "measured")),),
                     host_mapped_bytes=model, host_committed_bytes=context, host_source="measured")


@pytest.fixture
def parts(tmp_path: Path):
    store = Store.open(f"sqlite:///{tmp_path / 'fitevict.db'}")
    binary = fakeparts.engine_binary(tmp_path)
    book = PriceBook(store, binary.parent, "max-ram")
    book.engine_overhead[HOST] = KNOWN
    book.overhead_origin = "calibrated"
    processes = SimpleNamespace(engine_for=lambda entry: engine_class("llama-server").for_binary(binary),
                                engine_binary=binary)
    learning = Learning(book, store, processes, lambda: CLOCK)  # type: ignore[arg-type]
    yield SimpleNamespace(store=store, book=book, binary=binary, learning=learning)
    store.close()


def _seat(tmp_path: Path, fp: Footprint | None, *, pss: int | None = None, port: int = 1):
    """A loaded seat whose model file holds 50 MiB, its log's buffers ``fp`` and its reading after the load."""
    seat = fakeparts.seat(tmp_path, port=port)
    with open(seat.model_path, "wb") as f:
        f.truncate(50 * MiB)
    seat.measured, seat.overhead = fp, KNOWN
    if pss is not None:
        seat.load_reading(1.0, ProcessMemory((os.getpid(),), pss, 0, pss, "smaps_rollup"), {})
    return seat


def _learn(parts, seat) -> Learned:
    return asyncio.run(parts.learning.learn(seat))


def test_an_accepted_measurement_is_stored_under_its_signature_and_the_book_prices_again(tmp_path: Path,
                                                                                        parts) -> None:
    fp = measured(30 * MiB, 10 * MiB)
    version = parts.book.version
    got = _learn(parts, _seat(tmp_path, fp))
    assert got.verdict.accepted
    stored = parts.store.last_measurement("sig")
    assert stored is not None and stored.total_bytes == fp.total_bytes == 40 * MiB
    assert (stored.model, stored.engine, stored.measured_at) == ("m", "llama-server", CLOCK)
    assert parts.book.version > version  # the sheets are read again with it
    assert got.details["measurement_stored"] is True and got.details["machine"] == parts.book.machine
    # the price (fakeparts.PRICE: 80 MiB of buffers) against what the log reported
    assert got.details["prediction_error"] == pytest.approx((80 - 40) / 40)
    assert got.details["file"]["size"] == 50 * MiB  # a learnable load: its file's price is corrected


def test_a_load_with_a_projector_is_stored_and_priced_again_but_corrects_no_file_price(tmp_path: Path,
                                                                                      parts) -> None:
    seat = _seat(tmp_path, measured(30 * MiB, 10 * MiB))
    seat.entry = SimpleNamespace(key="m", engine="llama-server", mmproj=str(tmp_path / "mmproj.gguf"))
    version = parts.book.version
    got = _learn(parts, seat)
    assert got.verdict.accepted and parts.store.last_measurement("sig").total_bytes == 40 * MiB
    assert parts.book.version > version  # the stored measurement alone makes the book price again
    assert "file" not in got.details  # its buffers are not the model file's alone


def test_a_measurement_under_the_floor_is_rejected_and_not_stored(tmp_path: Path, parts) -> None:
    version = parts.book.version
    got = _learn(parts, _seat(tmp_path, measured(300 * KiB, 100 * KiB)))
    assert not got.verdict.accepted and got.verdict.check == "implausible"
    assert got.details["guard"]["accepted"] is False and "measurement_stored" not in got.details
    assert parts.store.last_measurement("sig") is None and parts.book.version == version


def test_a_collapse_against_the_last_stored_measurement_is_rejected(tmp_path: Path, parts) -> None:
    before = Measurement(signature="sig", model="m", engine="llama-server", measured_at=1.0,
                         footprint=measured(80 * MiB, 20 * MiB).to_json(), host_committed_bytes=None,
                         host_mapped_bytes=None, total_bytes=100 * MiB)
    parts.store.put_measurement(before)
    got = _learn(parts, _seat(tmp_path, measured(30 * MiB, 10 * MiB)))  # 40 MiB: under half of the last
    assert not got.verdict.accepted and got.verdict.check == "collapse"
    assert got.details["previous_measured_bytes"] == 100 * MiB
    assert parts.store.last_measurement("sig").total_bytes == 100 * MiB  # the last one stays


def test_a_load_that_showed_more_overhead_raises_it_in_the_book_and_the_store(tmp_path: Path, parts) -> None:
    fp = measured(30 * MiB, 10 * MiB)
    _learn(parts, _seat(tmp_path, fp, pss=fp.total_bytes + 30 * MiB))  # less than known: nothing learned
    assert parts.book.engine_overhead[HOST] == KNOWN and parts.book.overhead_origin == "calibrated"
    assert parts.store.compute_get(overhead_key(parts.binary, parts.book.cpu)) is None
    _learn(parts, _seat(tmp_path, fp, pss=fp.total_bytes + 60 * MiB, port=2))
    assert parts.book.engine_overhead[HOST] == 60 * MiB and parts.book.overhead_origin == "raised"
    assert parts.store.compute_get(overhead_key(parts.binary, parts.book.cpu))[HOST] == 60 * MiB


def test_only_a_seat_of_a_calibrated_engine_teaches_the_builds_overhead(tmp_path: Path, parts) -> None:
    fp = measured(30 * MiB, 10 * MiB)
    seat = _seat(tmp_path, fp, pss=fp.total_bytes + 90 * MiB)
    seat.engine = "transformers"  # its process is its own ("own-process"), not the llama-server build's
    _learn(parts, seat)
    assert parts.book.engine_overhead[HOST] == KNOWN and parts.book.overhead_origin == "calibrated"
    assert parts.store.compute_get(overhead_key(parts.binary, parts.book.cpu)) is None


def test_a_repack_crash_is_kept_with_its_file_and_machine(tmp_path: Path, parts) -> None:
    seat = _seat(tmp_path, measured(30 * MiB, 10 * MiB))
    seat.repack_crash = RepackCrash("SIGSEGV", 1.5, "/tmp/first.log", 80 * MiB, 60 * MiB, "CPU_REPACK")
    got = _learn(parts, seat)
    crash = got.details["repack_crash"]
    assert crash["signal"] == "SIGSEGV" and crash["machine"] == parts.book.machine
    assert crash["file"]["path"] == str(seat.model_path) and crash["file"]["size"] == 50 * MiB
