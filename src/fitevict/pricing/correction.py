"""Error feedback: what earlier loads of the same file measured corrects the prediction at other settings, labelled.

A load whose own signature (file identity, configuration) was measured before is priced by that measurement
(``as_stored``). A load at another context or placement has no such measurement, but the same file's loads show how
far each term's prediction is from the engine's own buffers: ``correction`` takes, per device and term, the median
of measured minus predicted over (predicted, measured) pairs (terms either side reports as unavailable are left
out; a term predicted exactly needs none). ``apply_correction`` adds those deltas to the terms of a new prediction
that come from the same kind of prediction (``source``: the formula's error corrects the formula, never a dry run,
which is the engine's own figure). A corrected term keeps its source and carries the correction apart
(``Term.correction``, labelled "formula+correction"), so predicted, correction and measured are each visible.

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
    """Per (device, term): bytes to add to a prediction (measured minus predicted, the median over ``samples``
    pairs); ``origin`` says which loads they were ("ctx 512, CPU only")."""

    deltas: tuple[tuple[str, str, int], ...]
    samples: int
    origin: str = ""

    def delta(self, device: str, term: str) -> int:
        return next((d for dev, t, d in self.deltas if dev == device and t == term), 0)


def correction(pairs: Sequence[tuple[Footprint, Footprint]], origin: str = "", tolerance: int = 0) -> Correction | None:
    """The correction the (predicted, measured) pairs call for; None without pairs or when every term was predicted
    exactly. A median error within ``tolerance`` bytes (the measurement's own resolution: llama-server's log prints
    each buffer to 0.01 MiB) cannot be told from none, and is not a correction."""
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
    deltas = tuple((dev, t, int(statistics.median(v))) for (dev, t), v in sorted(seen.items())
                   if abs(statistics.median(v)) > tolerance)
    return Correction(deltas, len(pairs), origin) if deltas else None


def apply_correction(fp: Footprint, corr: Correction | None, source: str = "formula") -> Footprint:
    """``fp`` with each of its ``source`` terms that ``corr`` corrects moved by the delta (never below 0), the
    correction carried on the term and the host's committed bytes moved with it; other terms as they are."""
    if corr is None:
        return fp
    notes = list(fp.notes)
    devices = []
    host_delta = mapped_delta = 0
    for d in fp.devices:
        changes: dict[str, Term] = {}
        for t in TERMS:
            delta = corr.delta(d.name, t)
            term = getattr(d, t)
            if not delta or term.bytes is None or term.source != source or term.correction:
                continue
            new = max(term.bytes + delta, 0)
            where = (f"median of measured minus {source} over {corr.samples} stored load(s) of this file"
                     + (f" ({corr.origin})" if corr.origin else ""))
            changes[t] = replace(term, bytes=new, correction=new - term.bytes, correction_from=where)
            notes.append(f"{d.name} {t}: {source} {format_size(term.bytes)} corrected by "
                         f"{'+' if new >= term.bytes else '-'}{format_size(abs(new - term.bytes))} ({where})")
            if d.name == HOST and t == "model" and fp.host_mapped_bytes:
                mapped_delta += new - term.bytes  # mmap'd weights: page cache, not committed memory
            elif d.name == HOST:
                host_delta += new - term.bytes
        devices.append(replace(d, **changes))
    if len(notes) == len(fp.notes):
        return fp
    host_source = fp.host_source if not (host_delta or mapped_delta) else f"{fp.host_source}+correction"
    return replace(fp, devices=tuple(devices), notes=tuple(notes), host_source=host_source,  # type: ignore[arg-type]
                   host_committed_bytes=max(fp.host_committed_bytes + host_delta, 0),
                   host_mapped_bytes=max(fp.host_mapped_bytes + mapped_delta, 0))
