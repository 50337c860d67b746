r"""Which host buffer a CPU weight lands in on this machine: the CPU backend's "extra" buffer types.

llama.cpp's CPU backend offers extra buffer types that are tried, in order, before plain ``CPU``
(ggml-cpu.cpp ``ggml_backend_cpu_get_extra_buffer_types``): ``AMX`` (Intel Xeon with AMX), KleidiAI (ARM),
``CPU_REPACK``. A weight takes the first one whose ``supports_op`` accepts the op the model uses it in
(llama-model-loader.cpp ``select_weight_buft``), and is then a heap copy in that buffer, mmap or not (none of them is
a host buffer in ggml's sense, so the mapped span shrinks around it). ``-nr`` (``--no-repack``) turns them all off.

Which extra types exist, which weights each takes and how many bytes it allocates depend on the CPU and the engine
build. A ``HostBuffers`` table says so per buffer type and ggml type (``TypeRule``), with where the table came from:

- ``probe``: learned from the engine on this machine (``llama_cpp/probe.py``: one small model per type and shape
  class, loaded under the allocator trace);
- ``rule-table``: the rules below, written from the pinned llama.cpp's source for the CPU flags the machine reports
  (``rule_table``). A guess on a CPU the rules were not written for; labelled as such wherever it is used.

Every buffer named here is host memory: it counts against the host budget, whatever its name (``is_host_buffer``).

Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gguf import GGMLQuantizationType as QT

from fitevict.pricing.ggml_types import block_size, type_size

MUL_MAT = "mul_mat"
MUL_MAT_ID = "mul_mat_id"
# llama-arch.cpp LLM_TENSOR_INFOS: weights of 2+ dimensions that no matrix multiplication uses (GET_ROWS, SSM_CONV,
# SSM_SCAN, ROPE, SCALE, IM2COL, ...); an extra buffer type takes none of them
_NOT_MATMUL = re.compile(
    r"^(token_embd|position_embd|token_types|per_layer_token_embd|rope_freqs|rope_factors_long|rope_factors_short"
    r"|conv1d|d2t|markov_w1|selector_predecessor|selector_successor|masked_embd_centroids|masked_embd_ordering"
    r"|posnet\.\d+\.conv\d|convnext\.\d+\.dw)\.weight$"
    r"|\.(ple_conv1d|attn_compressor_ape|attn_sinks|ffn\.act|ssm_conv1d|ssm_a|time_mix_first|attn_rel_b"
    r"|cross_attn_rel_b|shortconv\.conv|indexer_compressor_ape|ffn_gate_tid2eid|nextn\.embed_tokens)(\.weight)?$")
_EXPERT = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps\.weight$")


def weight_op(name: str, shape: tuple[int, ...]) -> str | None:
    """The matrix op llama.cpp builds with this weight (``mul_mat`` / ``mul_mat_id``), or None for any other use."""
    if len(shape) < 2 or not name.endswith(".weight") or _NOT_MATMUL.search(name):
        return None
    if _EXPERT.search(name):
        return MUL_MAT_ID
    return MUL_MAT


@dataclass(frozen=True, slots=True)
class TypeRule:
    """When one extra buffer type takes a weight of one ggml type, and what it allocates for it."""

    row_multiple: int = 1  # ne[1] (output rows) must be a multiple of this
    col_multiple: int = 1  # ne[0] (input columns) must be a multiple of this
    ops: tuple[tuple[str, int], ...] = ((MUL_MAT, 0),)  # (op, required number of dims; 0 = any)
    bytes_per_block: int | None = None  # a packed copy: ne[1] * ne[0]/block * this; None = the tensor's own bytes

    def takes(self, op: str, shape: tuple[int, ...]) -> bool:
        if not any(o == op and (d == 0 or d == len(shape)) for o, d in self.ops):
            return False
        return shape[0] % self.col_multiple == 0 and shape[1] % self.row_multiple == 0

    def alloc_bytes(self, ggml_type: QT, shape: tuple[int, ...], nbytes: int) -> int:
        if self.bytes_per_block is None:
            return nbytes
        return shape[1] * (shape[0] // block_size(ggml_type)) * self.bytes_per_block

    def to_json(self) -> dict:
        return {"row_multiple": self.row_multiple, "col_multiple": self.col_multiple,
                "ops": [list(o) for o in self.ops], "bytes_per_block": self.bytes_per_block}

    @staticmethod
    def from_json(d: Mapping) -> "TypeRule":
        return TypeRule(int(d["row_multiple"]), int(d["col_multiple"]), tuple((str(o), int(n)) for o, n in d["ops"]),
                        None if d.get("bytes_per_block") is None else int(d["bytes_per_block"]))


@dataclass(frozen=True, slots=True)
class ExtraBuffer:
    name: str  # as the engine names it: "AMX", "CPU_REPACK", "CPU_KLEIDIAI", ...
    types: tuple[tuple[str, TypeRule], ...]  # ggml type name -> rule

    def rule(self, ggml_type: QT) -> TypeRule | None:
        return next((r for t, r in self.types if t == ggml_type.name), None)


@dataclass(frozen=True, slots=True)
class HostBuffers:
    """This machine's extra host buffer types, in the order the engine tries them, and where that came from."""

    extras: tuple[ExtraBuffer, ...]
    source: str  # "probe" or "rule-table"
    detail: str = ""  # the engine build and CPU it was learned on, or the flags the rules were chosen by
    notes: tuple[str, ...] = field(default=())

    def place(self, name: str, ggml_type: QT, shape: tuple[int, ...], nbytes: int) -> tuple[str, int] | None:
        """(buffer name, bytes allocated) for a CPU weight an extra buffer type takes, or None (plain CPU)."""
        op = weight_op(name, shape)
        if op is None:
            return None
        for extra in self.extras:
            rule = extra.rule(ggml_type)
            if rule is not None and rule.takes(op, shape):
                return extra.name, rule.alloc_bytes(ggml_type, shape, nbytes)
        return None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.extras)

    def label(self) -> str:
        kinds = ", ".join(self.names) or "none"
        return f"extra host buffers {kinds} ({self.source}{': ' + self.detail if self.detail else ''})"

    def to_json(self) -> dict:
        return {"source": self.source, "detail": self.detail, "notes": list(self.notes),
                "extras": [{"name": e.name, "types": {t: r.to_json() for t, r in e.types}} for e in self.extras]}

    @staticmethod
    def from_json(d: Mapping) -> "HostBuffers":
        extras = tuple(ExtraBuffer(str(e["name"]), tuple((str(t), TypeRule.from_json(r)) for t, r in e["types"].items()))
                       for e in d["extras"])
        return HostBuffers(extras, str(d["source"]), str(d.get("detail", "")), tuple(d.get("notes", ())))


