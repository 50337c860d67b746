"""The Footprint contract: what a model costs, per device, term by term, each with its source.

Terms are named as llama.cpp's own memory breakdown names them (model / context / compute /
output buffers), so a prediction can be checked line by line against the engine's log.

Pure data. Frozen. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from fitevict.pricing.pages import SharedPages

# "engine-reported": what the engine says it allocated (its load log, its allocator trace); "measured": a reading of
# the process from outside (PSS, RSS, NVML). Stored rows from before the split say "measured" for both.
Source = Literal["engine-reported", "measured", "stored-measurement", "dry-run", "formula", "declared", "file-size",
                 "unavailable"]
SOURCES: tuple[str, ...] = ("engine-reported", "measured", "stored-measurement", "dry-run", "formula", "declared",
                            "file-size", "unavailable")

READ = ("engine-reported", "measured")  # figures read from a load (the engine's account, or the process's)
HOST = "CPU"  # llama.cpp's name for host memory; also the planner's name for the host-RAM budget


@dataclass(frozen=True, slots=True)
class Term:
    """One priced quantity. ``bytes`` is None only when ``source == "unavailable"``; ``reason`` says why.

    ``correction`` is what was added to the figure its ``source`` gave (measured minus predicted on earlier loads
    of the same file, see ``pricing.correction``); ``correction_from`` says which. ``label`` shows both."""

    bytes: int | None
    source: Source
    reason: str = ""
    correction: int = 0
    correction_from: str = ""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"Term source {self.source!r} is not one of {SOURCES}")
        if self.bytes is None and self.source != "unavailable":
            raise ValueError("a Term without bytes must have source 'unavailable' and a reason")
        if self.source == "unavailable" and not self.reason:
            raise ValueError("an unavailable Term must say why (reason)")
        if self.bytes is not None and self.bytes < 0:
            raise ValueError(f"Term bytes must be >= 0, got {self.bytes}")
        if self.correction and (self.bytes is None or not self.correction_from):
            raise ValueError("a corrected Term needs bytes and must say where its correction came from")

    @property
    def label(self) -> str:
        """The source, with "+correction" when a correction moved the figure ("formula+correction")."""
        return f"{self.source}+correction" if self.correction else self.source

    @staticmethod
    def unavailable(reason: str) -> "Term":
        return Term(None, "unavailable", reason)

    @property
    def value(self) -> int:
        """Bytes, with an unavailable term counted as 0 only where a caller explicitly sums."""
        return self.bytes or 0

    def to_json(self) -> dict:
        d: dict = {"bytes": self.bytes, "source": self.label}
        if self.reason:
            d["reason"] = self.reason
        if self.correction:
            d["correction"] = {"bytes": self.correction, "from": self.correction_from}
        return d


ZERO_FORMULA = Term(0, "formula")


@dataclass(frozen=True, slots=True)
class DeviceFootprint:
    """Bytes one device holds for one model: llama.cpp's model / context / compute / output buffers."""

    name: str  # "CPU", "CUDA0", ...
    model: Term = ZERO_FORMULA
    context: Term = ZERO_FORMULA
    compute: Term = ZERO_FORMULA
    output: Term = ZERO_FORMULA
    adapters: Term = ZERO_FORMULA  # LoRA buffers (llama.cpp's "LoRA buffer size"), apart from the model's own

    @property
    def total_bytes(self) -> int:
        return self.model.value + self.context.value + self.compute.value + self.output.value + self.adapters.value

    @property
    def complete(self) -> bool:
        return all(t.bytes is not None for _, t in self.terms())

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "model_bytes": self.model.bytes,
            "context_bytes": self.context.bytes,
            "compute_bytes": self.compute.bytes,
            "output_bytes": self.output.bytes,
            **({"adapter_bytes": self.adapters.bytes} if self.adapters != ZERO_FORMULA else {}),
            "total_bytes": self.total_bytes,
            "sources": {k: t.label for k, t in self.terms()},
            **(
                {"corrections": {k: {"bytes": t.correction, "predicted_bytes": t.value - t.correction,
                                     "from": t.correction_from} for k, t in self.terms() if t.correction}}
                if any(t.correction for _, t in self.terms())
                else {}
            ),
            **(
                {"unavailable": {k: t.reason for k, t in self.terms() if t.source == "unavailable"}}
                if not self.complete
                else {}
            ),
        }

    def terms(self) -> tuple[tuple[str, Term], ...]:
        """(name, term) for each term: model, context, compute, output, and adapters when there are any."""
        terms = (("model", self.model), ("context", self.context), ("compute", self.compute), ("output", self.output))
        return (*terms, ("adapters", self.adapters)) if self.adapters != ZERO_FORMULA else terms


