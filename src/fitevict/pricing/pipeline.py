"""What the engine's dry run reserves on a device that takes over from another device, and its load does not.

The compute term of a placement is the engine's own dry run (``engines/dryrun``): llama-server's fit step builds the
context with ``no_alloc`` and logs ``sched_reserve: <buft> compute buffer size``. Where two devices meet, that
figure is not what the load reserves (llama.cpp 0c1e570):

- **the norm pinned to its layer's device**: ``llama_context::graph_get_cb`` (llama-context.cpp) sets every
  ``norm-<il>`` tensor to the backend of layer ``il``'s device (``ggml_backend_sched_set_tensor_backend``) when
  ``ubatch.n_tokens < 32 || full_offload`` (``full_offload = model.n_gpu_layers() > hparams.n_layer_all``);
- **the dry run drops it**: the load reserves with ``ggml_backend_sched_reserve`` (ggml-backend.cpp: split, then
  allocate), but the dry run's first prompt-graph reserve, the one whose sizes it logs, calls
  ``ggml_backend_sched_reserve_size``, which begins with ``ggml_backend_sched_reset``: the build's assignments are
  wiped (``hv_tensor_backend_ids`` set to -1), and the scheduler's own pass 2 ("expand gpu down") gives
  ``norm-<il>`` to the *previous* layer's device. The split of the next device then takes two inputs from its
  predecessor (``norm-<il>`` and the residual ``l_out-<il-1>``) where the load takes one. (llama.cpp PR 17232 took
  the same reset out of ``ggml_backend_sched_reserve``; the size-only path of the pinned build still has it. An
  engine without it makes the dry run equal to the load, and tests/engines/test_device_price.py then fails.)
- **each input is copied ``n_copies`` times**: with pipeline parallelism (llama-context.cpp: more than one device,
  ``n_gpu_layers() > n_layer_all``, split mode layer, ``offload_kqv``, no tensor overrides, every non-CPU device
  with async compute and events) the scheduler has ``n_copies = GGML_SCHED_MAX_COPIES`` (4) copies of every split
  input, marked input and output so that ggml-alloc never reuses them (``ggml_backend_sched_split_graph``, pass 5).

So with pipeline parallelism the dry run over-states the compute buffer of a device whose first layer follows a
layer on another (non-CPU) device by ``n_copies`` padded ``norm-<il>`` tensors (f32, ``n_embd`` by the prompt
graph's tokens) per such boundary: 4 x 0.75 MiB on a 384-wide model at ``-ub 512``. Seen: a 3-layer llama at
``-dev RPC0,RPC1 -ts 1,3``, RPC1's dry run 13.04 MiB, its load 10.04 MiB. A device after the CPU is not affected
(pass 2 never expands from the CPU, so the norm lands on the device in both). Without pipeline parallelism the one
extra input is freed and its room reused, and the difference is the allocator's layout: seen within one norm tensor
either way (``-nkvo``: -0.50, +0.37, -0.37 MiB and three times nothing on the zoo; ``-ot``: +0.5 MiB), said in a
note, not priced.

Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitevict.pricing.backends import family
from fitevict.pricing.footprint import HOST
from fitevict.pricing.ggml_types import pad
from fitevict.pricing.gguf import GgufStructure
from fitevict.pricing.kv import ResolvedContext
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.placement import Placement

GGML_SCHED_MAX_COPIES = 4  # ggml/CMakeLists.txt: the pinned build's default (its CMakeCache says 4)
NORM_PIN_TOKENS = 32  # graph_get_cb: the norm is pinned when the ubatch has fewer tokens than this
F32 = 4
# Backend families whose devices report async compute and events (``get_props`` caps), as pipeline parallelism needs:
# ggml-cuda (ROCm builds it too; without GGML_CUDA_NO_PEER_COPY), ggml-vulkan, ggml-rpc, ggml-metal, ggml-sycl.
# ggml-cann (no async) and ggml-opencl (neither) are not.
ASYNC_EVENTS = frozenset({"CUDA", "ROCm", "Vulkan", "RPC", "Metal", "SYCL"})


@dataclass(frozen=True, slots=True)
class DryRunExcess:
    """Bytes the dry run reserved on ``device`` that the load does not, and why."""

    device: str
    bytes: int
    why: str


def pipeline_copies(s: GgufStructure, cfg: LoadConfig, pl: Placement) -> int:
    """The scheduler's copies of each split input: ``GGML_SCHED_MAX_COPIES`` when llama-context.cpp enables pipeline
    parallelism for this placement, else 1."""
    ngl = cfg.n_gpu_layers if cfg.n_gpu_layers >= 0 else s.n_layer + 1  # llama_model::n_gpu_layers(), unclamped
    parallel = (len(cfg.devices) > 1 and ngl > s.n_layer and cfg.kv_offload
                and not (cfg.tensor_overrides or cfg.n_cpu_moe)  # --n-cpu-moe is a tensor override too
                and all(family(d) in ASYNC_EVENTS for d in cfg.devices))
    return GGML_SCHED_MAX_COPIES if parallel else 1


def prompt_tokens(rc: ResolvedContext) -> int:
    """The tokens of the prompt graph ``sched_reserve`` sizes: ``min(n_ctx, n_ubatch)``, rounded up to a multiple
    of the sequences (``graph_reserve``)."""
    n_tokens, n_seqs = min(rc.n_ctx, rc.n_ubatch), max(rc.n_parallel, 1)
    return -(-n_tokens // n_seqs) * n_seqs


def norm_pinned(s: GgufStructure, cfg: LoadConfig, rc: ResolvedContext) -> bool:
    """``graph_get_cb``'s condition: the load pins each layer's norm to that layer's device."""
    ngl = cfg.n_gpu_layers if cfg.n_gpu_layers >= 0 else s.n_layer + 1
    return prompt_tokens(rc) < NORM_PIN_TOKENS or ngl > s.n_layer


