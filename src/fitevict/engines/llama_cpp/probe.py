"""Ask the engine which extra host buffer each kind of weight lands in on this machine, and what it allocates.

For every ggml type in ``PROBE_TYPES`` and a few shape classes, a one-layer llama model is written whose weights
are all F32 but one matrix of that type and shape (``ffn_up``, or the experts' ``ffn_up_exps``). llama-server loads
it under the allocator trace (``llama_cpp/buftrace.c``) with ``-fit off --no-warmup`` and is stopped as soon as its
weights are placed. The trace shows two things:

- the engine's own choice of buffer type per weight: ``select_weight_buft`` creates a zero-byte buffer of each
  type it tries, in order, until one supports the weight's op, so each weight leaves a run of ``alloc X 0`` lines
  (``AMX``, ``CPU_REPACK``, ``CPU``): the longest run is the machine's buffer list, in the order it is tried;
- the bytes of every buffer: an extra buffer holding the probed weight holds it alone.

``learn`` turns the cases into a ``HostBuffers`` table: per extra buffer and type, the smallest power of two that
the accepted row (ne[1]) and column (ne[0]) counts share and the rejected ones do not, and the packed bytes per
block when the copy is not the weight's own size. An all-F32 model checks that no F32 weight moves. The table is
stored in ``cache_dir()/probe`` under this machine's key (``host.machine``), so pricing reads it from then on.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from fitevict.engines.llama_cpp.buftrace import Unavailable, buftrace_library, preload_env
from fitevict.engines.process import free_port
from fitevict.engines.llama_cpp.install import native_flags
from fitevict.engines.llama_cpp.machine import Cpu, machine_key, probe_path, this_cpu
from fitevict.pricing.ggml_types import CPU_TENSOR_ALIGNMENT, block_size, nbytes, pad
from fitevict.pricing.hostbufs import MUL_MAT, MUL_MAT_ID, ExtraBuffer, HostBuffers, TypeRule, rule_table
from fitevict.zoo.tensors import spm_vocab

PROBE_TYPES: tuple[QT, ...] = (QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q2_K, QT.Q3_K,
                               QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_NL, QT.IQ4_XS, QT.MXFP4)
BASE = 512  # rows and columns of the reference shape: a multiple of every block size and of every known rule
ROWS = (512, 528, 520, 516)  # ne[1] multiple of 32, of 16 only, of 8 only, of 4 only
N_EXPERT = 4
_TRACE = re.compile(r"fitevict-buftrace: alloc (\S+) (\d+)\s*$")
_DONE = ("llama_context: constructing", "llama_init_from_model", "failed to load model")


@dataclass(frozen=True, slots=True)
class Case:
    ggml_type: QT
    k: int  # ne[0]: the columns (n_embd)
    n: int  # ne[1]: the rows (n_ff)
    expert: bool = False  # probed as the experts' 3-D ffn_up_exps (MUL_MAT_ID)

    @property
    def name(self) -> str:
        return f"{self.ggml_type.name.lower()}-{self.k}x{self.n}{'-exps' if self.expert else ''}"

    def weight_bytes(self) -> int:
        shape = (self.k, self.n, N_EXPERT) if self.expert else (self.k, self.n)
        return nbytes(self.ggml_type, shape)


@dataclass(frozen=True, slots=True)
class Seen:
    """What the engine did with one probe model."""

    chain: tuple[str, ...]  # the buffer types tried for the probed weight, in order; the last one took it
    extra_bytes: dict[str, int]  # bytes of each extra buffer (not CPU, not CPU_Mapped)
    order: tuple[str, ...]  # the longest run of tried buffer types: the machine's list


def cases(types: Sequence[QT] = PROBE_TYPES) -> list[Case]:
    """Per type: the reference shape and three more row classes, the column classes the type's block allows (a
    multiple of 32, 16, 8 or 4 only, past the reference), and the reference shape as experts."""
    out: list[Case] = []
    for t in types:
        out += [Case(t, BASE, n) for n in ROWS]
        out += [Case(t, BASE + d, BASE) for d in (32, 16, 8, 4) if d % block_size(t) == 0]
        if block_size(t) > 32:
            out.append(Case(t, BASE + block_size(t), BASE))
        out.append(Case(t, BASE, BASE, expert=True))
    return out


def write_model(case: Case | None, path: Path) -> None:
    """A one-layer llama (MoE when ``case.expert``) whose weights are F32 but the probed one; None: all F32."""
    k = case.k if case else BASE
    n = case.n if case else BASE
    head = 64
    w = gguf.GGUFWriter(path, "llama")
    try:
        w.add_name("fitevict probe")
        w.add_context_length(256)
        w.add_embedding_length(k)
        w.add_block_count(1)
        w.add_feed_forward_length(n)
        w.add_head_count(1)
        w.add_head_count_kv(1)
        w.add_key_length(head)
        w.add_value_length(head)
        w.add_rope_dimension_count(head)
        w.add_layer_norm_rms_eps(1e-6)
        expert = case is not None and case.expert
        if expert:
            w.add_expert_count(N_EXPERT)
            w.add_expert_used_count(2)
        tokens, scores, types = spm_vocab(300)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        rng = np.random.default_rng(0)

        def f32(name: str, *shape: int) -> None:  # shape ne0 first; numpy wants it reversed
            w.add_tensor(name, rng.standard_normal(shape[::-1]).astype(np.float32) * 0.02)

        f32("token_embd.weight", k, 300)
        f32("output_norm.weight", k)
        f32("output.weight", k, 300)
        f32("blk.0.attn_norm.weight", k)
        for m in ("q", "k", "v"):
            f32(f"blk.0.attn_{m}.weight", k, head)
        f32("blk.0.attn_output.weight", head, k)
        f32("blk.0.ffn_norm.weight", k)
        ffn = "_exps" if expert else ""
        dims = (N_EXPERT,) if expert else ()
        if expert:
            f32("blk.0.ffn_gate_inp.weight", k, N_EXPERT)
        f32(f"blk.0.ffn_gate{ffn}.weight", k, n, *dims)
        f32(f"blk.0.ffn_down{ffn}.weight", n, k, *dims)
        if case is None or case.ggml_type == QT.F32:
            f32(f"blk.0.ffn_up{ffn}.weight", k, n, *dims)
        else:
            raw = rng.integers(0, 256, size=case.weight_bytes(), dtype=np.uint8)
            if case.ggml_type in (QT.F16, QT.BF16):
                raw = np.zeros(case.weight_bytes(), dtype=np.uint8)  # zeros: valid numbers in both
            shape_np = (*dims, n, nbytes(case.ggml_type, (k,)))  # the bytes' shape: gguf reads the type's from it
            w.add_tensor(f"blk.0.ffn_up{ffn}.weight", raw.reshape(shape_np), raw_dtype=case.ggml_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()


def run_engine(binary: Path, model: Path, lib: Path, *, timeout_s: float = 60.0) -> list[str]:
    """The trace and log of loading ``model``'s weights; the engine is stopped once they are placed."""
    from fitevict.engines.llama_cpp.dryrun import follow_process

    argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(free_port()), "-dev", "none",
            "-c", "256", "-np", "1", "-fit", "off", "--no-warmup", "-lv", "4"]

    def on_line(line: str, _pid: int) -> str | None:
        return "" if any(m in line for m in _DONE) else None

    lines, _verdict, _pid = follow_process(argv, timeout_s, on_line, env=preload_env(lib, dict(os.environ)))
    return lines


