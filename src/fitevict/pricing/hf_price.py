"""price_hf(structure, cfg) -> HfPricing: a transformers model's Footprint under one load configuration. Pure.

Weights are the safetensors headers' bytes, tensor by tensor, as the load will hold them:

- stored as they are (``--dtype auto``, and every tensor of a GPTQ/AWQ-packed checkpoint: ``qweight``, ``qzeros``,
  ``scales`` and ``g_idx`` are held as stored);
- cast: floating tensors at the ``--dtype``'s element size;
- bitsandbytes (``--quant bnb4|bnb8``): the linear layers bnb converts become packed weights plus their quant
  state, which lives outside ``parameters()`` (4-bit: absmax per 64-value block and a 16-entry code book; with
  double quantization a u8 absmax, an offset and a nested state of f32 absmax per 256 blocks and a 256-entry code
  book; 8-bit: an int8 weight and one f32 scale per row). Embeddings, the output head, fused MoE experts and
  routers stay unquantized, at the load dtype.

Beside the weights the model holds its rotary tables (``inv_freq`` and ``original_inv_freq``, f32, always) and a
diffusers pipeline its scheduler's tables. The KV cache comes from config.json (hf_kv); compute (activations and
logits) is a labelled formula. A load that keeps the stored dtype on the CPU stays memory-mapped: its weights are
page cache (mapped), everything else is committed. PEFT adapters the seat loads at start (``--adapter``) are
their own term, ``adapters``, priced from their headers (pricing.peft).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from fitevict.pricing.footprint import HOST, DeviceFootprint, Footprint, Term
from fitevict.pricing.gguf import PricingError
from fitevict.pricing.hf_kv import HfKv, head_dim, hf_kv, text_config, training_context
from fitevict.pricing.peft import PeftAdapter, adapted_module, held_bytes
from fitevict.pricing.safetensors import DTYPE_BYTES, FLOAT_DTYPES, TORCH_DTYPES, HfStructure, StTensor

Quant = Literal["none", "bnb4", "bnb8"]
QUANTS: tuple[str, ...] = ("none", "bnb4", "bnb8")
DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")
BNB4_BLOCK = 64  # bitsandbytes' 4-bit blocksize on every backend transformers uses
BNB_NESTED_BLOCK = 256  # the double-quant state's blocksize
_LAYER = re.compile(r"^(.*?\.(?:layers|h|blocks|block)\.\d+)\.")
_EMBED = ("embed", "wte", "wpe", "word_embeddings", "position_embeddings", "shared.weight")
_OUTPUT = ("lm_head.", "embed_out.", "output.weight")


@dataclass(frozen=True, slots=True)
class HfLoadConfig:
    """One transformers load: context, dtype, quantization and placement, named as the seat's flags."""

    n_ctx: int = 4096  # -c; 0 = the model's training context
    dtype: str = "auto"  # --dtype: auto (as stored) | float32 | bfloat16 | float16
    quant: Quant = "none"  # --quant
    bnb4_double_quant: bool = False  # bnb_4bit_use_double_quant
    device_map: str = "cpu"  # --device-map: cpu | CUDA0 (all on one GPU) | split (GPUs by max_memory, rest CPU)
    max_memory: tuple[tuple[str, int], ...] = ()  # for split: GPU name -> bytes of weights it may take
    n_seq: int = 1  # sequences cached at once (the seat serves one request at a time)
    embeddings: bool = False
    adapters: tuple[str, ...] = ()  # --adapter DIR per PEFT adapter the seat loads at start, in request-id order

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise PricingError(f"--dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.quant not in QUANTS:
            raise PricingError(f"--quant {self.quant!r} is not one of {', '.join(QUANTS)}")
        if self.device_map != "cpu" and self.device_map != "split" and not self.device_map.startswith("CUDA"):
            raise PricingError(f"--device-map {self.device_map!r}: use cpu, a GPU name (CUDA0) or split")
        if self.device_map == "split" and not self.max_memory:
            raise PricingError("--device-map split needs --max-memory GPU=BYTES for at least one GPU")

    @property
    def gpus(self) -> tuple[str, ...]:
        if self.device_map == "split":
            return tuple(d for d, _ in self.max_memory)
        return () if self.device_map == "cpu" else (self.device_map,)

    def to_json(self) -> dict:
        return {"n_ctx": self.n_ctx, "dtype": self.dtype, "quant": self.quant,
                "bnb4_double_quant": self.bnb4_double_quant, "device_map": self.device_map,
                "max_memory": dict(self.max_memory), "n_seq": self.n_seq, "embeddings": self.embeddings,
                **({"adapters": list(self.adapters)} if self.adapters else {})}


@dataclass(frozen=True, slots=True)
class WeightPlan:
    """One tensor as the load holds it: where, how many bytes, and why (stored, cast, bnb4, bnb8)."""

    name: str
    group: str  # the module the placement moves as a whole (a layer, the embeddings, ...)
    kind: str
    bytes: int
    quant_state_bytes: int = 0


@dataclass(frozen=True, slots=True)
class HfPricing:
    footprint: Footprint
    weights: tuple[WeightPlan, ...]
    extra_buffers: tuple[tuple[str, int], ...]  # (what, bytes): rotary tables, scheduler tables
    kv: HfKv | None
    n_ctx: int
    compute_formula: str
    placement: tuple[tuple[str, str], ...]  # module group -> device, in load order
    warnings: tuple[str, ...] = field(default=())
    checkpoint_mapped_bytes: int = 0  # the checkpoint a bnb load keeps mapped beside its quantized weights

    @property
    def weight_bytes(self) -> int:
        return sum(w.bytes + w.quant_state_bytes for w in self.weights)

    @property
    def host_model_bytes(self) -> int:
        """The model's host memory, KV and compute aside: its CPU model term plus the checkpoint a bnb load keeps
        mapped (what the seat's committed memory and the model files' mapped pages should show)."""
        cpu = self.footprint.device(HOST)
        return (cpu.model.value if cpu else 0) + self.checkpoint_mapped_bytes

    @property
    def model_bytes(self) -> int:
        """What the seat's object walk should find: weights, quant state and the extra buffers."""
        return self.weight_bytes + sum(b for _, b in self.extra_buffers)


def load_dtype(s: HfStructure, cfg: HfLoadConfig) -> str:
    """The safetensors dtype floating weights are held in: the --dtype, else as stored."""
    if cfg.dtype != "auto":
        return TORCH_DTYPES[cfg.dtype]
    declared = text_config(s.config).get("dtype") or text_config(s.config).get("torch_dtype")
    return TORCH_DTYPES.get(str(declared), s.stored_dtype or "F32")


def bnb_converts(s: HfStructure, t: StTensor) -> bool:
    """Whether transformers' bitsandbytes integration replaces this tensor's layer (an nn.Linear weight)."""
    n = t.name
    if len(t.shape) != 2 or not n.endswith(".weight") or any(e in n for e in _EMBED):
        return False
    if n.startswith(_OUTPUT) or ".experts." in n:  # the output head; experts are fused 3-D parameters
        return False
    c = text_config(s.config)
    n_experts = c.get("num_local_experts") or c.get("num_experts")
    return not (n.endswith(".gate.weight") and n_experts and t.shape[0] == int(n_experts))  # a MoE router


def bnb4_state_bytes(numel: int, double_quant: bool) -> int:
    """A 4-bit layer's quant_state: absmax per 64-value block and a 16-entry f32 code book; double quantization
    stores absmax as u8 plus an f32 offset and a nested state (f32 absmax per 256 blocks, 256-entry code book)."""
    blocks = math.ceil(numel / BNB4_BLOCK)
    if not double_quant:
        return 4 * blocks + 16 * 4
    return blocks + 4 + 4 * math.ceil(blocks / BNB_NESTED_BLOCK) + 256 * 4 + 16 * 4


def group_of(name: str) -> str:
    """The module a tensor moves with: its numbered layer, else its parent module."""
    if m := _LAYER.match(name):
        return m.group(1)
    return name.rsplit(".", 1)[0] if "." in name else name


def plan_weights(s: HfStructure, cfg: HfLoadConfig) -> tuple[WeightPlan, ...]:
    """Every stored tensor as the load holds it."""
    held = load_dtype(s, cfg)
    prequant = s.quant_method is not None
    out: list[WeightPlan] = []
    for t in s.tensors:
        g = group_of(t.name)
        if prequant or t.dtype not in FLOAT_DTYPES:
            out.append(WeightPlan(t.name, g, "stored", t.nbytes))
        elif cfg.quant == "bnb4" and bnb_converts(s, t):
            out.append(WeightPlan(t.name, g, "bnb4", (t.numel + 1) // 2, bnb4_state_bytes(t.numel, cfg.bnb4_double_quant)))
        elif cfg.quant == "bnb8" and bnb_converts(s, t):
            out.append(WeightPlan(t.name, g, "bnb8", t.numel, 4 * t.shape[0]))
        elif held == t.dtype:
            out.append(WeightPlan(t.name, g, "stored", t.nbytes))
        else:
            out.append(WeightPlan(t.name, g, "cast", t.numel * DTYPE_BYTES[held]))
    return tuple(out)


def extra_buffers(s: HfStructure) -> tuple[tuple[str, int], ...]:
    """Tensors the load creates that no file stores: rotary tables, a diffusers scheduler's tables."""
    if s.kind == "diffusers":
        out = []
        for name, c in s.components.items():
            steps = c.get("num_train_timesteps")
            if steps and str(c.get("_class_name", "")).endswith("Scheduler"):
                # betas, alphas, alphas_cumprod (f32), timesteps (i64), one f32 scalar (one / final_alpha_cumprod)
                out.append((f"{name}: betas, alphas, alphas_cumprod, timesteps, final alpha", 3 * 4 * steps + 8 * steps + 4))
        return tuple(out)
    c = text_config(s.config)
    if not any(k in c for k in ("rope_theta", "rope_parameters", "rope_scaling")):
        return ()
    rope = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), Mapping) else {}
    partial = float(c.get("partial_rotary_factor") or rope.get("partial_rotary_factor") or 1.0)  # type: ignore[union-attr]
    half = int(head_dim(c) * partial) // 2
    return (("rotary inv_freq + original_inv_freq (f32)", 2 * half * 4),)


def place_groups(weights: tuple[WeightPlan, ...], cfg: HfLoadConfig) -> tuple[tuple[str, str], ...]:
    """Module group -> device, in load order. split: GPUs take whole groups in order until their max_memory is
    spent, the rest stays on the CPU (the seat passes this same map to from_pretrained)."""
    sizes: dict[str, int] = {}
    for w in weights:
        sizes[w.group] = sizes.get(w.group, 0) + w.bytes + w.quant_state_bytes

    def order(g: str) -> tuple[int, int, str]:
        m = re.search(r"\.(\d+)$", g) if _LAYER.match(g + ".") else None
        if m:
            return (1, int(m.group(1)), g)
        return (0 if any(e in g for e in _EMBED) else 2, 0, g)

    groups = sorted(sizes, key=order)
    if cfg.device_map == "cpu":
        return tuple((g, HOST) for g in groups)
    if cfg.device_map != "split":
        return tuple((g, cfg.device_map) for g in groups)
    room = [[d, b] for d, b in cfg.max_memory]
    out: list[tuple[str, str]] = []
    i = 0
    for g in groups:
        while i < len(room) and sizes[g] > room[i][1]:
            i += 1
        if i < len(room):
            room[i][1] -= sizes[g]
            out.append((g, str(room[i][0])))
        else:
            out.append((g, HOST))
    return tuple(out)


def compute_bytes(s: HfStructure, cfg: HfLoadConfig, n_ctx: int) -> tuple[int | None, str]:
    """A labelled estimate of activations and logits for one full-context prefill (None: not priced, and why)."""
    if s.kind == "diffusers":
        return None, "a diffusers pipeline's activations depend on the image size it is asked for; not priced"
    c = text_config(s.config)
    act = DTYPE_BYTES[load_dtype(s, cfg)]
    hidden = int(c.get("hidden_size") or 0)
    used = int(c.get("num_experts_per_tok") or 1)
    ff = int(c.get("moe_intermediate_size") or 0) * used or int(c.get("intermediate_size") or 4 * hidden)
    vocab = int(c.get("vocab_size") or 0)
    acts = n_ctx * (4 * hidden + 3 * ff) * act
    logits = 2 * 4 * vocab * (n_ctx if cfg.embeddings else 1)
    return acts + logits, (f"n_ctx {n_ctx} x (4 x hidden {hidden} + 3 x ffn {ff}) x {act} B + "
                           f"2 x f32 logits of {vocab} tokens (SDPA kernels keep scores out of memory)")


def adapters_by_device(adapters: tuple[PeftAdapter, ...], s: HfStructure, cfg: HfLoadConfig,
                       where: Mapping[str, str], first: str) -> dict[str, int]:
    """The PEFT adapters' bytes per device: each tensor as the seat holds it (pricing.peft), where the module it
    adapts was placed."""
    out: dict[str, int] = {}
    dtype = load_dtype(s, cfg)
    for a in adapters:
        for t in a.tensors:
            d = where.get(group_of(adapted_module(t.name) + ".weight"), first)
            out[d] = out.get(d, 0) + held_bytes(t, dtype)
    return out


def price_hf(s: HfStructure, cfg: HfLoadConfig, *, overhead_bytes: int | None = None,
             adapters: tuple[PeftAdapter, ...] = ()) -> HfPricing:
    """Price ``s`` under ``cfg``. ``overhead_bytes``: the seat process's own host memory, measured once per
    engine; added to the host's committed bytes with a note (absent: not counted, and said). ``adapters``: the
    PEFT adapters of ``cfg.adapters``, read (``pricing.peft.load_peft_adapter``), priced as their own term."""
    warnings: list[str] = [*s.warnings]
    if s.quant_method and cfg.quant != "none":
        raise PricingError(f"{s.path} is already quantized ({s.quant_method}); --quant {cfg.quant} cannot apply")
    if s.quant_method:
        warnings.append(f"{s.quant_method}-packed checkpoint: every tensor counted as stored")
    n_ctx = cfg.n_ctx or (training_context(s.config) or 0)
    if not s.pipeline and n_ctx <= 0:
        raise PricingError(f"{s.path}: -c 0 asks for the training context, but config.json has no "
                           "max_position_embeddings; give -c")
    weights = plan_weights(s, cfg)
    placement = place_groups(weights, cfg)
    where = dict(placement)
    extras = extra_buffers(s)
    first = placement[0][1] if placement else HOST
    model_by: dict[str, int] = {}
    for w in weights:
        d = where[w.group]
        model_by[d] = model_by.get(d, 0) + w.bytes + w.quant_state_bytes
    for _, b in extras:
        model_by[first] = model_by.get(first, 0) + b

    kv = None
    ctx_by: dict[str, int] = {}
    comp, formula = compute_bytes(s, cfg, n_ctx)
    if not s.pipeline and not cfg.embeddings:
        kv = hf_kv(s.config, n_ctx, DTYPE_BYTES[load_dtype(s, cfg)], cfg.n_seq)  # K/V in the activations' dtype
        layer_devs = [d for g, d in placement if _LAYER.match(g + ".")] or [first]
        for i, share in enumerate(_split(kv.total_bytes, len(layer_devs))):
            ctx_by[layer_devs[i]] = ctx_by.get(layer_devs[i], 0) + share
    comp_dev = cfg.gpus[0] if cfg.gpus and any(d != HOST for d in where.values()) else HOST
    devices = [HOST, *(g for g in cfg.gpus if g in model_by or g in ctx_by)]

    def comp_term(d: str) -> Term:
        if d != comp_dev:
            return Term(0, "formula")
        return Term.unavailable(formula) if comp is None else Term(comp, "formula", formula)

    lora_by = adapters_by_device(adapters, s, cfg, where, first)
    dfs = tuple(DeviceFootprint(
        name=d, model=Term(model_by.get(d, 0), "formula"), context=Term(ctx_by.get(d, 0), "formula"),
        compute=comp_term(d), output=Term(0, "formula"),
        **({"adapters": Term(lora_by.get(d, 0), "formula")} if adapters else {})) for d in devices)
    mmaps = cfg.quant == "none" and not s.pipeline  # bnb quantizes into anonymous memory
    mapped = sum(w.bytes for w in weights if mmaps and w.kind == "stored" and where[w.group] == HOST)
    committed = dfs[0].total_bytes - mapped
    kept = s.stored_bytes if cfg.quant != "none" else 0
    if kept:
        # measured: after a bitsandbytes load transformers keeps the checkpoint's private file mapping, every page
        # read while quantizing (page cache, reclaimable, but held by the seat until it exits)
        mapped += kept
        warnings.append(f"a bitsandbytes load keeps the checkpoint mapped and read whole: {kept} B of "
                        "page cache beside the quantized weights, counted as mapped")
    if overhead_bytes is not None:
        committed += overhead_bytes
        warnings.append(f"host committed includes the seat's own overhead, {overhead_bytes} B (measured once)")
    else:
        warnings.append("the seat process's own overhead is not counted (no measurement of it yet)")
    if mapped > kept:
        warnings.append("weights held as stored on the CPU stay memory-mapped: page cache, counted as mapped; "
                        "cast weights are committed copies")
    fp = Footprint(devices=dfs, host_mapped_bytes=mapped, host_committed_bytes=committed, host_source="formula",
                   notes=tuple(warnings))
    return HfPricing(fp, weights, extras, kv, n_ctx, formula, placement, tuple(warnings), kept)


def _split(total: int, n: int) -> list[int]:
    base, rem = divmod(total, n)
    return [base + (1 if i < rem else 0) for i in range(n)]
