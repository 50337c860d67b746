"""What a seat was seen to need beyond its price: learned from its ``outgrew`` event, added to the next price of the
same file and configuration on the same machine.

When a seat's reading exceeds its price by more than ``budget.outgrow_margin`` (``supervisor.outgrowth``), its peak
reading per device (PSS of its process tree on the host, NVML on a GPU) less the price it was planned at (without
what an earlier outgrowth added) is what the price left out. ``Grown`` holds it per device with the event's time;
``with_grown`` adds it to a price, labelled. The price book keeps the newest per file identity and configuration,
learned only from events of its own machine (engine build @ CPU), and reads it back from the history at start.

Pure.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, replace

from fitevict.pricing.footprint import HOST, Footprint
from fitevict.units import format_size

SOURCE = ("learned from an outgrowth: the seat's peak reading (host: PSS of its process tree; GPU: NVML) less the "
          "price it was planned at, per device, from its outgrew event on this machine")


@dataclass(frozen=True, slots=True)
class Grown:
    """Bytes per device that a seat of one file and configuration needed beyond its price, seen at ``at`` (the
    outgrew event's time, unix seconds)."""

    extra: tuple[tuple[str, int], ...]
    at: float

    def label(self) -> str:
        when = dt.datetime.fromtimestamp(self.at, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"learned from the outgrowth at {when}: " + ", ".join(
            f"{d} +{format_size(n)}" for d, n in self.extra) + " (its peak reading over its price)"

    def to_json(self) -> dict:
        return {"extra_bytes": dict(self.extra), "at": self.at, "source": SOURCE}

    @classmethod
    def from_json(cls, d: Mapping, at: float) -> Grown | None:
        extra = tuple((str(k), int(v)) for k, v in dict(d.get("extra_bytes") or {}).items() if int(v) > 0)
        return cls(extra, float(at)) if extra else None


def grown(peak: Mapping[str, int | None], price: Mapping[str, int], at: float) -> Grown | None:
    """What the peaks ``peak`` show beyond ``price`` (per device, both without any earlier lesson); None when no
    device's peak exceeded its price."""
    extra = tuple((d, n - price[d]) for d, n in sorted(peak.items()) if n is not None and d in price and n > price[d])
    return Grown(extra, at) if extra else None


def with_grown(fp: Footprint, g: Grown | None) -> Footprint:
    """``fp`` with what ``g`` learned added (host: to committed memory; a GPU: counted by ``bytes_on``), labelled."""
    if g is None:
        return fp
    host = dict(g.extra).get(HOST, 0)
    return replace(fp, host_committed_bytes=fp.host_committed_bytes + host, grown=g.extra, grown_from=g.label(),
                   notes=(*fp.notes, g.label()),
                   host_source=f"{fp.host_source}+outgrowth" if host else fp.host_source)  # type: ignore[arg-type]


def without_grown(fp: Footprint, device: str) -> int:
    """``fp``'s bytes on ``device`` without what an outgrowth added: the price a new lesson is measured against."""
    return fp.bytes_on(device) - dict(fp.grown).get(device, 0)


__all__ = ["SOURCE", "Grown", "grown", "with_grown", "without_grown"]
