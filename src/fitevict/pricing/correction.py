"""Error feedback: what earlier loads of the same signature measured, applied to the next prediction, labelled.

A signature is (file identity, configuration); its stored pairs are (predicted, measured) footprints from
earlier loads. ``correction`` takes, per device and term, the median of measured minus predicted over the pairs
(terms either side reports as unavailable are left out); ``apply_correction`` adds those deltas to a new
prediction's terms and labels each corrected term "stored-measurement", noting by how much. A term predicted
exactly needs no correction and keeps its own label.

Pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from fitevict.pricing.footprint import HOST, Footprint, Term
from fitevict.units import format_size

TERMS = ("model", "context", "compute", "output")


@dataclass(frozen=True, slots=True)
class Correction:
    """Per (device, term): bytes to add to a prediction (measured minus predicted, the median over ``samples``)."""

    deltas: tuple[tuple[str, str, int], ...]
    samples: int

    def delta(self, device: str, term: str) -> int:
        return next((d for dev, t, d in self.deltas if dev == device and t == term), 0)


def correction(pairs: Sequence[tuple[Footprint, Footprint]]) -> Correction | None:
    """The correction the stored (predicted, measured) pairs of one signature call for; None without pairs or when
    every term was predicted exactly."""
    seen: dict[tuple[str, str], list[int]] = {}
    for predicted, measured in pairs:
        for m in measured.devices:
            p = predicted.device(m.name)
            if p is None:
                continue
            for t in TERMS:
                pt, mt = getattr(p, t), getattr(m, t)
                if pt.bytes is not None and mt.bytes is not None:
                    seen.setdefault((m.name, t), []).append(mt.bytes - pt.bytes)
    deltas = tuple((dev, t, int(statistics.median(v))) for (dev, t), v in sorted(seen.items()) if statistics.median(v))
    return Correction(deltas, len(pairs)) if deltas else None


def apply_correction(fp: Footprint, corr: Correction | None) -> Footprint:
    """``fp`` with each corrected term moved by its delta (never below 0) and labelled "stored-measurement"."""
    if corr is None:
        return fp
    notes = list(fp.notes)
    devices = []
    host_delta = 0
    for d in fp.devices:
        changes: dict[str, Term] = {}
        for t in TERMS:
            delta = corr.delta(d.name, t)
            term = getattr(d, t)
            if delta and term.bytes is not None:
                new = max(term.bytes + delta, 0)
                changes[t] = Term(new, "stored-measurement")
                notes.append(f"{d.name} {t}: {term.source} {format_size(term.bytes)} corrected by "
                             f"{'+' if delta > 0 else '-'}{format_size(abs(delta))} (median of {corr.samples} "
                             f"stored measurements of this signature)")
                if d.name == HOST:
                    host_delta += new - term.bytes
        devices.append(replace(d, **changes))
    return replace(fp, devices=tuple(devices), notes=tuple(notes),
                   host_committed_bytes=max(fp.host_committed_bytes + host_delta, 0))
