"""The multimodal projector (``--mmproj``): its weights from the file, its compute from the engine's own estimate.

llama.cpp 0c1e570 (tools/mtmd/clip.cpp) reads the projector's tensors into one buffer of the projector's backend
(``ggml_backend_alloc_ctx_tensors_from_buft``: each tensor padded to the buffer's alignment, 32 bytes on the CPU):
committed memory, never mapped. Its warm-up reserves a compute buffer for the largest image, which has no closed
form; llama-server's ``--fit`` step (the dry run) logs the sum of both ("[mtmd] estimated worst-case memory usage
of mmproj is X MiB", 2 decimals), so the compute is that estimate less the exact weights.

Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from fitevict.pricing.footprint import HOST, DeviceFootprint, Footprint, Term
from fitevict.pricing.ggml_types import CPU_TENSOR_ALIGNMENT, pad
from fitevict.pricing.gguf import GgufStructure
from fitevict.units import MiB, format_size

WEAKEST = ("measured", "engine-reported", "stored-measurement", "dry-run", "declared", "file-size", "formula")
_ESTIMATE = re.compile(r"\[mtmd\] estimated worst-case memory usage of mmproj is\s+([0-9.]+) MiB")


@dataclass(frozen=True, slots=True)
class ProjectorPrice:
    path: str
    weights: Term  # formula: the projector's tensors, each padded to the buffer alignment
    compute: Term  # dry-run: the engine's estimate less the weights; unavailable without it


def projector_weights(s: GgufStructure, alignment: int = CPU_TENSOR_ALIGNMENT) -> int:
    """Bytes of the projector's weight buffer."""
    return sum(pad(t.nbytes, alignment) for t in s.tensors)


def parse_projector_estimate(text: str) -> int | None:
    """The engine's estimate of the projector's weights plus compute (bytes, from 2-decimal MiB), or None."""
    found = _ESTIMATE.findall(text)
    return round(float(found[-1]) * MiB) if found else None


def price_projector(s: GgufStructure, estimate: int | None) -> ProjectorPrice:
    weights = projector_weights(s)
    if estimate is None:
        compute = Term.unavailable("no dry run with --mmproj logged the engine's projector estimate")
    else:
        compute = Term(max(estimate - weights, 0), "dry-run")
    return ProjectorPrice(s.path, Term(weights, "formula"), compute)


def with_projector(fp: Footprint, proj: ProjectorPrice) -> Footprint:
    """``fp`` with the projector on the host: its weights join the model term, its compute the compute term, both
    committed memory."""
    host = fp.device(HOST) or DeviceFootprint(HOST)

    def add(a: Term, b: Term) -> Term:
        if a.bytes is None or b.bytes is None:
            return a if a.bytes is None else b
        # the sum is only as good as its weaker part
        src = b.source if a.bytes == 0 else max(a.source, b.source, key=WEAKEST.index)
        return Term(a.bytes + b.bytes, src)

    new_host = replace(host, model=add(host.model, proj.weights), compute=add(host.compute, proj.compute))
    if fp.device(HOST):
        devices = tuple(new_host if d.name == HOST else d for d in fp.devices)
    else:
        devices = (new_host, *fp.devices)
    extra = proj.weights.value + proj.compute.value
    compute = (f"{format_size(proj.compute.value)} ({proj.compute.source})" if proj.compute.bytes is not None
               else f"unavailable: {proj.compute.reason}")
    note = (f"host includes the projector {proj.path}: weights {format_size(proj.weights.value)} "
            f"({proj.weights.source}), compute {compute}")
    return replace(fp, devices=devices, host_committed_bytes=fp.host_committed_bytes + extra,
                   notes=(*fp.notes, note))
