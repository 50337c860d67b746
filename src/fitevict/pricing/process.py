"""The part of a llama-server process's own host memory (beyond its buffers) that grows with the model and its
configuration, as labelled rules. Pure.

A seat's process holds, beyond the buffers the engine reports, a part that does not depend on the model (the
binary's and libraries' pages, thread stacks, the allocator's arenas: calibrated once per binary by
``engines/llama_cpp/overhead.py``) and five parts that do, each priced here from the model's dimensions:

- ``tokenizer``: the vocabulary llama_vocab keeps on the heap. Per entry: its ``token_data`` (40 B), its
  ``token_to_id`` hash node and bucket (72 B), its ``cache_token_to_piece`` string (32 B), and the GGUF reader's
  token arrays (string, score, type: 40 B), freed after the load but left resident below later allocations: 184 B
  by the source; ``VOCAB_ENTRY_BYTES`` as measured at the peak of a filled context, the calibration model with
  32,000 entries against 1,003 (225 B when the seat just listens: a request's heap reuses some of the freed pages).
  A BPE merge adds its ``bpe_ranks`` node and bucket (104 B) and the GGUF reader's string (32 B): ``MERGE_BYTES``,
  by the source, not measured (the zoo's vocabularies have no merges). Token texts longer than 15 bytes
  (std::string's inline capacity) allocate their text too; that is not counted.
- ``work buffer``: ggml's CPU backend plans a work buffer per graph (``ggml_graph_plan``) and keeps the largest
  (``ggml_backend_cpu_graph_compute``). A matrix product converts its activations to the weight's ``vec_dot_type``
  there, ``ggml_row_size(vec_dot_type, ne0 x tokens)``; an expert product also keeps its row map (8 B per expert x
  expert used x token); the tiled K-quant path adds one 512 KiB slot per thread; flash attention a per-thread tile
  scratch, and without flash attention the KQ scores are converted for the V product. The largest over the
  graph, plus a cache line per thread. A prompt runs in ubatches of ``n_ubatch`` tokens. (Measured: the
  calibration model with a 16,384-wide FFN maps a 15.0 MiB buffer for a 480-token prompt, 16,384 x 480 x 2 B.)
- ``context``: the server's and the KV cache's heap per token of a filled context (each cell's position map node,
  the request's tokens, its JSON), ``CONTEXT_TOKEN_BYTES``: the slope of the calibration model's peak PSS beyond
  its buffers, filled to 2,048 and to 32,768 tokens (what it leaves of that model's overhead then moves by 0.4 MiB
  over fills of 2,048 to 32,768 tokens; docs/accuracy.md).
- ``slots``: each server slot beyond the first (the calibration runs one): its sampler, its token and batch
  vectors, its task's state. ``SLOT_BYTES``: the calibration model's peak PSS beyond its buffers and the binary's
  own pages, filled at ``-c 4096`` with 1, 2 and 4 slots (+452,692 B for the second slot, +323,156 B for each of the
  third and fourth: the mean per added slot).
- ``checkpoints``: for a model whose cache cannot roll back (sliding-window layers, recurrent state), llama-server
  keeps context checkpoints of each slot on the heap (``server-context.cpp``, ``create_checkpoint``): a prompt
  longer than a ubatch makes two, ``n_ubatch + 4`` and 4 tokens before its end (``checkpoint_offsets``), each a
  copy of the slot's part of the caches that cannot roll back (``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``): the
  sliding-window cells its window keeps (``n_swa``) and its recurrent state. By the source;
  ``CHECKPOINTS_PER_SLOT`` x slots x that copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as QT

from fitevict.pricing.footprint import HOST
from fitevict.pricing.gguf import GgufStructure, TensorInfo
from fitevict.pricing.hostbufs import MUL_MAT_ID, weight_op
from fitevict.pricing.hostbufs import HostBuffers
from fitevict.pricing.kv import KvInfo, ResolvedContext, kv_layers, resolve_context
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.placement import Placement, place
from fitevict.units import KiB

VOCAB_ENTRY_BYTES = 188
MERGE_BYTES = 136
CONTEXT_TOKEN_BYTES = 210
SLOT_BYTES = 366_335
CHECKPOINTS_PER_SLOT = 2  # server-context.cpp checkpoint_offsets {4 + n_ubatch, 4}: two before a prompt's end
CACHE_LINE = 64
TILED_SLOT_BYTES = 512 * KiB  # ggml-cpu/tiled: TILED_WS_SLOT, per thread
FA_TILE = 64  # GGML_FA_TILE_Q = GGML_FA_TILE_KV
ROW_MAPPING_BYTES = 8  # struct mmid_row_mapping {int32 i1, i2}

# ggml-cpu's type_traits_cpu[type].vec_dot_type, and (block elements, block bytes) of each vec_dot type
_Q8_0_DOT = ("Q4_0", "Q5_0", "Q8_0", "IQ4_NL", "MXFP4", "NVFP4", "Q1_0", "Q2_0")
_Q8_K_DOT = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ3_S", "IQ2_S", "IQ1_S",
             "IQ1_M", "IQ4_XS", "TQ1_0", "TQ2_0")
_DOT_SIZE = {"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q8_0": (32, 34), "Q8_1": (32, 36), "Q8_K": (256, 292)}
# ggml-cpu/tiled: the weight types its K-quant matmul takes (when not repacked), on x86 with AVX
TILED_TYPES = frozenset({"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
                         "IQ3_S", "IQ1_S", "IQ1_M"})
HOST_BUFFERS = frozenset({"CPU", "CPU_Mapped"})  # not an extra buffer type (a repacked weight has its own kernel)


@dataclass(frozen=True, slots=True)
class ProcessTerm:
    """One part of the process's memory that scales with the model, with the rule that priced it."""

    name: str
    bytes: int
    rule: str

    def to_json(self) -> dict:
        return {"name": self.name, "bytes": self.bytes, "rule": self.rule}


