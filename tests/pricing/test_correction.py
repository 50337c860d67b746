"""Measured-minus-predicted per term, from a file's earlier loads, corrects the same kind of prediction, labelled."""

from __future__ import annotations

from fitevict.pricing.correction import apply_correction, correction
from fitevict.pricing.footprint import DeviceFootprint, Footprint, Term
from fitevict.pricing.footprint import footprint_from_json
from fitevict.units import KiB, MiB


def _fp(compute: int, source: str = "formula", context: Term | None = None) -> Footprint:
    host = DeviceFootprint("CPU", Term(10 * MiB, "formula"), context or Term(2 * MiB, "formula"),
                           Term(compute, source), Term(MiB, "formula"))  # type: ignore[arg-type]
    return Footprint((host,), host_mapped_bytes=10 * MiB, host_committed_bytes=3 * MiB + compute)


def test_the_median_error_per_term_corrects_the_next_prediction() -> None:
    predicted = _fp(4 * MiB)
    pairs = [(predicted, _fp(4 * MiB - d, "measured")) for d in (3 * KiB, 5 * KiB, 100 * KiB)]
    corr = correction(pairs, "ctx 512, CPU only")
    assert corr is not None and corr.samples == 3
    assert corr.deltas == (("CPU", "compute", -5 * KiB),)  # the median, so one outlier does not move it
    fixed = apply_correction(_fp(6 * MiB), corr)
    host = fixed.device("CPU")
    assert host is not None and host.compute.bytes == 6 * MiB - 5 * KiB and host.compute.source == "formula"
    assert host.compute.correction == -5 * KiB and host.compute.label == "formula+correction"
    assert "3 stored load(s)" in host.compute.correction_from and "ctx 512, CPU only" in host.compute.correction_from
    assert host.model.label == "formula" and host.context.label == "formula"  # exact terms keep their label
    assert fixed.host_committed_bytes == _fp(6 * MiB).host_committed_bytes - 5 * KiB
    assert fixed.host_source == "formula+correction"
    assert any("corrected by -5.00 KiB" in n for n in fixed.notes), fixed.notes
    # predicted, correction and measured apart in the JSON, and read back the same
    dev = fixed.to_json()["devices"][0]
    assert dev["sources"]["compute"] == "formula+correction"
    assert dev["corrections"]["compute"]["bytes"] == -5 * KiB
    assert dev["corrections"]["compute"]["predicted_bytes"] == 6 * MiB
    assert footprint_from_json(fixed.to_json()).device("CPU").compute == host.compute  # type: ignore[union-attr]


def test_a_dry_run_term_is_not_corrected_by_the_formulas_error() -> None:
    corr = correction([(_fp(4 * MiB), _fp(3 * MiB, "measured"))])
    assert corr is not None
    dry = _fp(5 * MiB, "dry-run")
    assert apply_correction(dry, corr) is dry  # the engine's own figure stays as it is


def test_exact_predictions_and_unavailable_terms_need_no_correction() -> None:
    exact = _fp(4 * MiB)
    assert correction([(exact, _fp(4 * MiB, "measured"))]) is None
    assert correction([]) is None
    blind = _fp(4 * MiB, context=Term.unavailable("no rules"))
    assert correction([(blind, _fp(4 * MiB, "measured"))]) is None
    assert apply_correction(exact, None) is exact


def test_an_error_within_the_logs_resolution_is_no_correction() -> None:
    """llama-server prints each buffer to 0.01 MiB: an exact formula term read back from the log differs by the
    rounding only, which corrects nothing."""
    from fitevict.pricing.logparse import PRECISION_BYTES

    rounded = _fp(4 * MiB - PRECISION_BYTES, "measured")
    assert correction([(_fp(4 * MiB), rounded)], tolerance=PRECISION_BYTES) is None
    assert correction([(_fp(4 * MiB), rounded)]) is not None
