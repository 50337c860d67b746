"""An RPC device's memory beyond the engine's buffers: what its rpc-server process holds for a seat. Pure.

A ``ggml-rpc-server`` runs the device's part of every graph on its own CPU backend, in its own process. Its PSS grows
by the buffers the seat allocates there (model, context, compute: the engine's own figures, priced per device) and
by parts of its own (ggml-rpc.cpp, ``rpc_serve_client`` and ``rpc_server``), two of which scale with the model:

- ``work buffer``: the server's CPU backend plans a work buffer per graph and keeps the largest, as a seat's own
  CPU backend does (``pricing/process.work_buffer``, over the layers the device runs, with the server's threads);
- ``input message``: every ubatch the client sends the device's inputs (``RPC_CMD_SET_TENSOR``), each received whole
  into a heap vector (``recv_msg``) before it is copied into the compute buffer, then freed; the heap keeps its
  pages. The largest is the activations entering the device (``n_embd`` x tokens, f32) or, on a device that runs
  attention, the mask (cells x tokens, f16 with flash attention, else f32).

The rest is not priced: the graph the server rebuilds and keeps (``stored_graphs``: a tensor header per node and
per tensor it references, about 0.3 MB for 250 nodes) and the graph's own message. Measured on a 200 MB llama
(8 layers of 960, F16) filled to 2,048 tokens, all layers on one rpc-server (``-t 1``): the server's PSS grew
4.96 MB beyond the traced buffers, of which the work buffer (2.69 MB, the ``ffn_down`` activations converted to F16)
and the largest input (1.97 MB) are 4.65 MB; ``bench/rpc_filled.py`` tables the price against the growth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from fitevict.pricing.backends import family
from fitevict.pricing.footprint import Footprint
from fitevict.pricing.gguf import GgufStructure
from fitevict.pricing.kv import resolve_context
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.placement import Placement
from fitevict.pricing.process import ProcessTerm, work_buffer
from fitevict.units import format_size

SERVER_THREADS = 1  # the threads fitevict starts an rpc-server with (engines/llama_cpp/rpcserver.start_rpc_server)
MASK_F16, MASK_F32 = 2, 4  # bytes per mask element: f16 under flash attention, else f32


def rpc_devices(cfg: LoadConfig) -> tuple[str, ...]:
    return tuple(d for d in cfg.devices if family(d) == "RPC")


def input_message(s: GgufStructure, cfg: LoadConfig, pl: Placement, device: str) -> int:
    """The largest tensor the client sends ``device`` in one ubatch (see the module doc); 0 where it runs no layer."""
    rc = resolve_context(s, cfg)
    if device not in pl.layer_device and pl.output_device != device:
        return 0
    tokens = min(rc.n_ubatch, rc.n_ctx_seq)
    activations = s.n_embd * tokens * 4
    cells = rc.n_ctx if rc.kv_unified else rc.n_ctx_seq
    attends = any(d == device and s.kinds.attention[il] for il, d in enumerate(pl.layer_device))
    mask = cells * tokens * (MASK_F16 if rc.flash_attn else MASK_F32) if attends else 0
    return max(activations, mask)


def server_terms(s: GgufStructure, cfg: LoadConfig, pl: Placement, device: str, *,
                 n_threads: int = SERVER_THREADS, tiled: bool = True) -> tuple[ProcessTerm, ...]:
    """The parts of ``device``'s rpc-server that scale with the model (see the module doc), each with its rule."""
    rc = resolve_context(s, cfg)
    cells = rc.n_ctx if rc.kv_unified else rc.n_ctx_seq
    work = work_buffer(s, rc, pl, n_threads=n_threads, tiled=tiled, cells=cells, device=device)
    msg = input_message(s, cfg, pl, device)
    return (
        ProcessTerm("work buffer", work, f"rule: the rpc-server's ggml cpu work buffer over {device}'s layers, the "
                                         f"largest of a {min(rc.n_ubatch, rc.n_ctx_seq)}-token ubatch "
                                         f"({n_threads} threads)"),
        ProcessTerm("input message", msg, "rule: the largest input a ubatch sends the rpc-server (activations or "
                                          "attention mask), received whole on its heap"),
    )


def with_rpc_servers(fp: Footprint, terms: Mapping[str, Sequence[ProcessTerm]]) -> Footprint:
    """``fp`` with each RPC device's rpc-server parts (``terms``) in that device's ``overhead``, beside its
    buffers."""
    add: dict[str, int] = {}
    notes = list(fp.notes)
    for dev, ts in terms.items():
        n = sum(t.bytes for t in ts)
        if fp.device(dev) is None or n <= 0:
            continue
        add[dev] = n
        notes += [f"{dev} includes {format_size(t.bytes)} of its rpc-server's {t.name} ({t.rule})" for t in ts
                  if t.bytes]
    if not add:
        return fp
    merged = dict(fp.overhead)
    for dev, n in add.items():
        merged[dev] = merged.get(dev, 0) + n
    return replace(fp, overhead=tuple(merged.items()), notes=tuple(notes))


def rpc_server_parts(s: GgufStructure, cfg: LoadConfig, pl: Placement, *, n_threads: int = SERVER_THREADS,
                     tiled: bool = True) -> dict[str, tuple[ProcessTerm, ...]]:
    """``server_terms`` of every RPC device of ``cfg``."""
    return {d: server_terms(s, cfg, pl, d, n_threads=n_threads, tiled=tiled) for d in rpc_devices(cfg)}