def vec_dot_type(t: QT) -> str:
    """The type ggml-cpu converts a matrix product's f32 activations to for a weight of type ``t``."""
    if t.name in ("F32", "F16", "BF16"):
        return t.name
    if t.name in ("Q4_1", "Q5_1", "Q8_1"):
        return "Q8_1"
    return "Q8_K" if t.name in _Q8_K_DOT else "Q8_0"


def row_size(type_name: str, n: int) -> int:
    """ggml_row_size: bytes of ``n`` elements of ``type_name`` (a vec_dot type)."""
    blk, size = _DOT_SIZE[type_name]
    return size * n // blk


def _pad(n: int, to: int = 64) -> int:
    return -(-n // to) * to


def _matmul_work(s: GgufStructure, name: str, ggml_type: QT, shape: tuple[int, ...], tokens: int,
                 n_threads: int, tiled: bool, repacked: bool) -> int:
    """``ggml_graph_plan``'s work size for the product of one weight with ``tokens`` rows of activations."""
    op = weight_op(name, shape)
    dot = vec_dot_type(ggml_type)
    conv_rows = tokens
    extra = 0
    if op == MUL_MAT_ID:
        used = max(s.expert_used_count, 1)
        n_as = shape[2] if len(shape) > 2 else max(s.expert_count, 1)
        if "ffn_down" in name:
            conv_rows = tokens * used  # the experts' outputs, one row per expert used and token
        extra = (8 + n_as * 8 + 8 + n_as * used * tokens * ROW_MAPPING_BYTES + 8
                 + CACHE_LINE * n_as + CACHE_LINE)
    conv = row_size(dot, shape[0] * conv_rows) if dot != "F32" else 0
    slots = 64 + n_threads * TILED_SLOT_BYTES if tiled and not repacked and ggml_type.name in TILED_TYPES else 0
    return _pad(conv + extra) + slots


def _host_weights(s: GgufStructure, pl: Placement, device: str = HOST) -> list[tuple[TensorInfo, bool]]:
    """The weights a CPU backend multiplies (their layer, or the output, on ``device``: the host, or an RPC device a
    CPU rpc-server runs), each with whether it sits in an extra buffer type (repacked: that kernel converts its
    activations, without the tiled path; an rpc-server's buffers are its CPU's plain ones)."""
    buffer_of = dict(pl.tensor_buffer)
    weights = list(s.tensors)
    if s.tied_output and (te := s.tensor("token_embd.weight")) is not None:
        weights.append(TensorInfo("output.weight", te.ggml_type, te.shape, te.nbytes, te.offset, None, False))
    out = []
    for t in weights:
        if weight_op(t.name, t.shape) is None or t.name == "token_embd.weight":
            continue  # not a product (token_embd is a row lookup, unless it is the tied output)
        dev = pl.output_device if t.name == "output.weight" or t.role == "output" else (
            pl.layer_device[t.layer] if t.layer is not None and t.layer < len(pl.layer_device) else HOST)
        if dev == device:
            buf = buffer_of.get(t.name, "CPU")
            out.append((t, device == HOST and buf not in HOST_BUFFERS and not buf.endswith("_Host")))
    return out


def work_buffer(s: GgufStructure, rc: ResolvedContext, pl: Placement, *, n_threads: int, tiled: bool,
                cells: int, device: str = HOST) -> int:
    """The CPU backend's work buffer for the largest graph a prompt runs (see the module's rule): ``cells`` is the
    KV cells a sequence attends to (the scores without flash attention). The output product runs on one row per
    sequence. ``device``: whose layers the backend runs (the host's; an RPC device's, on its rpc-server)."""
    tokens = min(rc.n_ubatch, rc.n_ctx_seq)
    best = 0
    for t, repacked in _host_weights(s, pl, device):
        rows = min(tokens, rc.n_parallel) if t.name == "output.weight" or t.role == "output" else tokens
        best = max(best, _matmul_work(s, t.name, t.ggml_type, t.shape, rows, n_threads, tiled, repacked))
    n_head = max(s.n_head, default=0)
    if device in pl.layer_device and n_head:
        dk, dv = max(s.key_length, 1), max(s.value_length, 1)
        if rc.flash_attn:  # ggml_graph_plan, GGML_OP_FLASH_ATTN_EXT: the larger of the prefill and decode scratch
            prefill = 4 * (FA_TILE * dk + 2 * FA_TILE * FA_TILE + 2 * FA_TILE * dv + FA_TILE * dk) * n_threads
            decode = 4 * (n_head * n_threads * (2 + dv) + n_threads * (dk + 2 * dv))
            best = max(best, prefill, decode)
        else:  # the V product converts the f32 KQ scores (cells x tokens x heads) to the V cache's f16
            best = max(best, _pad(2 * cells * tokens * n_head))
    return best + CACHE_LINE * n_threads if best else 0


def checkpoint_bytes(kv: KvInfo | None, n_parallel: int, n_swa: int) -> int:
    """One slot's context checkpoint: the sliding-window cells its window keeps (``n_swa`` of them, once the cache
    dropped those behind it) and its recurrent state (0 for a model whose caches all roll back)."""
    if kv is None:
        return 0
    swa = 0
    if kv.cells_swa:
        swa = kv.bytes_of("swa") * min(n_swa, kv.cells_swa) // (kv.cells_swa * max(1, n_parallel))
    return swa + kv.bytes_of("recurrent") // max(1, n_parallel)


def process_terms(s: GgufStructure, rc: ResolvedContext, pl: Placement, *, n_threads: int, tiled: bool,
                  cells: int, kv: KvInfo | None = None) -> tuple[ProcessTerm, ...]:
    """The five parts of the engine process's host memory that scale with ``s`` under ``rc`` (tokens of a filled
    context: ``rc.n_ctx``; its slots; ``kv``, its caches, for the checkpoints), each with its rule."""
    vocab = s.n_vocab * VOCAB_ENTRY_BYTES + s.n_merges * MERGE_BYTES
    tokens = min(rc.n_ctx, rc.n_ctx_seq * rc.n_parallel)  # every slot full
    work = work_buffer(s, rc, pl, n_threads=n_threads, tiled=tiled, cells=cells)
    one = checkpoint_bytes(kv, rc.n_parallel, s.n_swa)
    return (
        ProcessTerm("tokenizer", vocab,
                    f"rule: llama_vocab heap, {VOCAB_ENTRY_BYTES} B x {s.n_vocab} entries"
                    + (f" + {MERGE_BYTES} B x {s.n_merges} merges" if s.n_merges else "")),
        ProcessTerm("work buffer", work,
                    "rule: ggml cpu work buffer, the largest activation conversion of a "
                    f"{min(rc.n_ubatch, rc.n_ctx_seq)}-token ubatch ({n_threads} threads)"),
        ProcessTerm("context", tokens * CONTEXT_TOKEN_BYTES,
                    f"rule: server and KV cell heap, {CONTEXT_TOKEN_BYTES} B x {tokens} tokens of a filled context"),
        ProcessTerm("slots", max(0, rc.n_parallel - 1) * SLOT_BYTES,
                    f"rule: server slot heap, {SLOT_BYTES} B x {max(0, rc.n_parallel - 1)} slots beyond the first"),
        ProcessTerm("checkpoints", CHECKPOINTS_PER_SLOT * rc.n_parallel * one,
                    f"rule: server context checkpoints, {CHECKPOINTS_PER_SLOT} x {rc.n_parallel} slots x {one} B "
                    "(a slot's sliding-window cells and recurrent state)" if kv is not None else
                    "rule: none counted: the architecture's caches have no rules here (its KV comes from the dry run)"),
    )


def model_terms(s: GgufStructure, cfg: LoadConfig, host: HostBuffers, *, n_threads: int,
                tiled: bool) -> tuple[ProcessTerm, ...]:
    """``process_terms`` of ``s`` under ``cfg``, placed on ``host`` as the engine places it: a seat computing with
    ``n_threads`` threads, ``tiled`` where ggml's tiled K-quant path runs (x86 with AVX)."""
    rc = resolve_context(s, cfg)
    cells = rc.n_ctx if rc.kv_unified else rc.n_ctx_seq
    return process_terms(s, rc, place(s, cfg, host), n_threads=n_threads, tiled=tiled, cells=cells,
                         kv=None if s.unsupported else kv_layers(s, rc, cfg))
