"""A seat's live figures (``SeatState.take_reading``): ``measured`` is the latest reading with its age, the peak is
over every reading, ``planned`` counts the live figure; a seat outgrowing its price is found on the device where it
is most over; and the overhead's label says what the figure is."""

from __future__ import annotations

from pathlib import Path

from fitevict.host.procmem import ProcessMemory
from fitevict.pricing.footprint import HOST, DeviceFootprint, Footprint, Term
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.schedule.seats import Seat
from fitevict.prices.overhead import overhead_label
from fitevict.supervisor.outgrowth import seat_outgrowth
from fitevict.seat.running import SeatState
from fitevict.units import MiB

PRICE = Footprint((DeviceFootprint(HOST, Term(60 * MiB, "formula"), Term(20 * MiB, "formula")),),
                  host_mapped_bytes=60 * MiB, host_committed_bytes=40 * MiB, host_source="formula")


def _seat() -> SeatState:
    record = Seat("m", LoadConfig(n_ctx=2048, n_parallel=1), "m", 0.0)
    s = SeatState(id="s", seat=record, entry=None, engine="llama-server",  # type: ignore[arg-type]
                  model_path=Path("."), port=1, log_path=Path("."), started_at=0.0, predicted=PRICE,
                  signature="sig", strategy="load")
    s.measured, s.overhead = PRICE, 10 * MiB  # the engine buffers as logged: 100 MiB on the host, + 10 MiB overhead
    return s


def _pss(mib: int) -> ProcessMemory:
    return ProcessMemory((1,), (mib - 60) * MiB, 60 * MiB, mib * MiB, "smaps_rollup")


def test_measured_is_the_latest_reading_and_the_peak_is_over_every_reading() -> None:
    s = _seat()
    s.load_reading(10.0, _pss(70), {})
    s.take_reading(11.0, _pss(95), {})  # the context filled
    s.take_reading(12.0, _pss(85), {})  # and some of it given back
    f = s.figures(HOST, now=12.5)
    assert f["measured_bytes"] == 85 * MiB and f["measured_at"] == 12.0 and f["measured_age_seconds"] == 0.5
    assert "the latest of 3 readings" in f["measured_source"]
    assert f["measured_peak_bytes"] == 95 * MiB  # the load's reading and every sampler reading since
    assert f["planned_bytes"] == 110 * MiB == s.bytes_on(HOST)  # allocated + overhead is larger than 85 MiB read
    s.take_reading(13.0, _pss(130), {})
    assert s.figures(HOST)["planned_bytes"] == 130 * MiB == s.held()[0][HOST]  # the planner counts the live figure
    assert s.load_mem is not None and s.load_mem.host_bytes == 70 * MiB  # what the load record keeps


def test_a_failed_reading_is_unavailable_with_its_reason_never_zero() -> None:
    s = _seat()
    s.load_reading(10.0, _pss(70), {})
    s.take_reading(11.0, ProcessMemory((1,), None, None, None, "unavailable", "the process exited"), {})
    f = s.figures(HOST, now=12.0)
    assert f["measured_bytes"] is None and f["measured_source"] == "unavailable, because the process exited"
    assert f["measured_peak_bytes"] == 70 * MiB and f["planned_bytes"] == 110 * MiB  # back to allocated + overhead


def test_a_seat_outgrows_its_price_beyond_the_bound_with_its_growth_rate() -> None:
    s = _seat()
    s.load_reading(10.0, _pss(70), {})
    s.take_reading(12.0, _pss(100 + 16), {})  # 16 MiB over a 100 MiB price: at the bound
    assert seat_outgrowth(s, 16 * MiB, 12.0) is None
    s.take_reading(14.0, _pss(150), {})
    o = seat_outgrowth(s, 16 * MiB, 14.0)
    assert o is not None and o.device == HOST and o.price == 100 * MiB and o.over == 50 * MiB
    assert o.rate == 80 * MiB / 4.0  # from the load's reading, 4 s before