def read_trace(lines: Sequence[str], probed_last: bool = True) -> Seen:
    """The buffer types tried per weight (zero-byte allocations, in runs that restart at the list's first type),
    and the bytes of the extra buffers the load then allocated."""
    runs: list[list[str]] = []
    extra: dict[str, int] = {}
    first: str | None = None
    for line in lines:
        m = _TRACE.search(line)
        if m is None:
            continue
        name, n = m.group(1), int(m.group(2))
        if n == 0:
            if first is None:
                first = name
            if name == first or not runs:
                runs.append([name])
            else:
                runs[-1].append(name)
        elif name not in ("CPU", "CPU_Mapped"):
            extra[name] = extra.get(name, 0) + n
    order = max(runs, key=len) if runs else []
    # the probed weight is the only one that may stop before CPU; an F32 model's weights all reach CPU
    chain = next((r for r in runs if r[-1] != "CPU"), order)
    return Seen(tuple(chain), extra, tuple(order))


def _multiple(accepted: Sequence[int], rejected: Sequence[int]) -> int | None:
    """The smallest power of two dividing every accepted count and no rejected one (None: no such rule)."""
    for p in (2 ** i for i in range(0, 10)):
        if all(a % p == 0 for a in accepted) and all(r % p for r in rejected):
            return p
    return None


