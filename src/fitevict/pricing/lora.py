"""LoRA adapters: read a GGUF adapter's header, and price the buffers the pinned llama.cpp allocates for it.

The rules (llama.cpp 0c1e570, ``src/llama-adapter.cpp``):
- the file must say ``general.type = adapter`` and ``adapter.type = lora``, with the base's architecture;
- tensors come in pairs ``W.lora_a`` / ``W.lora_b`` for a base weight ``W`` (``*_norm.weight`` is skipped);
- each pair is copied (never mapped) into a buffer of its base weight's buffer type: a weight in an extra CPU
  buffer type (``CPU_REPACK``) or in the mapped file falls back to the plain ``CPU`` type, a GPU weight keeps
  its device; one buffer per buffer type per adapter, each tensor padded to the type's alignment
  (``ggml_backend_alloc_ctx_tensors_from_buft``). The log prints each as "LoRA buffer size".

Every adapter of a seat is loaded at start (``--lora``, at scale 0), so its bytes count while the seat lives.
Reading an adapter's header (``parse_adapter``, ``is_lora_gguf``) is the module's one I/O; the pricing is pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gguf import GGMLQuantizationType

from fitevict.pricing.perfile import PerFile
from fitevict.pricing.footprint import HOST
from fitevict.pricing.ggml_types import CPU_TENSOR_ALIGNMENT, nbytes, pad
from fitevict.pricing.gguf import PricingError, TensorInfo, file_identity
from fitevict.pricing.gguf_header import Header, HeaderError, read_header
from fitevict.pricing.peft import adapter_held_bytes, load_peft_adapter
from fitevict.pricing.placement import Placement, gpu_alloc


@dataclass(frozen=True, slots=True)
class LoraTensor:
    name: str  # as in the file: "blk.0.attn_q.weight.lora_a"
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]  # ne0 first
    nbytes: int

    @property
    def base_name(self) -> str:
        return self.name.rsplit(".", 1)[0]


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """A GGUF LoRA adapter's header: what llama.cpp checks and what it allocates."""

    path: str
    arch: str
    alpha: float
    tensors: tuple[LoraTensor, ...]  # the lora_a / lora_b tensors (norm vectors left out, as the engine does)

    @property
    def rank(self) -> int:
        return max((t.shape[1] for t in self.tensors if t.name.endswith(".lora_a") and len(t.shape) > 1), default=0)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def _str(header: Header, key: str) -> str | None:
    v = header.scalar(key)
    return v if isinstance(v, str) else None


def is_lora_gguf(path: str | Path) -> bool:
    """True when ``path`` is a GGUF LoRA adapter (``general.type = adapter``, ``adapter.type = lora``)."""
    try:
        h = read_header(path)
    except (OSError, HeaderError):
        return False
    return _str(h, "general.type") == "adapter" and _str(h, "adapter.type") == "lora"


def parse_adapter(path: str | Path) -> LoraAdapter:
    """Read an adapter's header; PricingError names the file and what is wrong with it."""
    p = Path(path)
    try:
        h = read_header(p)
    except (OSError, HeaderError) as err:
        raise PricingError(f"{p}: the adapter's GGUF header cannot be read ({err}); the file is truncated or "
                           "corrupt") from err
    gtype, atype = _str(h, "general.type"), _str(h, "adapter.type")
    if gtype != "adapter" or atype != "lora":
        raise PricingError(f"{p}: not a LoRA adapter (general.type = {gtype!r}, adapter.type = {atype!r}; "
                           "llama.cpp wants 'adapter' and 'lora')")
    arch = _str(h, "general.architecture") or ""
    alpha = h.scalar("adapter.lora.alpha")
    tensors = []
    for t in h.tensors:
        if t.name.endswith("_norm.weight"):
            continue  # the engine skips norm vectors
        if not t.name.endswith((".lora_a", ".lora_b")):
            raise PricingError(f"{p}: tensor {t.name!r} is neither *.lora_a nor *.lora_b; llama.cpp refuses it")
        try:
            qt = GGMLQuantizationType(t.ggml_type)
        except ValueError:
            raise PricingError(f"{p}: tensor {t.name!r} has an unknown ggml type {t.ggml_type}") from None
        tensors.append(LoraTensor(t.name, qt, t.shape, nbytes(qt, t.shape)))
    return LoraAdapter(str(p), arch, float(alpha) if isinstance(alpha, (int, float)) else 0.0, tuple(tensors))


