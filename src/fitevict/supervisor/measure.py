"""Measuring a seat after its load: the engine's own buffers, process memory, GPU bytes, the engine overhead.

Reading is I/O (the load log, /proc, NVML); deciding what the readings mean is pure and lives in small
functions here (``overhead_seen``, ``with_engine_overhead``, ``host_overhead``, ``footprint_from_json``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from fitevict.engines import traits
from fitevict.host import procmem
from fitevict.host.nvml import read_gpus
from fitevict.pricing.footprint import HOST, ZERO_FORMULA, DeviceFootprint, Footprint, Term
from fitevict.pricing.process import ProcessTerm
from fitevict.supervisor.seat import SeatState
from fitevict.units import format_size


def read_seat(seat: SeatState, engine: Any, nvml: Any, now: float) -> None:
    """Fill ``seat.measured`` (the engine's account of its buffers) and take the reading right after its load: PSS of
    its process tree and NVML per process (``SeatState.take_reading``), kept apart as ``load_mem``/``load_bytes``
    (what the load record stores and the growth rate starts from; the memory sampler's later readings replace the
    live figure). A reading that fails says why; it is never 0."""
    try:
        seat.measured = engine.measured_footprint(seat.log_path.read_text(errors="replace"))
    except (OSError, ValueError) as e:
        seat.measured, seat.measured_note = None, f"unavailable, because the load log could not be parsed: {e}"
    if seat.pid is None:
        return
    mem = procmem.read_tree(seat.pid)
    gpu: dict[str, int | None] = {}
    if seat.config.devices:
        gpus = read_gpus(nvml)
        gpu = {d: n for d, n in gpus.used_by(set(mem.pids) or {seat.pid}).items() if d in seat.config.devices}
    seat.load_reading(now, mem, gpu)


def overhead_seen(seat: SeatState, known: Mapping[str, int] | None = None) -> dict[str, int]:
    """The engine process's own memory per device in this seat at the reading right after its load, beyond the
    buffers its log reports: host, PSS less the buffers and less the parts of the seat's overhead that scale with its
    model (its ``overhead`` beyond the ``known`` calibrated figure), so that what is left is comparable with the
    calibrated part; a GPU, NVML's bytes for the process (its CUDA context is the difference)."""
    if seat.measured is None:
        return {}
    seen: dict[str, int] = {}
    if seat.load_mem is not None and seat.load_mem.host_bytes is not None:
        scaling = max(0, seat.overhead - (known or {}).get(HOST, 0))
        seen[HOST] = seat.load_mem.host_bytes - seat.measured.bytes_on(HOST) - scaling
    for dev, n in seat.load_bytes.items():
        if dev == HOST:
            continue
        if seat.measured.device(dev) is not None:
            seen[dev] = n - seat.measured.bytes_on(dev)
    return seen


def grown_overhead(known: Mapping[str, int], seen: Mapping[str, int]) -> dict[str, int]:
    """A measurement never exceeds overhead + buffers (untouched pages are not resident), so each load gives a
    lower bound: the largest seen is kept. Returns the devices whose figure grew."""
    return {d: n for d, n in seen.items() if n > known.get(d, 0)}


def with_engine_overhead(fp: Footprint, overhead: Mapping[str, int], engine: str = "llama-server",
                         terms: Sequence[ProcessTerm] = ()) -> Footprint:
    """The footprint with the engine process's own memory: on the host, the calibrated part (``overhead[HOST]``)
    and the parts that scale with the model (``terms``, rules) join committed memory, their sum kept as the
    footprint's host ``overhead``; on a GPU where the model has buffers, the calibrated figure is the footprint's
    ``overhead`` for that device.

    Device rows stay the engine's own buffers, term by term.
    """
    fixed = max(overhead.get(HOST, 0), 0)
    host = fixed + sum(t.bytes for t in terms)
    gpus = tuple((d, n) for d, n in overhead.items() if d != HOST and n > 0 and fp.device(d) is not None)
    if host <= 0 and not gpus:
        return fp
    notes = list(fp.notes)
    if fixed > 0:
        notes.append(f"host includes {format_size(fixed)} of {engine} process overhead (measured: peak PSS beyond "
                     "its buffers through a filled context of the calibration model, or more where loads of this "
                     "build here showed more)")
    notes += [f"host includes {format_size(t.bytes)} of {engine} {t.name} ({t.rule})" for t in terms if t.bytes]
    for d, n in gpus:
        notes.append(f"{d} includes {format_size(n)} of {engine} process overhead "
                     f"(measured: NVML process bytes minus logged buffers)")
    return replace(fp, host_committed_bytes=fp.host_committed_bytes + host, notes=tuple(notes),
                   host_source=f"{fp.host_source}+measured" if fixed > 0 else fp.host_source,  # type: ignore[arg-type]
                   overhead=(*gpus, *(((HOST, host),) if host > 0 else ())))


def overhead_label(engine: str, fixed: int, origin: str, own: int | None = None) -> str:
    """What a seat's host ``overhead`` figure is and where it came from. llama-server: its fixed part ``fixed`` is
    ``calibrated`` (a filled peak of the calibration model), ``raised`` (the largest seen by loads here), or, when
    neither happened (``origin`` says why), not counted: the figure is then the rules' alone. A transformers seat's
    (``own``): its own process, measured on this machine's earlier seats, or unavailable until one was."""
    if traits(engine).overhead != "calibrated":
        return (f"measured: this machine's {engine} seats' own process (PSS beyond the price), the largest seen"
                if own else f"unavailable, because no {engine} seat was measured on this machine yet: counted as 0")
    rules = "the rules that scale with the model (tokenizer, work buffer, context)"
    if fixed > 0 and origin == "calibrated":
        return f"measured: the engine process's own, calibrated at a filled peak of the calibration model, with {rules}"
    if fixed > 0 and origin == "raised":
        return ("measured: the engine process's own, the largest seen beyond the logged buffers by loads of this build "
                f"here, with {rules}")
    return f"rule: {rules} only; the process's fixed part is not counted, because {origin}"


def host_overhead(fp: Footprint, known: Mapping[str, int]) -> int:
    """The engine process's host memory a footprint was priced with (``with_engine_overhead``), else the
    calibrated figure ``known`` holds."""
    return dict(fp.overhead).get(HOST, known.get(HOST, 0))


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
                     host.get("source", "engine-reported"), overhead=tuple(d.get("overhead", {}).items()))


def mem_json(m: procmem.ProcessMemory | None) -> dict | None:
    if m is None:
        return None
    return {"committed_bytes": m.committed_bytes, "mapped_bytes": m.mapped_bytes, "rss_bytes": m.rss_bytes,
            "source": m.source, "reason": m.reason, "pids": list(m.pids)}

