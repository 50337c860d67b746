"""The object walk: every tensor a loaded model holds, per device, and the weakrefs the leak breaker watches.

What a ``parameters()`` walk misses, and this one counts:

- buffers (rotary tables, running statistics);
- bitsandbytes state outside ``parameters()``: a 4-bit weight's ``quant_state`` (absmax, code, offset and the
  nested ``state2``) and an 8-bit weight's ``SCB`` row scales;
- diffusers pipelines, which are not ``nn.Module``: each component is walked, schedulers' tensors included;
- PEFT adapters on the base: their LoRA weights (and saved module copies) are parameters too, counted as kind
  ``adapter``, per adapter by name, apart from the base's weights.

Tied weights are counted once: two names that reach the same tensor data (same device, address and size) are one
entry, the second listed as tied. A tensor on the ``meta`` device (offloaded, or never materialised) is sized from
its dtype and shape and counted apart as declared, never as held.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from fitevict.pricing.peft import adapter_of


@dataclass(frozen=True, slots=True)
class Held:
    path: str  # module path, e.g. model.layers.0.self_attn.q_proj.weight.quant_state.absmax
    device: str  # "cpu", "cuda:0", "meta"
    kind: str  # param | buffer | quant_state | scheduler | adapter
    bytes: int


@dataclass(slots=True)
class Walk:
    held: list[Held] = field(default_factory=list)
    tied: list[tuple[str, str, int]] = field(default_factory=list)  # (path, same data as, bytes)
    refs: list[tuple[str, int, weakref.ref]] = field(default_factory=list)  # every tensor object, by identity
    components: dict[str, int] = field(default_factory=dict)
    missing_from_files: tuple[str, ...] = ()  # parameters the checkpoint did not supply (randomly initialised)

    @property
    def weight_bytes(self) -> int:
        """Bytes of parameters and quant state actually held (not declared), deduplicated."""
        return sum(h.bytes for h in self.held if h.device != "meta" and h.kind in ("param", "quant_state"))

    def adapter_bytes(self) -> dict[str, int]:
        """Bytes held per PEFT adapter (by the name the seat loaded it under)."""
        out: dict[str, int] = {}
        for h in self.held:
            if h.kind == "adapter" and h.device != "meta":
                name = adapter_of(h.path) or "?"
                out[name] = out.get(name, 0) + h.bytes
        return out

    def to_json(self) -> dict:
        devices: dict[str, dict[str, int]] = {}
        for h in self.held:
            dev = "declared" if h.device == "meta" else h.device
            d = devices.setdefault(dev, {"param": 0, "buffer": 0, "quant_state": 0, "scheduler": 0, "adapter": 0,
                                         "total": 0})
            d[h.kind] += h.bytes
            d["total"] += h.bytes
        return {
            "devices": devices,
            "weight_bytes": self.weight_bytes,
            "held_bytes": sum(h.bytes for h in self.held if h.device != "meta"),
            "declared_bytes": sum(h.bytes for h in self.held if h.device == "meta"),
            "tensors": len(self.held),
            "tied": [{"path": p, "same_as": s, "bytes": b} for p, s, b in self.tied],
            "components": self.components,
            "adapters": self.adapter_bytes(),
            "missing_from_files": list(self.missing_from_files),
            "source": "measured",
        }


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _quant_tensors(prefix: str, p: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    qs = getattr(p, "quant_state", None)
    if qs is not None:
        yield from _state_tensors(f"{prefix}.quant_state", qs)
    scb = getattr(p, "SCB", None)
    if isinstance(scb, torch.Tensor):
        yield f"{prefix}.SCB", scb


def _state_tensors(prefix: str, qs: object) -> Iterator[tuple[str, torch.Tensor]]:
    for k, v in vars(qs).items():
        if isinstance(v, torch.Tensor):
            yield f"{prefix}.{k}", v
        elif v is not None and type(v).__name__ == "QuantState":  # the nested double-quant state
            yield from _state_tensors(f"{prefix}.{k}", v)


def _module_tensors(prefix: str, m: torch.nn.Module) -> Iterator[tuple[str, str, torch.Tensor]]:
    dot = f"{prefix}." if prefix else ""
    for name, p in m.named_parameters(remove_duplicate=False):
        yield dot + name, "adapter" if adapter_of(name) is not None else "param", p
        for qn, qt in _quant_tensors(dot + name, p):
            yield qn, "quant_state", qt
    for name, b in m.named_buffers(remove_duplicate=False):
        yield dot + name, "buffer", b


def _object_tensors(prefix: str, obj: object) -> Iterator[tuple[str, str, torch.Tensor]]:
    for k, v in vars(obj).items():
        if isinstance(v, torch.Tensor):
            yield f"{prefix}.{k}", "scheduler", v


def _all_tensors(obj: object) -> Iterator[tuple[str, str, torch.Tensor, str]]:
    """(path, kind, tensor, component) for a module or a diffusers pipeline's components."""
    if isinstance(obj, torch.nn.Module):
        for path, kind, t in _module_tensors("", obj):
            yield path, kind, t, ""
        return
    components = getattr(obj, "components", None)
    if not isinstance(components, dict):
        raise TypeError(f"cannot walk a {type(obj).__name__}: neither an nn.Module nor a pipeline with components")
    for name, comp in components.items():
        if isinstance(comp, torch.nn.Module):
            for path, kind, t in _module_tensors(name, comp):
                yield path, kind, t, name
        elif comp is not None and hasattr(comp, "__dict__"):
            for path, kind, t in _object_tensors(name, comp):
                yield path, kind, t, name


def walk(obj: object) -> Walk:
    """Every tensor ``obj`` holds, deduplicated by data, with a weakref to each tensor object."""
    w = Walk()
    seen_obj: dict[int, str] = {}
    seen_data: dict[tuple[str, int, int], str] = {}
    for path, kind, t, comp in _all_tensors(obj):
        size = nbytes(t)
        if id(t) not in seen_obj:
            w.refs.append((path, size, weakref.ref(t)))
        if (first := seen_obj.get(id(t))) is not None:
            w.tied.append((path, first, size))
            continue
        seen_obj[id(t)] = path
        dev = str(t.device)
        if dev != "meta" and size:
            key = (dev, t.data_ptr(), size)
            if (first := seen_data.get(key)) is not None:
                w.tied.append((path, first, size))
                continue
            seen_data[key] = path
        w.held.append(Held(path, dev, kind, size))
        if comp:
            w.components[comp] = w.components.get(comp, 0) + size
    return w


def live_referents(refs: list[tuple[str, int, weakref.ref]]) -> list[tuple[str, int]]:
    """The watched tensors still alive: (module path, bytes) of each."""
    return [(path, size) for path, size, r in refs if r() is not None]
