"""price(structure, cfg) -> Pricing: a model's Footprint under one llama-server configuration.

Model, context and adapter (LoRA buffer, lora.py) terms are exact (placement.py, kv.py); for an architecture without KV rules the context is
the caches the engine's dry run sized (source "dry-run"). The output buffer is exact (an embeddings seat at its
peak, ``Pricing.output_at_load`` is the buffer the load log prints); the compute buffer
comes from the engine's dry run when the caller passes it (source "dry-run"), else from a labelled
formula (source "formula") meant to over-state rather than under-state. Pure and fast: the planner
calls it inside searches over ctx and -ngl.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fitevict.pricing.backends import BackendRules
from fitevict.pricing.footprint import HOST, ZERO_FORMULA, DeviceFootprint, Footprint, Term
from fitevict.pricing.gguf import GgufStructure, PricingError
from fitevict.pricing.kv import KvInfo, KvLayer, ResolvedContext, kv_layers, output_bytes, resolve_context
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.logparse import DryContext, split_evenly
from fitevict.pricing.hostbufs import HostBuffers
from fitevict.pricing.lora import LoraAdapter, adapters_bytes
from fitevict.pricing.pipeline import dry_run_excess
from fitevict.pricing.placement import Buffer, Placement, place


@dataclass(frozen=True, slots=True)
class Pricing:
    """The priced footprint plus the configuration values llama.cpp resolves."""

    footprint: Footprint
    n_ctx: int
    n_ctx_seq: int
    n_parallel: int
    kv_unified: bool
    n_gpu_layers: int
    flash_attn: bool
    n_ubatch: int
    n_batch: int
    kv: KvInfo | None
    buffers: tuple[Buffer, ...]  # model buffers as llama.cpp names them (CPU_Mapped, CPU_REPACK, CUDA0, ...)
    warnings: tuple[str, ...] = ()
    output_at_load: int = 0  # the output buffer the load reserves (the log's line); the footprint holds its peak
    context_source: str = "formula"  # "dry-run" when the caches come from the engine's dry run
    host_buffers: str = ""  # where the extra host buffer rules came from (probe or rule table, and on what)
    device_rules: tuple[tuple[str, str, str], ...] = ()  # (device, its buffer name, where its backend's rules came from)

    def config_json(self, cfg: LoadConfig) -> dict:
        return {
            "n_ctx": self.n_ctx, "n_ctx_seq": self.n_ctx_seq, "parallel": self.n_parallel,
            "kv_unified": self.kv_unified, "n_gpu_layers": self.n_gpu_layers, "n_cpu_moe": cfg.n_cpu_moe,
            "cache_type_k": cfg.cache_type_k, "cache_type_v": cfg.cache_type_v, "flash_attn": self.flash_attn,
            "ubatch": self.n_ubatch, "batch": self.n_batch, "mmap": cfg.mmap, "embeddings": cfg.embeddings,
            "tensor_overrides": [f"{p}={b}" for p, b in cfg.tensor_overrides],
        }


FORMULA_MARGIN = 1.10  # the formula is a fallback: it should over-state, never under-state


def compute_formula(s: GgufStructure, rc: ResolvedContext, kv: KvInfo | None) -> int:
    """A labelled estimate of one device's compute buffer, sized after the largest live tensors of one ubatch.

    The graph allocator reuses memory, so the peak is a handful of activations: a few n_embd / n_ff rows
    per token, the logits of the outputs, an f16 KQ mask per KV cache (base and SWA) and, without flash
    attention, the f32 KQ scores (cells x ubatch x heads); recurrent layers add their in-projection's rows
    (mamba's ssm_in, lfm2's short-conv in_proj) and the conv / scan rows, MoE the tokens' rows gathered per expert
    used and the router's logits; a pure recurrent model has no FFN
    rows. The FFN rows are the widest of the dense FFN, the routed experts (n_ff_exp x experts used) and the
    shared expert; the attention rows are q over all heads (explicit head sizes and MLA's latent heads can exceed n_embd). Used only when no
    dry run is available; on the demo zoo it lands between the engine's dry run and twice it.
    """
    ub = rc.n_ubatch
    n_head = max(s.n_head, default=0)
    # FFN rows per token: the dense FFN, the routed experts' (n_ff_exp each) or the shared expert's
    used = max(s.expert_used_count, 1)
    ff = max((t.shape[1] * (used if t.expert else 1) for t in s.tensors
              if len(t.shape) > 1 and t.name.endswith(("ffn_up.weight", "ffn_up_exps.weight", "ffn_up_shexp.weight"))),
             default=0 if s.is_recurrent else 4 * s.n_embd)  # mamba / rwkv blocks have no FFN
    # attention rows per token: q over all heads (explicit head sizes, MLA's latent heads may exceed n_embd)
    width = max(s.n_embd, n_head * max(s.key_length, s.key_length_swa))
    cells = kv.cells if kv else 0
    cells_swa = kv.cells_swa if kv else 0
    acts = 4 * ub * (4 * width + 3 * ff)
    logits = 4 * s.n_vocab * (min(ub, rc.n_parallel) + 2)
    masks = 2 * ub * (cells + cells_swa)
    # without flash attention the f32 KQ scores of a base and an SWA layer may be live together
    scores = 0 if rc.flash_attn else 4 * (cells + cells_swa) * ub * n_head
    # MoE: each token's input is gathered once per expert used, beside the router's logits
    moe = 4 * ub * (s.n_embd * used + s.expert_count) if any(t.expert for t in s.tensors) else 0
    # recurrent layers: the in-projection's rows (mamba's ssm_in, lfm2's shortconv in_proj), the conv and scan rows
    proj = max((t.shape[1] for t in s.tensors if len(t.shape) > 1
                and t.name.endswith(("ssm_in.weight", "shortconv.in_proj.weight"))), default=0)
    ssm = 4 * ub * (proj + 3 * s.ssm_d_inner) if kv and kv.layers_recurrent else 0
    return int((acts + logits + masks + scores + moe + ssm) * FORMULA_MARGIN)


def kv_from_dry_run(dry: DryContext) -> KvInfo:
    """KvInfo from the caches the engine's dry run sized: each cache's printed K / V (R / S) bytes split evenly
    over its layers."""
    layers: list[KvLayer] = []
    for c in dry.caches:
        n = len(c.layers)
        for (il, _dev), k, v in zip(c.layers, split_evenly(c.first_bytes, n), split_evenly(c.bytes - c.first_bytes, n),
                                    strict=True):
            layers.append(KvLayer(il, c.kind, c.cells, k, v))
    first = {c.kind: c.cells for c in reversed(dry.caches)}
    return KvInfo(
        cells=first.get("full", 0), cells_swa=first.get("swa", 0),
        layers_full=sum(1 for x in layers if x.kind == "full"), layers_swa=sum(1 for x in layers if x.kind == "swa"),
        layers_recurrent=sum(1 for x in layers if x.kind == "recurrent"),
        layers=tuple(sorted(layers, key=lambda x: (x.kind == "recurrent", x.kind == "swa", x.il))),
    )


def _context(s: GgufStructure, rc: ResolvedContext, cfg: LoadConfig, pl: Placement,
             context: DryContext | None) -> tuple[KvInfo | None, dict[str, int], str, str]:
    """The caches (KV, SWA, recurrent) per device, their source, and why they are unavailable (or "")."""
    ctx_by_dev: dict[str, int] = {}
    kv: KvInfo | None = None
    ctx_reason = ""
    ctx_source = "formula"
    try:
        kv = kv_layers(s, rc, cfg)
    except PricingError as err:
        if not s.unsupported:
            raise
        if context is not None and context.caches:
            # the caches' per-layer bytes do not depend on the placement: each layer's share goes to the device
            # this placement gives the layer, whichever placement the dry run itself used
            kv, ctx_source = kv_from_dry_run(context), "dry-run"
        else:
            ctx_reason = f"{err}; no dry run of the engine sized it"
    if kv is not None:
        for layer in kv.layers:  # -nkvo: every cache in host memory (a plain CPU buffer)
            dev = pl.layer_device[layer.il] if cfg.kv_offload else HOST
            ctx_by_dev[dev] = ctx_by_dev.get(dev, 0) + layer.bytes

    return kv, ctx_by_dev, ctx_source, ctx_reason


def price(
    s: GgufStructure,
    cfg: LoadConfig,
    *,
    compute: Mapping[str, int] | None = None,
    context: DryContext | None = None,
    host: HostBuffers,
    loras: Mapping[str, LoraAdapter] | None = None,
    backends: Mapping[str, BackendRules] | None = None,
    buffer_names: Mapping[str, str] | None = None,
) -> Pricing:
    """Price ``s`` under ``cfg``. ``compute`` (device -> bytes, e.g. from ``dry_run_compute``) overrides the
    compute term with source "dry-run". ``context`` (the caches the same dry run sized) prices the context of an
    architecture fitevict has no KV rules for, with source "dry-run"; for a known architecture the exact rules
    win. ``host`` is the machine's extra host buffer table (``host.machine.host_buffers()`` reads this one's).
    ``loras``: the headers of ``cfg.loras`` already read (path -> adapter); without them they are read here.
    ``backends``: each device's rules as its probe learned them (``pricing/backends``; else its family's rule),
    ``buffer_names``: each device's buffer name as the engine lists it (RPC: ``RPC0[HOST:PORT]``).
    Raises PricingError for a configuration llama.cpp refuses."""
    rc = resolve_context(s, cfg)
    pl: Placement = place(s, cfg, host, backends, buffer_names)
    warnings = [*rc.warnings, *pl.warnings]
    if cfg.n_cpu_moe and not s.is_moe:
        warnings.append(f"--n-cpu-moe {cfg.n_cpu_moe} has no effect: {s.arch} has no experts")

    kv, ctx_by_dev, ctx_source, ctx_reason = _context(s, rc, cfg, pl, context)

    model_by_dev: dict[str, int] = {}
    for b in pl.buffers:
        model_by_dev[b.device] = model_by_dev.get(b.device, 0) + b.bytes

    names = frozenset(t.name for t in s.tensors) if cfg.loras else frozenset()
    lora_by_dev = adapters_bytes(cfg.loras, pl, tuple(cfg.devices), s.arch, names, loras) if cfg.loras else {}
    # a named device that holds no layer still holds the compute buffer the dry run reserved there: the engine
    # runs a CPU layer's large ops on it (seen on CUDA0 with -ngl 0: 4.72 MiB of compute and the CUDA context)
    devices = [HOST, *(d for d in cfg.devices if d in model_by_dev or d in ctx_by_dev or d in lora_by_dev
                       or (compute is not None and compute.get(d)))]
    out_dev = HOST  # the output buffer lives in host memory (the output device's host buffer when offloaded)
    # a device host buffer (Vulkan_Host) adds its own bytes to the allocation
    out_extra = pl.rules(pl.output_device).host_extra if pl.output_device != HOST else 0
    out_b = output_bytes(s, rc, cfg.embeddings) + out_extra
    # the dry run's reserve counts pipeline copies of a pinned norm the load keeps on its own device (pricing/pipeline)
    excess, excess_notes = dry_run_excess(s, cfg, rc, pl) if compute is not None else ((), ())
    less = {e.device: e.bytes for e in excess if e.device in (compute or {})}
    warnings += [e.why for e in excess if e.device in less] + list(excess_notes)
    dfs: list[DeviceFootprint] = []
    for d in devices:
        if compute is not None and d in compute:
            comp = Term(max(int(compute[d]) - less.get(d, 0), 0), "dry-run")
        elif s.unsupported:
            comp = Term.unavailable(f"no dry run and {s.unsupported}")
        else:
            comp = Term(compute_formula(s, rc, kv), "formula")
        ctx_t = Term.unavailable(ctx_reason) if ctx_reason else Term(ctx_by_dev.get(d, 0), ctx_source)  # type: ignore[arg-type]
        dfs.append(DeviceFootprint(
            name=d,
            model=Term(model_by_dev.get(d, 0), "formula"),
            context=ctx_t,
            compute=comp,
            output=Term(out_b if d == out_dev else 0, "formula"),
            adapters=Term(lora_by_dev.get(d, 0), "formula") if cfg.loras else ZERO_FORMULA,
        ))
    mapped = sum(b.bytes for b in pl.buffers if b.mapped)
    host_df = dfs[0]
    committed = host_df.total_bytes - mapped
    fp = Footprint(devices=tuple(dfs), host_mapped_bytes=mapped, host_committed_bytes=committed,
                   host_source="formula", notes=tuple(warnings))
    return Pricing(
        footprint=fp, n_ctx=rc.n_ctx, n_ctx_seq=rc.n_ctx_seq, n_parallel=rc.n_parallel, kv_unified=rc.kv_unified,
        n_gpu_layers=pl.n_gpu_layers if cfg.devices else 0, flash_attn=rc.flash_attn, n_ubatch=rc.n_ubatch,
        n_batch=rc.n_batch, kv=kv, buffers=pl.buffers, warnings=tuple(warnings),
        output_at_load=output_bytes(s, rc, cfg.embeddings, at_load=True) + out_extra, context_source=ctx_source,
        host_buffers="none (-nr)" if not cfg.repack else host.label(),
        device_rules=tuple((b.device, b.buffer, b.rules.label()) for b in pl.backends),
    )