@dataclass(frozen=True, slots=True)
class Footprint:
    """A model's whole cost under one configuration.

    ``devices`` lists every device with a buffer ("CPU" is host memory). ``host_mapped_bytes`` is the
    file-backed (page-cache, reclaimable) part of host memory, ``host_committed_bytes`` the anonymous
    + shmem part. Their sum is what the host budget must hold: mapped weights count against RAM,
    because weights that page out make inference thrash.
    """

    devices: tuple[DeviceFootprint, ...]
    host_mapped_bytes: int = 0
    host_committed_bytes: int = 0
    host_source: Source = "formula"
    notes: tuple[str, ...] = field(default=())
    # Per GPU: the engine process's own memory there beyond its buffers (the CUDA context), measured; counted
    # on a device only where the model has buffers. Host overhead is part of host_committed_bytes.
    overhead: tuple[tuple[str, int], ...] = field(default=())
    # Per device: what seats of this file and configuration were seen to need beyond their price on this machine
    # (``pricing.grown``, learned from an outgrew event; ``grown_from`` says which): on the host part of
    # host_committed_bytes, on a GPU counted by ``bytes_on``.
    grown: tuple[tuple[str, int], ...] = field(default=())
    grown_from: str = ""
    # The engine binary's own file pages (``pricing.pages``): left out of the host figure, because seats of one
    # binary share them; the planner counts them once, on the seat of the binary that carries them
    pages: SharedPages | None = None

    def device(self, name: str) -> DeviceFootprint | None:
        for d in self.devices:
            if d.name == name:
                return d
        return None

    def bytes_on(self, name: str) -> int:
        """Bytes the model needs on a budget device. For the host ("CPU") this is mapped + committed."""
        if name == HOST:
            return self.host_mapped_bytes + self.host_committed_bytes
        d = self.device(name)
        return d.total_bytes + dict(self.overhead).get(name, 0) + dict(self.grown).get(name, 0) if d else 0

    @property
    def whole_bytes(self) -> int:
        """The whole price a seat is planned at: the host's (mapped + committed) and each GPU's ``bytes_on``
        (buffers, process overhead and what an outgrowth taught). ``total_bytes`` is the engine's buffers alone."""
        return self.bytes_on(HOST) + sum(self.bytes_on(g) for g in self.gpu_names)

    @property
    def gpu_names(self) -> tuple[str, ...]:
        from fitevict.pricing.hostbufs import is_host_buffer

        return tuple(d.name for d in self.devices if d.name != HOST and not is_host_buffer(d.name))

    @property
    def total_bytes(self) -> int:
        return sum(d.total_bytes for d in self.devices)

    def to_json(self) -> dict:
        return {
            "devices": [d.to_json() for d in self.devices],
            "host": {
                "mapped_bytes": self.host_mapped_bytes,
                "committed_bytes": self.host_committed_bytes,
                "source": self.host_source,
            },
            "total_bytes": self.total_bytes,
            **({"overhead": dict(self.overhead)} if self.overhead else {}),
            **({"grown": dict(self.grown), "grown_from": self.grown_from} if self.grown else {}),
            **({"pages": self.pages.to_json()} if self.pages is not None else {}),
            **({"notes": list(self.notes)} if self.notes else {}),
        }


def as_stored(fp: Footprint) -> Footprint:
    """A stored footprint reused as the prediction for a later load of the same signature: each "engine-reported"
    or "measured" term (and host figure) becomes "stored-measurement"; other sources stay as they are."""

    def term(t: Term) -> Term:
        return replace(t, source="stored-measurement") if t.source in READ else t

    devices = tuple(replace(d, model=term(d.model), context=term(d.context), compute=term(d.compute),
                            output=term(d.output)) for d in fp.devices)
    host = "+".join("stored-measurement" if p in READ else p for p in fp.host_source.split("+"))
    return replace(fp, devices=devices, host_source=host)  # type: ignore[arg-type]


def footprint_from_json(d: dict) -> Footprint:
    """Rebuild a Footprint from ``Footprint.to_json()`` (used for stored measurements). A label missing from the JSON
    is "engine-reported" (the engine's buffers); rows stored before that label keep their "measured"."""
    devs = []
    for dv in d.get("devices", []):
        src = dv.get("sources", {})
        corrections = dv.get("corrections", {})

        def term(name: str) -> Term:
            b = dv.get(f"{name}_bytes")
            s = str(src.get(name, "engine-reported")).removesuffix("+correction")
            c = corrections.get(name) or {}
            if b is None:
                return Term.unavailable(dv.get("unavailable", {}).get(name, "not recorded"))
            return Term(b, s, correction=int(c.get("bytes", 0)), correction_from=str(c.get("from", "")))  # type: ignore[arg-type]

        adapters = (Term(dv["adapter_bytes"], src.get("adapters", "engine-reported")) if "adapter_bytes" in dv
                    else ZERO_FORMULA)
        devs.append(DeviceFootprint(dv["name"], term("model"), term("context"), term("compute"), term("output"),
                                    adapters))
    host = d.get("host", {})
    return Footprint(tuple(devs), host.get("mapped_bytes", 0), host.get("committed_bytes", 0),
                     host.get("source", "engine-reported"), overhead=tuple(d.get("overhead", {}).items()),
                     pages=SharedPages.from_json(d.get("pages")))