def _parse(path: str, size: int, mtime_ns: int) -> LoraAdapter:
    return parse_adapter(path)


_cached = PerFile(_parse)  # the latest parse per path (pricing.perfile)


def load_adapter(path: str | Path) -> LoraAdapter:
    """``parse_adapter`` cached by ``file_identity`` (path, size, mtime_ns)."""
    return _cached(*file_identity(path, "adapter file"))


def adapter_bytes(adapter: LoraAdapter, placement: Placement, devices: tuple[str, ...], arch: str,
                  names: frozenset[str]) -> dict[str, int]:
    """Bytes of the LoRA buffers one adapter allocates, per budget device, for a base placed as ``placement``
    whose file holds the tensors ``names`` (a tied output is no tensor of its own: an adapter cannot name it).

    Raises PricingError where the engine refuses the adapter (another architecture, a weight the base lacks)."""
    if adapter.arch != arch:
        raise PricingError(f"{adapter.path}: a LoRA adapter for {adapter.arch!r}, the base is {arch!r}; llama.cpp "
                           "refuses it (model arch and LoRA arch mismatch)")
    where = dict(placement.tensor_buffer)
    out: dict[str, int] = {}
    for t in adapter.tensors:
        buf = where.get(t.base_name) if t.base_name in names else None
        if buf is None:
            raise PricingError(f"{adapter.path}: LoRA tensor {t.base_name!r} does not exist in the base model; "
                               "the adapter is for another base")
        # a base weight on a device keeps its LoRA there; every host buffer type gives a plain CPU buffer
        dev = placement.device_of_buffer(buf)
        if dev == HOST:
            n = pad(t.nbytes, CPU_TENSOR_ALIGNMENT)
        else:
            n = gpu_alloc(TensorInfo(t.name, t.ggml_type, t.shape, t.nbytes, 0, None, False), dev,
                          placement.rules(dev))
        out[dev] = out.get(dev, 0) + n
    return out


def adapters_bytes(paths: tuple[str, ...], placement: Placement, devices: tuple[str, ...], arch: str,
                   names: frozenset[str], read: Mapping[str, LoraAdapter] | None = None) -> dict[str, int]:
    """The LoRA buffers of every adapter in ``paths``, summed per budget device. ``read``: their headers, already
    read (path -> adapter; a price sheet holds them); a path not in it is read here."""
    out: dict[str, int] = {}
    for p in paths:
        a = read.get(p) if read is not None else None
        for dev, n in adapter_bytes(a or load_adapter(p), placement, devices, arch, names).items():
            out[dev] = out.get(dev, 0) + n
    return out


def listed_adapter_bytes(kind: str, files: tuple[Path, ...]) -> dict:
    """An adapter's own bytes for the model list, with their source: a GGUF adapter's LoRA buffer on the CPU
    (each tensor padded as the engine pads it), a PEFT adapter's tensors as a transformers seat holds them
    (``fitevict.pricing.peft``; a saved module copy as stored, the base's dtype being unknown here)."""
    try:
        if kind == "lora":
            a = load_adapter(files[0])
            n = sum(pad(t.nbytes, CPU_TENSOR_ALIGNMENT) for t in a.tensors)
            return {"bytes": n, "source": "formula", "rank": a.rank, "what": "LoRA buffer on the CPU, from the header"}
        return {"bytes": adapter_held_bytes(load_peft_adapter(files[0].parent), None), "source": "formula",
                "what": "adapter tensors as a transformers seat holds them (LoRA weights in float32), "
                        "from the safetensors header"}
    except (PricingError, IndexError) as err:
        return {"bytes": None, "source": "unavailable", "reason": f"unavailable, because {err}"}
