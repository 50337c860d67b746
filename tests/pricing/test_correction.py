"""Stored (predicted, measured) pairs of one signature correct the next prediction, labelled as such."""

from __future__ import annotations

from fitevict.pricing.correction import apply_correction, correction
from fitevict.pricing.footprint import DeviceFootprint, Footprint, Term
from fitevict.units import KiB, MiB


def _fp(compute: int, source: str = "formula", context: Term | None = None) -> Footprint:
    host = DeviceFootprint("CPU", Term(10 * MiB, "formula"), context or Term(2 * MiB, "formula"),
                           Term(compute, source), Term(MiB, "formula"))  # type: ignore[arg-type]
    return Footprint((host,), host_mapped_bytes=10 * MiB, host_committed_bytes=3 * MiB + compute)


def test_the_median_error_per_term_corrects_the_next_prediction() -> None:
    predicted = _fp(4 * MiB)
    pairs = [(predicted, _fp(4 * MiB - d, "measured")) for d in (3 * KiB, 5 * KiB, 100 * KiB)]
    corr = correction(pairs)
    assert corr is not None and corr.samples == 3
    assert corr.deltas == (("CPU", "compute", -5 * KiB),)  # the median, so one outlier does not move it
    fixed = apply_correction(predicted, corr)
    host = fixed.device("CPU")
    assert host is not None and host.compute == Term(4 * MiB - 5 * KiB, "stored-measurement")
    assert host.model.source == "formula" and host.context.source == "formula"  # exact terms keep their label
    assert fixed.host_committed_bytes == predicted.host_committed_bytes - 5 * KiB
    assert any("corrected by -5.00 KiB" in n and "3 stored measurements" in n for n in fixed.notes), fixed.notes


def test_exact_predictions_and_unavailable_terms_need_no_correction() -> None:
    exact = _fp(4 * MiB)
    assert correction([(exact, _fp(4 * MiB, "measured"))]) is None
    assert correction([]) is None
    blind = _fp(4 * MiB, context=Term.unavailable("no rules"))
    assert correction([(blind, _fp(4 * MiB, "measured"))]) is None
    assert apply_correction(exact, None) is exact