def test_the_overhead_label_says_what_the_figure_is() -> None:
    # a figure learned from earlier readings is a stored measurement, not a reading of this seat
    assert overhead_label("llama-server", 18 * MiB, "calibrated").startswith(
        "stored-measurement: the engine process's own, calibrated at a filled peak")
    assert "the largest seen" in overhead_label("llama-server", 18 * MiB, "raised")
    never = overhead_label("llama-server", 0, "this engine build was never calibrated on this machine")
    assert never.startswith("rule: ") and never.endswith("because this engine build was never calibrated on this "
                                                          "machine")
    assert overhead_label("transformers", 18 * MiB, "calibrated", None).startswith("unavailable, because no "
                                                                                    "transformers seat")
    assert overhead_label("transformers", 0, "calibrated", 300 * MiB).startswith("stored-measurement: this "
                                                                                 "machine's transformers seats' own")
    assert "counted as 0" not in overhead_label("transformers", 0, "calibrated", None)


def test_a_figure_never_read_is_unavailable_never_a_measured_zero() -> None:
    """A seat on a GPU whose engine overhead was never learned, not read yet, with no overhead known on the host:
    each such figure is None with why, never 0 labelled measured."""
    s = _seat()
    s.overhead, s.overhead_label = None, "unavailable, because no transformers seat was measured on this machine yet"
    host = s.figures(HOST)
    assert host["overhead_bytes"] is None and host["overhead_source"].startswith("unavailable, because")
    assert host["measured_peak_bytes"] is None
    assert host["measured_peak_source"] == "unavailable, because the process was not read yet"
    assert host["planned_bytes"] == 100 * MiB  # the buffers alone: nothing unknown added
    gpu = s.figures("CUDA0")
    assert gpu["overhead_bytes"] is None and gpu["overhead_source"].startswith(
        "unavailable, because no engine overhead was learned for CUDA0")
    s.gpu_overhead = {"CUDA0": 300 * MiB}
    learned = s.figures("CUDA0")
    assert learned["overhead_bytes"] == 300 * MiB and learned["overhead_source"].startswith("stored-measurement:")
    s.load_reading(10.0, _pss(70), {})
    assert s.figures(HOST)["measured_peak_source"].startswith("measured: ")


def test_process_bytes_the_price_knowingly_left_out_count_with_it() -> None:
    s = _seat()
    s.load_reading(10.0, _pss(70), {})
    s.take_reading(12.0, _pss(150), {})  # 50 MiB over a 100 MiB price
    assert seat_outgrowth(s, 16 * MiB, 12.0) is not None
    assert seat_outgrowth(s, 16 * MiB, 12.0, unpriced=40 * MiB) is None  # a process overhead learned after the price


def test_a_loading_seat_counts_at_least_its_price_until_the_reading_after_its_load() -> None:
    s = _seat()
    s.measured = None  # loading: no log read yet
    s.take_reading(1.0, _pss(30), {})  # the sampler read it mid-load: 30 MiB touched so far
    assert s.bytes_on(HOST) == 100 * MiB and s.figures(HOST)["measured_bytes"] == 30 * MiB
    s.measured = PRICE
    s.load_reading(2.0, _pss(70), {})
    assert s.bytes_on(HOST) == 110 * MiB  # allocated + overhead, the larger


def test_the_seat_that_carries_its_binarys_shared_pages_is_planned_with_them_and_says_so() -> None:
    from fitevict.pricing.pages import SharedPages

    s = _seat()
    s.seat.pages = SharedPages("llama-server", 9 * MiB, "measured: test figure", ("llama-server",))
    s.load_reading(10.0, _pss(70), {})
    carrier, other = s.figures(HOST, now=11.0, carried=9 * MiB), s.figures(HOST, now=11.0)
    assert carrier["planned_bytes"] == 119 * MiB == s.held(9 * MiB)[0][HOST]  # allocated + overhead + the pages
    assert carrier["shared_pages_bytes"] == 9 * MiB and "it carries llama-server's" in carrier["shared_pages_source"]
    assert other["planned_bytes"] == 110 * MiB and other["shared_pages_bytes"] == 0
    assert "another seat of llama-server carries" in other["shared_pages_source"]
    s.take_reading(12.0, _pss(125), {})  # a reading above both holds its share of the pages already
    assert s.figures(HOST, carried=9 * MiB)["planned_bytes"] == 125 * MiB
