"""An engine process's own memory in a price: the calibrated part and the rules that scale with the model join the
price's host figure (``with_engine_overhead``), what a seat's figure is labelled (``overhead_label``), and what
loads teach of it (``grown_overhead``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from fitevict.engines import traits
from fitevict.pricing.footprint import HOST, Footprint
from fitevict.pricing.pages import SharedPages
from fitevict.pricing.process import ProcessTerm
from fitevict.units import format_size


def grown_overhead(known: Mapping[str, int], seen: Mapping[str, int]) -> dict[str, int]:
    """A measurement never exceeds overhead + buffers (untouched pages are not resident), so each load gives a
    lower bound: the largest seen is kept. Returns the devices whose figure grew."""
    return {d: n for d, n in seen.items() if n > known.get(d, 0)}


def with_engine_overhead(fp: Footprint, overhead: Mapping[str, int], engine: str = "llama-server",
                         terms: Sequence[ProcessTerm] = (), pages: SharedPages | None = None) -> Footprint:
    """The footprint with the engine process's own memory: on the host, the calibrated part (``overhead[HOST]``)
    and the parts that scale with the model (``terms``, rules) join committed memory, their sum kept as the
    footprint's host ``overhead``; on a GPU where the model has buffers, the calibrated figure is the footprint's
    ``overhead`` for that device.

    Device rows stay the engine's own buffers, term by term; a device's overhead already in ``fp`` (an RPC device's
    rpc-server parts, ``pricing/rpcserver``) is kept unless set here. ``pages``, the engine binary's own file pages,
    go with the footprint apart from its host figure (``Footprint.pages``): seats of one binary share them, and the
    planner counts them once (``pricing.pages``).
    """
    fixed = max(overhead.get(HOST, 0), 0)
    host = fixed + sum(t.bytes for t in terms)
    gpus = tuple((d, n) for d, n in overhead.items() if d != HOST and n > 0 and fp.device(d) is not None)
    if pages is not None:
        fp = replace(fp, pages=pages, notes=(*fp.notes, f"{engine}'s own file pages, {format_size(pages.bytes)} "
                                                        f"({pages.source}), counted once by the seat of the binary "
                                                        "that carries them, not in the host figure"))
    if host <= 0 and not gpus:
        return fp
    notes = list(fp.notes)
    if fixed > 0:
        notes.append(f"host includes {format_size(fixed)} of {engine} process overhead (measured: peak PSS beyond "
                     "its buffers and its own file pages through a filled context of the calibration model, or "
                     "more where loads of this build here showed more)")
    notes += [f"host includes {format_size(t.bytes)} of {engine} {t.name} ({t.rule})" for t in terms if t.bytes]
    for d, n in gpus:
        notes.append(f"{d} includes {format_size(n)} of {engine} process overhead "
                     f"(measured: NVML process bytes minus logged buffers)")
    kept = tuple((d, n) for d, n in fp.overhead if d != HOST and d not in dict(gpus))  # an rpc-server's parts
    return replace(fp, host_committed_bytes=fp.host_committed_bytes + host, notes=tuple(notes),
                   host_source=f"{fp.host_source}+measured" if fixed > 0 else fp.host_source,  # type: ignore[arg-type]
                   overhead=(*kept, *gpus, *(((HOST, host),) if host > 0 else ())))


def overhead_label(engine: str, fixed: int, origin: str, own: int | None = None) -> str:
    """What a seat's host ``overhead`` figure is and where it came from. llama-server: its fixed part ``fixed`` is
    ``calibrated`` (a filled peak of the calibration model), ``raised`` (the largest seen by loads here), or, when
    neither happened (``origin`` says why), not counted: the figure is then the rules' alone. A transformers seat's
    (``own``): its own process, measured on this machine's earlier seats, or unavailable until one was."""
    if traits(engine).overhead != "calibrated":
        return (f"stored-measurement: this machine's {engine} seats' own process (PSS beyond the price), the largest "
                f"seen ({origin})" if own else f"unavailable, because no {engine} seat was measured on this machine "
                "with this torch yet")
    rules = "the rules that scale with the model (tokenizer, work buffer, context)"
    if fixed > 0 and origin == "calibrated":
        return (f"stored-measurement: the engine process's own, calibrated at a filled peak of the calibration model, "
                f"with {rules}")
    if fixed > 0 and origin == "raised":
        return ("stored-measurement: the engine process's own, the largest seen beyond the logged buffers by loads of "
                f"this build here, with {rules}")
    return f"rule: {rules} only; the process's fixed part is not counted, because {origin}"


def host_overhead(fp: Footprint, known: Mapping[str, int]) -> int:
    """The engine process's host memory a footprint was priced with (``with_engine_overhead``), else the
    calibrated figure ``known`` holds."""
    return dict(fp.overhead).get(HOST, known.get(HOST, 0))
