"""PEFT adapters on a transformers seat: what the seat holds for one adapter, from its safetensors header. Pure
but for the header read (cached by file identity).

The rules (peft 0.21, ``PeftModel.from_pretrained`` / ``load_adapter`` with their default
``autocast_adapter_dtype=True``), measured against the seat's object walk:

- every LoRA tensor (a name part ``lora_A``, ``lora_B``, ``lora_embedding_A``/``_B``, ``lora_magnitude_vector``)
  becomes a parameter created in float32 beside the base layer it adapts, cast to the base weight's floating
  dtype, then (autocast) float16 and bfloat16 back to float32: **4 bytes per value, whatever the file stores**;
- any other tensor (``modules_to_save``: a full copy of a base module) is held at the base's load dtype when it
  is floating, else as stored;
- the values are copied in (never mapped): host memory is committed, on the device of the base module adapted.

A stored tensor ``base_model.model.<module>.lora_A.weight`` adapts ``<module>``; its bytes go where that module
was placed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fitevict.pricing.perfile import PerFile
from fitevict.pricing.gguf import PricingError, file_identity
from fitevict.pricing.safetensors import DTYPE_BYTES, FLOAT_DTYPES, StTensor, header_tensors

PEFT_WEIGHTS = "adapter_model.safetensors"
PEFT_CONFIG = "adapter_config.json"
LORA_DTYPE_BYTES = 4  # float32: how peft holds LoRA weights (autocast_adapter_dtype)
_PREFIX = "base_model.model."
_LORA_PARTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector")


@dataclass(frozen=True, slots=True)
class PeftAdapter:
    path: str  # the adapter folder
    tensors: tuple[StTensor, ...]


def is_lora_tensor(name: str) -> bool:
    """A LoRA weight (held in float32), as opposed to a saved module copy."""
    return any(p in _LORA_PARTS for p in name.split("."))


def adapter_of(path: str) -> str | None:
    """The adapter a loaded model's tensor belongs to (``...q_proj.lora_A.sql.weight`` -> ``sql``), or None for
    a base tensor. Names in a loaded model carry the adapter's name after the LoRA part (or ``modules_to_save``);
    an adapter file's own names do not."""
    parts = path.split(".")
    for i, p in enumerate(parts[:-1]):
        if p in _LORA_PARTS or p == "modules_to_save":
            return parts[i + 1]
    return None


def adapted_module(name: str) -> str:
    """The base module a stored adapter tensor belongs to, named as in the base model."""
    parts = name.removeprefix(_PREFIX).split(".")
    cut = next((i for i, p in enumerate(parts) if p in _LORA_PARTS or p == "modules_to_save"), len(parts) - 1)
    return ".".join(parts[:cut])


def held_bytes(t: StTensor, base_dtype: str | None) -> int:
    """Bytes the seat holds for the stored tensor ``t`` on a base whose floating weights are held in
    ``base_dtype`` (a safetensors dtype; None: not known, a saved module copy counts as stored)."""
    if is_lora_tensor(t.name):
        return t.numel * LORA_DTYPE_BYTES
    if base_dtype is not None and t.dtype in FLOAT_DTYPES:
        return t.numel * DTYPE_BYTES[base_dtype]
    return t.nbytes


def weights_file(folder: str | Path) -> Path:
    return Path(folder) / PEFT_WEIGHTS


def _parse(path: str, size: int, mtime_ns: int) -> tuple[StTensor, ...]:
    return tuple(header_tensors(Path(path)))  # PricingError names the file and what is wrong with it


_cached = PerFile(_parse)  # the latest parse per path (pricing.perfile)


def load_peft_adapter(folder: str | Path) -> PeftAdapter:
    """The adapter folder's tensors (``adapter_model.safetensors``'s header), cached by file identity."""
    f = weights_file(folder)
    if not f.is_file():
        raise PricingError(f"{folder}: no {PEFT_WEIGHTS}; a PEFT adapter folder holds its weights there "
                           "(save it with PeftModel.save_pretrained, safe_serialization on)")
    return PeftAdapter(str(folder), _cached(*file_identity(f, "adapter weights")))


def adapter_held_bytes(a: PeftAdapter, base_dtype: str | None) -> int:
    return sum(held_bytes(t, base_dtype) for t in a.tensors)