def learn(seen: dict[Case, Seen], baseline: Seen, cpu: Cpu, engine: str) -> HostBuffers:
    """The table the cases show (see the module doc); a type whose cases fit no such rule is left out and noted."""
    notes: list[str] = []
    if baseline.extra_bytes:
        notes.append(f"an all-F32 model already used {baseline.extra_bytes}: F32 weights move too (not priced)")
    order = tuple(b for b in baseline.order if b != "CPU")
    fallback = rule_table(cpu.flags, cpu.arch, amx_built=not native_flags(cpu.flags))
    extras: list[ExtraBuffer] = []
    for buf in order:
        rules: list[tuple[str, TypeRule]] = []
        for t in sorted({c.ggml_type for c in seen}, key=lambda q: q.value):
            # the cases the engine asked this buffer type about: those that reached it in their chain
            mine = {c: s for c, s in seen.items() if c.ggml_type == t and buf in s.chain}
            took = {c for c, s in mine.items() if s.chain[-1] == buf}
            if not took:
                continue
            dense = [c for c in mine if not c.expert]
            rows = _multiple([c.n for c in dense if c in took and c.k == BASE],
                             [c.n for c in dense if c not in took and c.k == BASE])
            cols = _multiple([c.k for c in dense if c in took and c.n == BASE],
                             [c.k for c in dense if c not in took and c.n == BASE])
            if rows is None or cols is None:
                notes.append(f"{buf} {t.name}: the accepted shapes follow no multiple-of rule; not priced")
                continue
            old = next((r for e in fallback.extras if e.name == buf for n, r in e.types if n == t.name), None)
            dims = dict(old.ops) if old is not None else {}
            ops = tuple((op, dims.get(op, 0)) for op, ok in
                        ((MUL_MAT, any(not c.expert for c in took)), (MUL_MAT_ID, any(c.expert for c in took))) if ok)
            per_block = _bytes_per_block(buf, t, {c: mine[c] for c in took if not c.expert}, notes)
            rules.append((t.name, TypeRule(rows, cols, ops, per_block)))
        extras.append(ExtraBuffer(buf, tuple(rules)))
    detail = f"engine {engine} on {cpu.describe()}"
    return HostBuffers(tuple(extras), "probe", detail, tuple(notes))


def _bytes_per_block(buf: str, t: QT, took: dict[Case, Seen], notes: list[str]) -> int | None:
    """None when every accepted copy is the weight's own size; else the packed bytes per block, the same for all."""
    own = all(s.extra_bytes.get(buf) == pad(c.weight_bytes(), CPU_TENSOR_ALIGNMENT) for c, s in took.items())
    if own or not took:
        return None
    per = {s.extra_bytes.get(buf, 0) / (c.n * c.k // block_size(t)) for c, s in took.items()}
    if len(per) != 1 or not float(next(iter(per))).is_integer():
        notes.append(f"{buf} {t.name}: copies of {sorted(per)} B per block; priced at the weight's own size")
        return None
    return int(next(iter(per)))


def probe(binary: Path, *, types: Sequence[QT] = PROBE_TYPES, store: bool = True,
          say: Callable[[str], None] | None = None) -> HostBuffers | Unavailable:
    """Run the probe for ``binary`` on this machine, store its table (``store``), and return it, or why not."""
    lib = buftrace_library()
    if isinstance(lib, Unavailable):
        return lib
    cpu, t0 = this_cpu(), time.monotonic()
    seen: dict[Case, Seen] = {}
    with tempfile.TemporaryDirectory(prefix="fitevict-probe-") as tmp:
        base_model = Path(tmp) / "f32.gguf"
        write_model(None, base_model)
        baseline = read_trace(run_engine(binary, base_model, lib))
        if not baseline.order:
            return Unavailable(f"{binary} placed no weight under the allocator trace (was it built by fitevict?)")
        todo = cases(types)
        failed: list[str] = []
        for i, case in enumerate(todo):
            path = Path(tmp) / f"{case.name}.gguf"
            try:  # one kind of weight that cannot be written or loaded leaves that kind unprobed, not the rest
                write_model(case, path)
                seen[case] = read_trace(run_engine(binary, path, lib))
            except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
                failed.append(f"{case.name}: {type(e).__name__}: {e}")
            path.unlink(missing_ok=True)
            if say is not None and (i + 1) % 10 == 0:
                say(f"probed {i + 1}/{len(todo)} weight kinds")
    table = learn(seen, baseline, cpu, machine_key(binary, cpu))
    if failed:
        table = HostBuffers(table.extras, table.source, table.detail,
                            (*table.notes, *(f"not probed: {f}" for f in failed)))
    if store:
        out = probe_path(binary, cpu)
        out.parent.mkdir(parents=True, exist_ok=True)
        doc = {"machine": machine_key(binary, cpu), "cpu": cpu.model, "cpu_flags": sorted(cpu.flags),
               "engine": str(binary), "seconds": round(time.monotonic() - t0, 2),
               "cases": {c.name: {"chain": list(s.chain), "extra_bytes": s.extra_bytes} for c, s in seen.items()},
               "table": table.to_json()}
        tmp_out = out.with_suffix(f".tmp{os.getpid()}")
        tmp_out.write_text(json.dumps(doc, indent=2))
        os.replace(tmp_out, out)
    return table


__all__ = ["PROBE_TYPES", "Case", "Seen", "cases", "learn", "probe", "read_trace", "write_model"]
