r"""Where llama.cpp puts each weight, and the model buffers that follow (llama.cpp 0c1e570, llama-model.cpp).

Rules:
- Layers ``il >= n_layer + 1 - ngl`` go to the GPU; the output layer is pseudo-layer ``n_layer``, so it is
  offloaded first: ``-ngl 1`` offloads only the output. ``-ngl`` above ``n_layer + 1`` is clamped.
- The input layer (``token_embd``, ``position_embd``) always stays on the CPU; ``token_embd_norm`` goes with
  layer 0 and ``rope_freqs`` with every layer's device (one copy per buffer type). MTP blocks of the
  architectures in ``MTP_SKIP_ARCHS`` are not loaded. A model without ``output.weight`` (tied embedding)
  gets ``token_embd`` duplicated as the output matrix, in the output layer's buffer; when that is
  token_embd's own buffer the loader reuses the tensor (no second copy).
- Tensor overrides (common/arg.cpp, llama-model-loader.cpp ``buft_for_tensor``): ``--n-cpu-moe N`` adds the
  overrides ``blk\.i\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU`` for ``i < N``; ``-ot PATTERN=BUFT`` (a comma
  list, repeatable) adds its own, in command-line order. Each weight takes the first override whose pattern
  ``regex_search``-es its name; an override to ``CPU`` picks from the CPU list below (so it may land in
  ``CPU_REPACK``, ``CUDA_Host`` or ``CPU_Mapped``), any other buffer type (a device: ``CUDA0``, ...) is used as is.
  A tied output copy is created under the name ``token_embd.weight``, so the overrides that move token_embd move
  it too. A buffer type the machine does not have is refused when the flag is parsed. Overrides move weights
  only: the KV cache follows its layer's device.
- A CPU weight takes the first buffer type that supports its op, in the order: the host buffer type of the first
  device that has one (``CUDA_Host``, ``Vulkan_Host``; an RPC device has none; asked with that device's
  ``supports_op``), this machine's extra buffer types (``pricing/hostbufs``: ``AMX``, ``CPU_REPACK``, ..., learned
  from the engine or from the rule table; none with ``-nr``), then ``CPU``. With mmap a host-buffer weight falls
  back to ``CPU``.
- A layer weight on a device whose op that device cannot run (``pricing/backends``: the kinds its probe saw it
  reject) takes the CPU list above instead; an ``-ot`` to a device is used without asking.
- With mmap the ``CPU`` weights are not copied: their buffer is the file-offset span from the first to
  the last such tensor (``CPU_Mapped``), page cache rather than committed memory; an extra-buffer weight in
  the middle of the span is counted twice (mapped pages plus its copy).
- Several GPUs split the offloaded layers in proportion to ``-ts`` or, by default, to each device's free memory
  when the model loads (float32 split points, ``upper_bound`` of ``(il - i_gpu_start) / n_gpu_layers``). Pricing
  takes the weights from ``LoadConfig.tensor_split``: the planner applies this rule to the free memory NVML
  reports (``default_split``), fills ``tensor_split`` with the resulting layers per device
  (``layers_per_device``), and the seat is started with that ``-ts``, so the engine splits exactly as priced.
- Device buffers are named and padded by their backend (``pricing/backends``): ``CUDA0`` pads to 128 and quantized
  rows to 512 elements, ``Vulkan0`` to its device's alignment, an RPC device's ``RPC0[HOST:PORT]`` to its server's.

Pure.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


from fitevict.pricing.backends import BackendRules, DeviceBackend, device_backends, op_context, rule_for, weight_kind
from fitevict.pricing.footprint import HOST
from fitevict.pricing.ggml_types import CPU_TENSOR_ALIGNMENT, pad
from fitevict.pricing.hostbufs import NO_EXTRAS, HostBuffers
from fitevict.pricing.gguf import EXPERT_RE, MTP_SKIP_ARCHS, GgufStructure, PricingError, TensorInfo
from fitevict.pricing.loadconfig import LoadConfig

# Unnumbered tensors that llama.cpp places with the repeating layers (LLM_TENSOR_LAYER_REPEATING in
# llama-arch.cpp): "first" is created with layer 0 (bloom's token_embd_norm); "every" is created by each layer
# as a TENSOR_DUPLICATED copy, which the loader keeps once per buffer type (llama's rope_freqs, phi3's factors).
CPU_BUFT = "CPU"  # ggml_backend_cpu_buffer_type()'s name: the one host buffer type -ot may name
# common.h: --n-cpu-moe / -cmoe use LLM_FFN_EXPS_REGEX, --n-cpu-ffn LLM_FFN_DENSE_REGEX (per block: blk\.i + regex)
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
FFN_DENSE_REGEX = r"\.ffn_(up|down|gate)\."
assert FFN_EXPS_REGEX == EXPERT_RE.pattern
# Architectures that spell an output-layer tensor with another role's name (LLM_TENSOR_LAYER_OUTPUT in
# llama-arch.cpp): lfm2 / lfm2moe's final norm is written "token_embd_norm".
OUTPUT_NAMES: dict[str, tuple[str, ...]] = {"lfm2": ("token_embd_norm",), "lfm2moe": ("token_embd_norm",)}
REPEATING_UNNUMBERED: dict[str, str] = {
    "token_embd_norm": "first", "rope_freqs": "every", "rope_factors_long": "every", "rope_factors_short": "every",
}


@dataclass(frozen=True, slots=True)
class Buffer:
    """One llama.cpp model buffer, named as the log names it."""

    name: str  # "CPU_Mapped", "CPU_REPACK", "AMX", "CPU", "CUDA0", "CUDA_Host"
    device: str  # the budget device it counts against: "CPU" for host memory
    bytes: int
    mapped: bool = False  # file-backed (page cache), not committed


@dataclass(frozen=True, slots=True)
class Placement:
    n_gpu_layers: int  # clamped
    layer_device: tuple[str, ...]
    output_device: str
    tensor_buffer: tuple[tuple[str, str], ...]  # (tensor name, buffer name), tied output as "output.weight"
    buffers: tuple[Buffer, ...]
    warnings: tuple[str, ...] = ()
    backends: tuple[DeviceBackend, ...] = ()  # the devices' buffer names and rules, as placed
    host_moved: tuple[str, ...] = ()  # weights of offloaded layers left in host memory: their device cannot run them

    def buffer(self, name: str) -> Buffer | None:
        return next((b for b in self.buffers if b.name == name), None)

    def device_of_buffer(self, name: str) -> str:
        """The budget device of a buffer this placement names (a device's own buffer is that device)."""
        return next((b.device for b in self.backends if b.buffer == name), HOST)

    def rules(self, device: str) -> BackendRules:
        return next((b.rules for b in self.backends if b.device == device), rule_for(device))


def gpu_alloc(t: TensorInfo, dev: str, rules: BackendRules | None = None) -> int:
    """Bytes ``dev``'s buffer gives weight ``t`` (its backend's padding and alignment; ``rules`` as placed, else
    the family's rule)."""
    return (rules or rule_for(dev)).alloc(t.ggml_type, t.shape, t.nbytes)


def split_points(weights: Sequence[float]) -> tuple[float, ...]:
    """``llama_model::load_tensors``'s split points: cumulative weights over their sum, in float32 as llama.cpp
    computes them (each weight is a device's free bytes by default, or a ``-ts`` value)."""
    acc = np.float32(0)
    cum = []
    for w in weights:
        acc = np.float32(acc + np.float32(w))
        cum.append(acc)
    return tuple(float(np.float32(c / acc)) for c in cum)


def default_split(devices: Sequence[str], free_bytes: Mapping[str, int]) -> tuple[float, ...]:
    """llama.cpp's default ``-ts``: each device's free memory (NVML's figure; llama.cpp asks the driver the same).
    () when a device's free memory is unknown: the load then splits by what the driver reports at that moment."""
    if len(devices) < 2 or any(d not in free_bytes for d in devices):
        return ()
    return tuple(float(free_bytes[d]) for d in devices)


def layers_per_device(n_layer: int, ngl: int, devices: tuple[str, ...], weights: Sequence[float]) -> tuple[float, ...]:
    """How many offloaded layers (the output pseudo-layer included) ``layer_devices`` gives each device under
    ``weights``, as a ``-ts``: those counts split the layers exactly as the weights do (each split point falls on a
    layer boundary, computed in float32 the same way), so a seat started with them places its layers as priced,
    and two loads whose free memory differs but whose layers fall alike share one configuration (one signature,
    one dry run). () when nothing is offloaded."""
    layers, out = layer_devices(n_layer, ngl, devices, weights)
    placed = (*layers, out)
    counts = tuple(float(sum(1 for d in placed if d == dev)) for dev in devices)
    return counts if any(counts) else ()


def layer_devices(n_layer: int, ngl: int, devices: tuple[str, ...],
                  weights: Sequence[float] = ()) -> tuple[tuple[str, ...], str]:
    """Device per repeating layer and for the output pseudo-layer. Several GPUs share the offloaded layers in
    proportion to ``weights`` (llama.cpp's default: each device's free memory at load; ``-ts`` overrides it);
    without weights, evenly."""
    if not devices or ngl <= 0:
        return (HOST,) * n_layer, HOST
    i_gpu_start = max(n_layer + 1 - ngl, 0)
    act = min(ngl, n_layer + 1)
    splits = split_points(weights if len(weights) == len(devices) and any(weights) else (1.0,) * len(devices))

    def dev(il: int) -> str:
        if il < i_gpu_start or il - i_gpu_start >= act:
            return HOST
        k = bisect.bisect_right(splits, float(np.float32(il - i_gpu_start) / np.float32(act)))
        return devices[min(k, len(devices) - 1)]

    return tuple(dev(il) for il in range(n_layer)), dev(n_layer)


def buffer_types(devices: tuple[str, ...]) -> tuple[str, ...]:
    """The buffer types ``-ot`` accepts on a machine with ``devices``: each device's own, and the CPU's."""
    return (CPU_BUFT, *devices)


def compile_overrides(overrides: tuple[tuple[str, str], ...],
                      devices: tuple[str, ...]) -> tuple[tuple[re.Pattern[str], str], ...]:
    """The ``-ot`` rules as compiled patterns; a bad pattern or an unknown buffer type is a PricingError
    (llama-server refuses both when it parses the flag)."""
    known = buffer_types(devices)
    out: list[tuple[re.Pattern[str], str]] = []
    for pattern, buft in overrides:
        if "," in pattern or "=" in pattern or not pattern:
            raise PricingError(f"-ot {pattern}={buft}: llama-server splits -ot values at ',' and at the first '=', "
                               "so a pattern must be non-empty and hold neither; rewrite the pattern without them")
        if buft not in known:
            raise PricingError(
                f"-ot {pattern}={buft}: unknown buffer type {buft!r}; available buffer types: {', '.join(known)} "
                "(llama-server refuses it too). Name a device given with -dev, or CPU")
        try:
            out.append((re.compile(pattern), buft))
        except re.error as err:
            raise PricingError(f"-ot {pattern}={buft}: {pattern!r} is not a regular expression ({err})") from None
    return tuple(out)


def override_for(name: str, layer: int | None, expert: bool, n_cpu_moe: int,
                 rules: tuple[tuple[re.Pattern[str], str], ...]) -> str | None:
    """The buffer type the first matching override gives tensor ``name`` (--n-cpu-moe's rules come first)."""
    if expert and layer is not None and layer < n_cpu_moe:
        return CPU_BUFT
    for pattern, buft in rules:
        if pattern.search(name):
            return buft
    return None


def _tied_copy(s: GgufStructure, assigned: list[tuple[TensorInfo, str, str, int]],
               buffer_of: Callable[[TensorInfo], tuple[TensorInfo, str, str, int]]
               ) -> list[tuple[TensorInfo, str, str, int]]:
    """A tied embedding's copy for the output layer, where it lands in another buffer than token_embd's: created as
    token_embd.weight (TENSOR_DUPLICATED) in the output layer's buffer list; in the same buffer the loader reuses
    token_embd itself."""
    te = s.tensor("token_embd.weight") if s.tied_output else None
    if te is None:
        return []
    got = buffer_of(TensorInfo("output.weight", te.ggml_type, te.shape, te.nbytes, te.offset, None, False))
    te_buf = next(buf for t, buf, _, _ in assigned if t is te)
    return [] if got[1] == te_buf else [got]


def place(s: GgufStructure, cfg: LoadConfig, host: HostBuffers,
          backends: Mapping[str, BackendRules] | None = None,
          buffer_names: Mapping[str, str] | None = None) -> Placement:
    """Assign every weight to a buffer and size the buffers; ``host`` is this machine's extra host buffer types
    (ignored under ``-nr``, ``cfg.repack`` False); ``backends`` each device's learned rules (``pricing/backends``;
    a device without is given its family's rule), ``buffer_names`` each device's buffer name as the engine listed
    it (RPC: ``RPC0[HOST:PORT]``)."""
    if not cfg.repack:
        host = NO_EXTRAS
    rules = compile_overrides(cfg.tensor_overrides, tuple(cfg.devices))
    ngl, warnings = _clamped_ngl(s, cfg)
    devices = tuple(cfg.devices)
    bk = device_backends(devices, tuple(cfg.rpc), backends, buffer_names)
    by_dev = {b.device: b for b in bk}
    layer_dev, out_dev = layer_devices(s.n_layer, ngl if devices else 0, devices, cfg.tensor_split)
    # make_cpu_buft_list: the host buffer type of the first device that has one, asked with that device's ops
    host_dev = next((b for b in bk if b.rules.host_buffer), None)
    moved: list[str] = []
    dims = op_context(s)

    def cpu_buffer(t: TensorInfo) -> tuple[str, int]:
        """(buffer, bytes it allocates for ``t``) for a weight on the host."""
        kind = weight_kind(t.name, t.ggml_type.name, t.shape, dims)
        if host_dev is not None and host_dev.rules.runs(kind):
            return ("CPU_Mapped" if cfg.mmap else str(host_dev.rules.host_buffer)), t.nbytes
        got = host.place(t.name, t.ggml_type, t.shape, t.nbytes)
        if got is not None:
            return got
        return ("CPU_Mapped" if cfg.mmap else "CPU"), t.nbytes

    def buffer_of(t: TensorInfo, dev: str, name: str | None = None) -> tuple[TensorInfo, str, str, int]:
        """(t, buffer, budget device, bytes) for ``t`` in a layer on ``dev``, after the overrides matching ``name``."""
        buft = override_for(name or t.name, t.layer, t.expert, cfg.n_cpu_moe, rules)
        if buft is not None:
            dev = HOST if buft == CPU_BUFT else buft
        elif dev != HOST and not by_dev[dev].rules.runs(weight_kind(t.name, t.ggml_type.name, t.shape, dims)):
            moved.append(t.name)  # select_weight_buft: the device cannot run its op; the CPU list follows
            dev = HOST
        if dev == HOST:
            buf, n = cpu_buffer(t)
            return t, buf, dev, n
        return t, by_dev[dev].buffer, dev, by_dev[dev].rules.alloc(t.ggml_type, t.shape, t.nbytes)

    assigned: list[tuple[TensorInfo, str, str, int]] = []  # (tensor, buffer, device, bytes allocated)
    for t in s.tensors:
        if s.n_layer_nextn and s.arch in MTP_SKIP_ARCHS and t.layer is not None and t.layer >= s.n_layer_trunk:
            continue  # MTP blocks: llama-server loads them only for MTP speculative decoding (TENSOR_SKIP)
        role = "output" if t.name.split(".", 1)[0] in OUTPUT_NAMES.get(s.arch, ()) else t.role
        with_layers = (REPEATING_UNNUMBERED.get(t.name.split(".", 1)[0])
                       if t.layer is None and role != "output" else None)
        if with_layers and s.n_layer:
            copies = (layer_dev[0],) if with_layers == "first" else tuple(dict.fromkeys(layer_dev))
            placed: set[str] = set()
            for dev in copies:  # one copy per buffer: a duplicate in a buffer already holding it is reused
                got = buffer_of(t, dev)
                if got[1] not in placed:
                    placed.add(got[1])
                    assigned.append(got)
            continue
        if role == "layer":
            dev = layer_dev[t.layer] if t.layer is not None and t.layer < s.n_layer else HOST
        elif role == "output":
            dev = out_dev
        else:
            dev = HOST
        assigned.append(buffer_of(t, dev))
    assigned.extend(_tied_copy(s, assigned, lambda t: buffer_of(t, out_dev, "token_embd.weight")))
    if moved:
        warnings.append(f"{len(moved)} weights of offloaded layers stay in host memory because their device cannot "
                        f"run their op (first: {moved[0]}; {', '.join(b.rules.label() for b in bk)})")
    return Placement(n_gpu_layers=ngl, layer_device=layer_dev, output_device=out_dev,
                     tensor_buffer=tuple((t.name, buf) for t, buf, _, _ in assigned),
                     buffers=_buffers(assigned, host_dev), warnings=tuple(warnings), backends=bk,
                     host_moved=tuple(moved))


def _clamped_ngl(s: GgufStructure, cfg: LoadConfig) -> tuple[int, list[str]]:
    """-ngl as llama.cpp applies it: -1 is every layer, more than the layers plus output is clamped (said)."""
    n_all = s.n_layer + 1
    if cfg.n_gpu_layers < 0:
        return n_all, []
    if cfg.n_gpu_layers > n_all:
        return n_all, [f"-ngl {cfg.n_gpu_layers} is more than the {n_all} offloadable layers "
                       f"({s.n_layer} + output); clamped to {n_all}"]
    return cfg.n_gpu_layers, []


def _buffers(assigned: list[tuple[TensorInfo, str, str, int]], host_dev: DeviceBackend | None) -> tuple[Buffer, ...]:
    """The model buffers the assigned weights make: the mapped file span, and each other buffer's padded sum (a
    device buffer's tensors come padded by its backend; a device host buffer pads to its own alignment and adds
    what its allocation adds)."""
    sizes: dict[tuple[str, str], int] = {}
    mapped_first: int | None = None
    mapped_last = 0
    seen_mapped: set[int] = set()
    host_buf = host_dev.rules.host_buffer if host_dev is not None else None
    for t, buf, dev, n in assigned:
        if buf == "CPU_Mapped":
            if t.offset in seen_mapped:
                continue
            seen_mapped.add(t.offset)
            mapped_first = t.offset if mapped_first is None else min(mapped_first, t.offset)
            mapped_last = max(mapped_last, t.end)
        elif dev != HOST:
            sizes[(buf, dev)] = sizes.get((buf, dev), 0) + n
        elif buf == host_buf and host_dev is not None:
            sizes[(buf, dev)] = sizes.get((buf, dev), host_dev.rules.host_extra) + pad(n, host_dev.rules.host_alignment)
        else:
            sizes[(buf, dev)] = sizes.get((buf, dev), 0) + pad(n, CPU_TENSOR_ALIGNMENT)
    buffers: list[Buffer] = []
    if mapped_first is not None:
        buffers.append(Buffer("CPU_Mapped", HOST, mapped_last - mapped_first, mapped=True))
    for name, dev in sorted(sizes):
        buffers.append(Buffer(name, dev, sizes[(name, dev)]))
    return tuple(buffers)