NO_EXTRAS = HostBuffers((), "rule-table", "-nr: no extra buffer types")


def is_host_buffer(buffer_name: str, devices: Iterable[str] = ()) -> bool:
    """Whether a buffer the engine names counts against host memory: everything but a device's own buffer.

    ``devices`` are the engine's devices (``CUDA0``, ``Vulkan1``, ...). Without them a device is recognised by
    its spelling (letters and an index, as ggml names devices, an RPC device's buffers with ``[HOST:PORT]``); ``AMX``, ``CPU_REPACK``, ``CUDA_Host``,
    ``CPU_Mapped`` and any name of that kind is host memory, never a device of its own."""
    if buffer_name in tuple(devices):
        return False
    if buffer_name.startswith("CPU") or buffer_name.endswith("_Host"):
        return True
    return re.fullmatch(r"[A-Za-z]+\d+(\[[^\]]+\])?", buffer_name) is None  # RPC0[HOST:PORT]: an RPC device


# --- the rule table: llama.cpp 0c1e570's own rules, by the CPU features they depend on -------------------------

# ggml-cpu/amx: mmq.cpp get_row_size (a packed block, plus int32 compensation for Q8_0, 4 B of K-quant scales for
# Q4_K/Q5_K, 2 B for IQ4_XS); amx.cpp supports_op: MUL_MAT only, ne[1] % 32 (2 * TILE_N), ne[0] % the K alignment
_AMX_EXTRA = {QT.Q4_0: 0, QT.Q4_1: 0, QT.Q8_0: 4, QT.Q4_K: 4, QT.Q5_K: 4, QT.Q6_K: 0, QT.IQ4_XS: 2}
_AMX_K = {QT.Q4_0: 32, QT.Q4_1: 32, QT.Q8_0: 32, QT.Q4_K: 256, QT.Q5_K: 256, QT.Q6_K: 256, QT.IQ4_XS: 256}


