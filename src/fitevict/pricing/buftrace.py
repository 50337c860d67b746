"""Exact buffer bytes from the allocator trace (``fitevict-buftrace:`` lines, see engines/llama_cpp/buftrace.c).

The load log names each buffer's role (model, KV, recurrent state, output, compute) but prints its size in MiB
with 2 decimals; the trace prints every buffer the engine allocates or frees, to the byte, but not its role.
``exact_log`` joins them: each log figure takes the size of the earliest buffer still alive with the same buffer
type name that rounds to the printed MiB (llama.cpp allocates weights, output, caches, compute, in that order).
A figure without such a buffer stays as printed and is named in the notes. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from fitevict.pricing.logparse import LoadLog, parse_load_log
from fitevict.units import MiB

STOP_MARK = "fitevict: stopping the engine"  # written into a captured log where the stop began; the trace ends there
_LINE = re.compile(r"fitevict-buftrace: (alloc|free) (\S+) (\d+)\s*$")
_STATE = re.compile(r"fitevict-buftrace: (ready|unavailable: .*)$")


@dataclass(frozen=True, slots=True)
class TracedBuffer:
    name: str  # buffer type: CPU, CPU_Mapped, CPU_REPACK, CUDA0, CUDA_Host, ...
    bytes: int
    seq: int  # allocation order


@dataclass(frozen=True, slots=True)
class Trace:
    live: tuple[TracedBuffer, ...]  # buffers allocated and not freed, in allocation order
    allocs: int
    frees: int
    state: str  # "ready", "unavailable: ...", or "" when the library never reported


def parse_trace(text: str) -> Trace:
    """The buffers alive at the end of ``text``, or where a capture began stopping the engine (``STOP_MARK``); a
    free removes the latest live buffer of its name and size."""
    live: list[TracedBuffer] = []
    allocs = frees = 0
    state = ""
    for line in text.splitlines():
        if line == STOP_MARK:
            break
        if m := _LINE.search(line):
            name, n = m.group(2), int(m.group(3))
            if m.group(1) == "alloc":
                live.append(TracedBuffer(name, n, allocs))
                allocs += 1
            else:
                frees += 1
                for i in range(len(live) - 1, -1, -1):
                    if live[i].name == name and live[i].bytes == n:
                        del live[i]
                        break
        elif (m := _STATE.search(line)) and not state.startswith("ready"):
            state = m.group(1)  # "ready" from the engine wins over a helper process's "unavailable"
    return Trace(tuple(live), allocs, frees, state)


def _mib2(n: int) -> str:
    return f"{n / MiB:.2f}"


def exact_log(log: LoadLog, trace: Trace) -> LoadLog:
    """``log`` with every buffer figure replaced by the allocator's exact bytes (``precision_bytes`` 0), or, where
    a figure finds no traced buffer, left as printed and named in ``notes``."""
    pool = [b for b in trace.live if b.bytes > 0]
    missing: list[str] = []

    def take(role: str, pairs: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
        out = []
        for name, printed in pairs:
            hit = next((b for b in pool if b.name == name and _mib2(b.bytes) == _mib2(printed)), None)
            if hit is None:
                missing.append(f"{role} {name} {_mib2(printed)} MiB")
                out.append((name, printed))
            else:
                pool.remove(hit)
                out.append((name, hit.bytes))
        return tuple(out)

    # the order llama.cpp allocates in: weights, the output buffer, the KV caches, the recurrent state, compute
    model = take("model", log.model_buffers)
    output = take("output", log.output_buffers)
    kv_lines = take("KV", log.kv_lines)
    rs = take("RS", log.rs_buffers)
    compute = take("compute", log.compute_buffers)
    kv: dict[str, int] = {}
    for name, n in kv_lines:
        kv[name] = kv.get(name, 0) + n
    if not trace.state.startswith("ready"):
        missing.append(f"the allocator trace is {trace.state or 'absent (the library was not loaded)'}")
    notes = (*log.notes, *(f"not exact (no traced buffer): {m}" for m in missing))
    return replace(log, model_buffers=model, kv_lines=kv_lines, kv_buffers=tuple(kv.items()), rs_buffers=rs,
                   output_buffers=output, compute_buffers=compute, notes=notes,
                   precision_bytes=0 if not missing else log.precision_bytes)


def parse_exact_log(text: str) -> LoadLog:
    """A load log whose text also holds the allocator trace, with exact figures where the trace has them."""
    return exact_log(parse_load_log(text), parse_trace(text))