def handovers(pl: Placement) -> list[tuple[int, str, str]]:
    """(layer, its device, the previous layer's device) wherever a layer follows a layer on another device, neither
    on the CPU: where the dry run's scheduler gives the layer's norm to the previous device."""
    devs = pl.layer_device
    return [(il, devs[il], devs[il - 1]) for il in range(1, len(devs))
            if devs[il] != devs[il - 1] and HOST not in (devs[il], devs[il - 1])]


def dry_run_excess(s: GgufStructure, cfg: LoadConfig, rc: ResolvedContext,
                   pl: Placement) -> tuple[tuple[DryRunExcess, ...], tuple[str, ...]]:
    """Per device, the bytes of pinned-norm copies the dry run reserved and the load does not (pipeline parallelism
    only, see the module doc); and notes for the handovers whose difference is the allocator's layout (no pipeline
    parallelism), with the bound."""
    if not norm_pinned(s, cfg, rc):
        return (), ()
    copies = pipeline_copies(s, cfg, pl)
    out: dict[str, int] = {}
    notes: list[str] = []
    for il, dev, prev in handovers(pl):
        norm = pad(s.n_embd * prompt_tokens(rc) * F32, pl.rules(dev).alignment)
        if copies > 1:
            out[dev] = out.get(dev, 0) + copies * norm
        else:
            notes.append(f"{dev}'s compute from the dry run may differ from the load (seen within one norm, {norm} "
                         f"bytes, either way): its reserve gives layer {il}'s norm to {prev} "
                         "(ggml_backend_sched_reserve_size resets the norm's pinned backend), and without pipeline "
                         "parallelism the allocator's layout decides")
    return tuple(DryRunExcess(d, b, f"{d}: the dry run's compute less {b} bytes: {copies} pipeline copies of the "
                                    "norm(s) its reserve gives the previous device (ggml_backend_sched_reserve_size "
                                    "resets the backend graph_get_cb pins them to); the load keeps them on "
                                    f"{d}") for d, b in out.items()), tuple(notes)