def _amx() -> ExtraBuffer:
    rules = [(t.name, TypeRule(32, _AMX_K[t], ((MUL_MAT, 0),), type_size(t) + extra)) for t, extra in _AMX_EXTRA.items()]
    rules.append((QT.F16.name, TypeRule(32, 16, ((MUL_MAT, 0),), None)))
    return ExtraBuffer("AMX", tuple(rules))


# ggml-cpu/repack.cpp ggml_repack_get_optimal_repack_type on x86: type -> the CPU feature that enables it; a 2-D
# MUL_MAT or 3-D MUL_MAT_ID weight whose ne[1] % 8 == 0; the repacked copy is as large as the weight
_REPACK_X86: dict[QT, str] = {QT.Q4_0: "avx2", QT.Q4_K: "avx2", QT.IQ4_NL: "avx2", QT.MXFP4: "avx2",
                              QT.Q2_K: "avx512f"}


def _repack_x86(flags: frozenset[str]) -> ExtraBuffer:
    ops = ((MUL_MAT, 2), (MUL_MAT_ID, 3))
    return ExtraBuffer("CPU_REPACK", tuple((t.name, TypeRule(8, 1, ops, None))
                                           for t, need in _REPACK_X86.items() if need in flags))


def rule_table(flags: Iterable[str], machine: str = "x86_64", *, amx_built: bool = True) -> HostBuffers:
    """The extra buffer types the pinned build offers on a CPU with ``flags`` (/proc/cpuinfo spelling), from its
    source: AMX first (``amx_int8`` with ``avx512_vnni``, where the build compiled it: ``amx_built``), then
    CPU_REPACK (x86 with AVX2). Other architectures (ARM's KleidiAI and repack) have no rules here: there the probe
    decides, and without one nothing is assumed."""
    f = frozenset(flags)
    extras: list[ExtraBuffer] = []
    notes: list[str] = []
    if machine in ("x86_64", "amd64", "AMD64"):
        if "amx_int8" in f and "avx512_vnni" in f:
            if amx_built:
                extras.append(_amx())
            else:
                notes.append("AMX left out of the build (engines/llama_cpp/install.py: its matrix product crashes)")
        if "avx2" in f:
            extras.append(_repack_x86(f))
    else:
        notes.append(f"no rules for {machine}: extra buffer types (KleidiAI, repack) are known only from a probe")
    shown = sorted(x for x in f if x in ("avx2", "avx512f", "avx512_vnni", "amx_int8"))
    return HostBuffers(tuple(extras), "rule-table", f"{machine} with {' '.join(shown) or 'no AVX2'}", tuple(notes))


def dry_run_check(priced: Iterable[tuple[str, int]], model_mib: Mapping[str, int]) -> tuple[str, ...]:
    """Where the engine's dry run (its fit step's memory breakdown: whole MiB of weights per row) disagrees with the
    priced extra host buffers by more than its rounding: one sentence each, naming both figures. ``priced`` is
    (buffer name, bytes) per model buffer."""
    mib = 1 << 20
    mine: dict[str, int] = {}
    for name, n in priced:
        if name not in ("CPU", "CPU_Mapped") and not name.endswith("_Host") and is_host_buffer(name):
            mine[name] = mine.get(name, 0) + n
    out = []
    for name in sorted(set(mine) | {r for r in model_mib if r != "Host" and is_host_buffer(r)}):
        engine, ours = model_mib.get(name, 0), mine.get(name, 0)
        if abs(ours / mib - engine) > 1:
            out.append(f"the engine's dry run puts {engine} MiB of weights in {name}, the host buffer table "
                       f"{ours / mib:.2f} MiB: the table is wrong for this model here (run: fitevict engine probe)")
    return tuple(out)
