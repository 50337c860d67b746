"""Parse llama-server's load log (``-lv 4`` or more) into the buffers it reports, and into a measured Footprint.

Lines read (llama.cpp 0c1e570):
  load_tensors:   CPU_Mapped model buffer size =     0.49 MiB
  llama_context:        CPU  output buffer size =     0.02 MiB
  llama_kv_cache:        CPU KV buffer size =     0.38 MiB                 (once per cache: base and SWA)
  llama_kv_cache: size =    0.38 MiB (  1024 cells,   3 layers,  4/1 seqs), K (f16): ...
  llama_kv_cache_iswa: creating     SWA KV cache, size = 512 cells
  llama_memory_recurrent:        CPU RS buffer size =     0.05 MiB
  llama_memory_recurrent: size = ... (     4 cells,   2 layers,  4 seqs  0 rs_seq), ...
  sched_reserve:        CPU compute buffer size =     4.70 MiB
  llama_adapter_lora_init_impl:        CPU LoRA buffer size =     0.05 MiB   (once per adapter and buffer type)
  llama_context: n_ctx = 1024 / n_ctx_seq / n_seq_max / n_batch / n_ubatch / flash_attn / kv_unified
  common_memory_breakdown_print: | ... |   (integer MiB; printed after the dry run and at exit)

Debug lines from the ``--fit`` dry run (level D) are ignored: they describe empty placeholder buffers.
``parse_dry_context`` reads the dry run's own cache lines instead (``-lv 5``): the sizes it computed and the
``llama_kv_cache: layer N: dev = X`` / ``llama_memory_recurrent, layer N: dev = X`` placement of each layer.
Missing lines leave their terms unavailable, with the reason. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from fitevict.pricing.hostbufs import is_host_buffer
from fitevict.pricing.layers import MEMORYLESS_ARCHS
from fitevict.pricing.footprint import HOST, ZERO_FORMULA, DeviceFootprint, Footprint, Term
from fitevict.units import MiB

_MIB = r"([0-9]+(?:\.[0-9]+)?) MiB"
_MODEL = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+" + _MIB)
_OUTPUT = re.compile(r"llama_context:\s+(\S+)\s+output buffer size =\s+" + _MIB)
_KV = re.compile(r"llama_kv_cache:\s+(\S+) KV buffer size =\s+" + _MIB)
_KV_SIZE = re.compile(r"llama_kv_cache: size =\s+[0-9.]+ MiB \(\s*(\d+) cells,\s+(\d+) layers,\s+(\d+)/(\d+) seqs\)")
_SWA = re.compile(r"llama_kv_cache_iswa: creating\s+(non-SWA|SWA) KV cache, size = (\d+) cells")
_RS = re.compile(r"llama_memory_recurrent:\s+(\S+) RS buffer size =\s+" + _MIB)
_RS_SIZE = re.compile(r"llama_memory_recurrent: size =\s+[0-9.]+ MiB \(\s*(\d+) cells,\s+(\d+) layers")
_LORA = re.compile(r"llama_adapter_lora_init_impl:\s+(\S+) LoRA buffer size =\s+" + _MIB)
_COMPUTE = re.compile(r"(?:sched_reserve|llama_context|graph_reserve):\s+(\S+) compute buffer size =\s+" + _MIB)
_PARAM = re.compile(r"llama_context: (n_ctx|n_ctx_seq|n_seq_max|n_batch|n_ubatch|flash_attn|kv_unified)\s+= (\S+)")
_FA = re.compile(r"resolve_fused_ops: Flash Attention (enabled|disabled)")
_BREAKDOWN = re.compile(r"memory_breakdown_print: \|\s+- (.+?)\s+\|(.*)\|\s*$")
_DEBUG = re.compile(r"^\s*[0-9.]+ D ")
_ARCH = re.compile(r"print_info: arch\s+= (\S+)")

PRECISION_BYTES = MiB // 200  # the log prints MiB with 2 decimals: +- 0.005 MiB


def _bytes(mib: str) -> int:
    return round(float(mib) * MiB)


@dataclass(frozen=True, slots=True)
class LoadLog:
    """What one load log reported. Byte figures come from 2-decimal MiB (precision +- 5 KiB)."""

    model_buffers: tuple[tuple[str, int], ...] = ()
    kv_buffers: tuple[tuple[str, int], ...] = ()  # summed per buffer name over base + SWA caches
    kv_lines: tuple[tuple[str, int], ...] = ()  # each KV buffer line in log order (base cache first, then SWA)
    rs_buffers: tuple[tuple[str, int], ...] = ()
    output_buffers: tuple[tuple[str, int], ...] = ()
    compute_buffers: tuple[tuple[str, int], ...] = ()  # the last reservation per buffer name
    lora_buffers: tuple[tuple[str, int], ...] = ()  # "LoRA buffer size" per buffer name, summed over adapters
    kv_cells: int | None = None  # base (non-SWA) cache cells per stream
    kv_cells_swa: int | None = None
    kv_layers: int | None = None
    kv_seqs: int | None = None
    kv_streams: int | None = None
    rs_cells: int | None = None
    n_ctx: int | None = None
    n_ctx_seq: int | None = None
    n_seq_max: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    flash_attn: str | None = None  # as configured: on / off / auto
    flash_attn_resolved: bool | None = None
    kv_unified: bool | None = None
    breakdown: tuple[tuple[str, tuple[int, ...]], ...] = ()  # ("Host", (self, model, context, compute)), MiB
    notes: tuple[str, ...] = field(default=())
    precision_bytes: int = PRECISION_BYTES  # 0 once the allocator trace made every figure exact (pricing.buftrace)
    arch: str | None = None  # print_info's architecture: for one llama.cpp makes no memory for, no cache line is due
    # buffer type names that are not their device's name, from the log's "using device" lines: RPC0[HOST:PORT] -> RPC1
    aliases: tuple[tuple[str, str], ...] = ()

    @property
    def loaded(self) -> bool:
        return bool(self.model_buffers)

    def to_footprint(self) -> Footprint:
        """Per device: model / context / compute / output, source "engine-reported"; missing lines unavailable."""
        devs: dict[str, dict[str, int]] = {}

        alias = dict(self.aliases)

        def add(name: str, term: str, n: int) -> None:
            dev = device_of(name, alias)
            devs.setdefault(dev, {}).setdefault(term, 0)
            devs[dev][term] += n

        for name, n in self.model_buffers:
            add(name, "model", n)
        for name, n in (*self.kv_buffers, *self.rs_buffers):
            add(name, "context", n)
        for name, n in self.compute_buffers:
            add(name, "compute", n)
        for name, n in self.output_buffers:
            add(name, "output", n)
        for name, n in self.lora_buffers:
            add(name, "adapters", n)
        if not devs:
            return Footprint(devices=(DeviceFootprint(
                HOST, *(Term.unavailable("the log has no buffer lines (was it written with -lv 4 or more?)"),) * 4),),
                host_source="unavailable", notes=("no buffer lines in the load log",))
        missing = {
            "model": "no 'model buffer size' line in the log",
            "context": "no 'KV buffer size' / 'RS buffer size' line in the log",
            "compute": "no 'compute buffer size' line in the log (the load did not reach the graph reservation)",
            "output": "no 'output buffer size' line in the log",
        }
        any_ctx = bool(self.kv_buffers or self.rs_buffers) or self.arch in MEMORYLESS_ARCHS
        out: list[DeviceFootprint] = []
        for dev in sorted(devs, key=lambda d: (d != HOST, d)):
            terms = devs[dev]

            def term(k: str) -> Term:
                if k in terms:
                    return Term(terms[k], "engine-reported")
                seen = {"model": bool(self.model_buffers), "context": any_ctx,
                        "compute": bool(self.compute_buffers), "output": bool(self.output_buffers)}[k]
                return Term(0, "engine-reported") if seen else Term.unavailable(missing[k])

            adapters = Term(terms["adapters"], "engine-reported") if "adapters" in terms else ZERO_FORMULA
            out.append(DeviceFootprint(dev, term("model"), term("context"), term("compute"), term("output"), adapters))
        mapped = sum(n for name, n in self.model_buffers if name == "CPU_Mapped")
        host_total = sum(d.total_bytes for d in out if d.name == HOST)
        return Footprint(devices=tuple(out), host_mapped_bytes=mapped, host_committed_bytes=host_total - mapped,
                         host_source="engine-reported", notes=self.notes)


def device_of(buffer_name: str, aliases: Mapping[str, str] | None = None) -> str:
    """The budget device a buffer counts against: a device's own buffer (CUDA0, Vulkan1, ...) is that device, an
    RPC buffer (``RPC0[HOST:PORT]``) the device ``aliases`` names for it (``device_aliases``; else the buffer name
    itself); every other name (CPU, CPU_Mapped, CPU_REPACK, AMX, CUDA_Host, Vulkan_Host, ...) is host memory."""
    if aliases and buffer_name in aliases:
        return aliases[buffer_name]
    return HOST if is_host_buffer(buffer_name) else buffer_name


_USING = re.compile(r"using device (\S+) \((.*?)\) \(")


def device_aliases(text: str) -> dict[str, str]:
    """Buffer type name -> device for the devices a log says it uses whose buffers are not named after them: an RPC
    device ``RPC<k>`` (described by its endpoint) allocates ``RPC<i>[endpoint]``, ``i`` its index on that server."""
    out: dict[str, str] = {}
    per_endpoint: dict[str, int] = {}
    for line in text.splitlines():
        if (m := _USING.search(line)) and m.group(1).startswith("RPC") and m.group(2) not in ("",):
            ep = m.group(2)
            name = f"RPC{per_endpoint.get(ep, 0)}[{ep}]"
            if name not in out:
                out[name] = m.group(1)
                per_endpoint[ep] = per_endpoint.get(ep, 0) + 1
    return out


def _sum(pairs: list[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    acc: dict[str, int] = {}
    for k, v in pairs:
        acc[k] = acc.get(k, 0) + v
    return tuple(acc.items())


def parse_load_log(text: str) -> LoadLog:
    """Parse one load (the last one if the text holds several)."""
    lines = text.splitlines()
    # the last "loading model tensors" starts the last load
    start = 0
    for i, line in enumerate(lines):
        if "load_tensors: loading model tensors" in line and not _DEBUG.match(line):
            start = i
    model: list[tuple[str, int]] = []
    kv: list[tuple[str, int]] = []
    rs: list[tuple[str, int]] = []
    outb: list[tuple[str, int]] = []
    lora: list[tuple[str, int]] = []
    compute: dict[str, int] = {}
    vals: dict[str, object] = {}
    breakdown: list[tuple[str, tuple[int, ...]]] = []
    for line in lines[start:]:
        if _DEBUG.match(line):
            continue
        if m := _MODEL.search(line):
            model.append((m.group(1), _bytes(m.group(2))))
        elif m := _OUTPUT.search(line):
            outb.append((m.group(1), _bytes(m.group(2))))
        elif m := _KV.search(line):
            kv.append((m.group(1), _bytes(m.group(2))))
        elif m := _KV_SIZE.search(line):
            vals.setdefault("kv_cells", int(m.group(1)))
            vals["kv_layers"] = int(vals.get("kv_layers", 0)) + int(m.group(2))  # type: ignore[arg-type]
            vals["kv_seqs"], vals["kv_streams"] = int(m.group(3)), int(m.group(4))
        elif m := _SWA.search(line):
            vals["kv_cells_swa" if m.group(1) == "SWA" else "kv_cells"] = int(m.group(2))
        elif m := _RS.search(line):
            rs.append((m.group(1), _bytes(m.group(2))))
        elif m := _RS_SIZE.search(line):
            vals["rs_cells"] = int(m.group(1))
        elif m := _COMPUTE.search(line):
            compute[m.group(1)] = _bytes(m.group(2))
        elif m := _LORA.search(line):
            lora.append((m.group(1), _bytes(m.group(2))))
        elif m := _PARAM.search(line):
            vals[m.group(1)] = m.group(2)
        elif m := _FA.search(line):
            vals["fa_resolved"] = m.group(1) == "enabled"
        elif m := _BREAKDOWN.search(line):
            nums = tuple(int(x) for x in re.findall(r"-?\d+", m.group(2)))
            breakdown.append((m.group(1).strip(), nums))

    def num(k: str) -> int | None:
        v = vals.get(k)
        return int(v) if v is not None else None  # type: ignore[call-overload]

    notes: list[str] = []
    if not model:
        notes.append("no model buffer lines: the log is not at -lv 4 or the load failed before the weights")
    arch = next((m.group(1) for line in reversed(lines) if (m := _ARCH.search(line))), None)
    return LoadLog(
        model_buffers=_sum(model), kv_buffers=_sum(kv), kv_lines=tuple(kv), rs_buffers=_sum(rs), output_buffers=_sum(outb),
        compute_buffers=tuple(compute.items()), lora_buffers=_sum(lora),
        kv_cells=num("kv_cells"), kv_cells_swa=num("kv_cells_swa"), kv_layers=num("kv_layers"),
        kv_seqs=num("kv_seqs"), kv_streams=num("kv_streams"), rs_cells=num("rs_cells"),
        n_ctx=num("n_ctx"), n_ctx_seq=num("n_ctx_seq"), n_seq_max=num("n_seq_max"),
        n_batch=num("n_batch"), n_ubatch=num("n_ubatch"),
        flash_attn=str(vals["flash_attn"]) if "flash_attn" in vals else None,
        flash_attn_resolved=vals.get("fa_resolved"),  # type: ignore[arg-type]
        kv_unified=(vals["kv_unified"] == "true") if "kv_unified" in vals else None,
        breakdown=tuple(breakdown[-8:]) if breakdown else (), notes=tuple(notes), arch=arch,
        aliases=tuple(device_aliases(text).items()),
    )


# --- the context caches a --fit dry run reports ------------------------------------------------------

_DRY_CTX_START = re.compile(r"llama_context: constructing llama_context")
_DRY_DONE = re.compile(r"fitting params to free memory took|failed to fit params")
_DRY_KV_LAYER = re.compile(r"llama_kv_cache: layer\s+(\d+): dev = (\S+)")
_DRY_RS_LAYER = re.compile(r"llama_memory_recurrent, layer\s+(\d+): dev = (\S+)")
_DRY_KV_SIZE = re.compile(r"llama_kv_cache: size =\s+([0-9.]+) MiB \(\s*(\d+) cells,\s+(\d+) layers,\s+(\d+)/(\d+) seqs\), "
                          r"K \(\S+\):\s+([0-9.]+) MiB")
_DRY_RS_SIZE = re.compile(r"llama_memory_recurrent: size =\s+([0-9.]+) MiB \(\s*(\d+) cells,\s+(\d+) layers.*?"
                          r"R \(\S+\):\s+([0-9.]+) MiB")


@dataclass(frozen=True, slots=True)
class DryCache:
    """One context cache as the dry run reports it: its total and its K (or R) part, from 2-decimal MiB."""

    kind: str  # "full" | "swa" | "recurrent"
    bytes: int
    first_bytes: int  # K of a KV cache, R of a recurrent state
    cells: int  # per stream
    streams: int
    layers: tuple[tuple[int, str], ...]  # (layer index, budget device)

    def to_json(self) -> dict:
        return {"kind": self.kind, "bytes": self.bytes, "first_bytes": self.first_bytes, "cells": self.cells,
                "streams": self.streams, "layers": [list(x) for x in self.layers]}

    @staticmethod
    def from_json(d: dict) -> "DryCache":
        return DryCache(str(d["kind"]), int(d["bytes"]), int(d["first_bytes"]), int(d["cells"]), int(d["streams"]),
                        tuple((int(il), str(dev)) for il, dev in d["layers"]))


@dataclass(frozen=True, slots=True)
class DryContext:
    """The KV / SWA / recurrent caches llama.cpp sized in its ``--fit`` dry run (``-lv 5``): the context term for
    an architecture fitevict has no rules for. Sizes are as printed (MiB with 2 decimals)."""

    caches: tuple[DryCache, ...]

    def to_json(self) -> list:
        return [c.to_json() for c in self.caches]

    @staticmethod
    def from_json(d: list) -> "DryContext":
        return DryContext(tuple(DryCache.from_json(c) for c in d))


def split_evenly(total: int, n: int) -> list[int]:
    """``total`` in ``n`` near-equal whole parts that sum to it."""
    if n <= 0:
        return []
    base, rem = divmod(total, n)
    return [base + (1 if i < rem else 0) for i in range(n)]


def parse_dry_context(text: str) -> DryContext | None:
    """The caches of the last context the dry run built before ``--fit`` reported; None without any."""
    caches: list[DryCache] = []
    layers: list[tuple[int, str]] = []
    rs_layers: list[tuple[int, str]] = []
    next_kind = "full"
    for line in text.splitlines():
        if _DRY_CTX_START.search(line):
            caches, layers, rs_layers, next_kind = [], [], [], "full"
        elif m := _SWA.search(line):
            next_kind = "swa" if m.group(1) == "SWA" else "full"
        elif m := _DRY_KV_LAYER.search(line):
            layers.append((int(m.group(1)), device_of(m.group(2))))
        elif m := _DRY_RS_LAYER.search(line):
            rs_layers.append((int(m.group(1)), device_of(m.group(2))))
        elif m := _DRY_KV_SIZE.search(line):
            caches.append(DryCache(next_kind, _bytes(m.group(1)), _bytes(m.group(6)), int(m.group(2)),
                                   int(m.group(5)), tuple(layers)))
            layers, next_kind = [], "full"
        elif m := _DRY_RS_SIZE.search(line):
            caches.append(DryCache("recurrent", _bytes(m.group(1)), _bytes(m.group(4)), int(m.group(2)), 1,
                                   tuple(rs_layers)))
            rs_layers = []
        elif _DRY_DONE.search(line):
            break
    return DryContext(tuple(caches)) if caches else None
