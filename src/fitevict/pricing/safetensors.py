"""Hugging Face folders -> structure: every tensor's dtype, shape and stored bytes, read from safetensors headers.

A safetensors file starts with a little-endian u64 header length and a JSON header that maps each tensor name
to ``dtype``, ``shape`` and ``data_offsets``; the stored bytes of a tensor are ``end - begin``. Reading the
header touches a few KiB of each file, never the weights, and needs no torch.

A diffusers pipeline (``model_index.json``) is a folder of components, each with its own safetensors files;
its tensors are named ``<component>/<tensor>``. It reads files (each header, and which files a folder holds)
and returns frozen records; nothing else is kept or changed.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fitevict.pricing.gguf import PricingError

# bytes per element of each safetensors dtype
DTYPE_BYTES: Mapping[str, int] = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
    "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
}
# torch dtype names (config.json's ``dtype`` / ``torch_dtype``, the --dtype flag) -> safetensors dtype
TORCH_DTYPES: Mapping[str, str] = {
    "float32": "F32", "float": "F32", "float16": "F16", "half": "F16", "bfloat16": "BF16", "float64": "F64",
}
FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit on the JSON header


@dataclass(frozen=True, slots=True)
class StTensor:
    """One stored tensor. ``nbytes`` is what the file stores (data_offsets), so packed formats count as stored."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True, slots=True)
class HfStructure:
    """An HF model folder or diffusers pipeline: config, tensors, and what the files take on disk."""

    path: str
    kind: str  # "transformers" | "diffusers": the library whose layout the folder has
    arch: str  # config.json's architectures[0], or the pipeline's _class_name
    config: Mapping  # config.json (the pipeline's model_index.json for diffusers)
    tensors: tuple[StTensor, ...]
    file_bytes: int  # every *.safetensors file's size (headers included)
    quant_method: str | None = None  # config.json's quantization_config.quant_method (gptq, awq, bitsandbytes, ...)
    components: Mapping[str, Mapping] = field(default_factory=dict)  # diffusers: component -> its config
    warnings: tuple[str, ...] = ()

    @property
    def pipeline(self) -> bool:
        """A diffusers pipeline (components, no KV cache), not one model."""
        return self.kind == "diffusers"

    @property
    def stored_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def stored_dtype(self) -> str | None:
        """The safetensors dtype most floating weights are stored in (None when there are none)."""
        counts: dict[str, int] = {}
        for t in self.tensors:
            if t.dtype in FLOAT_DTYPES:
                counts[t.dtype] = counts.get(t.dtype, 0) + t.nbytes
        return max(counts, key=counts.__getitem__) if counts else None


def read_header(path: Path) -> dict:
    """The JSON header of one safetensors file; PricingError names the file and what is wrong with it."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise PricingError(f"{path}: {len(head)} bytes, too short for a safetensors header; re-download it")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER:
                raise PricingError(f"{path}: header length {n} B exceeds the format's {_MAX_HEADER} B; "
                                   "not a safetensors file")
            raw = f.read(n)
    except OSError as e:
        raise PricingError(f"cannot read {path}: {e.strerror or e}") from e
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise PricingError(f"{path}: the safetensors header is not JSON ({e}); the file is damaged") from e
    if not isinstance(header, dict):
        raise PricingError(f"{path}: the safetensors header is not a JSON object")
    return header


def header_tensors(path: Path, prefix: str = "") -> list[StTensor]:
    """The tensors one safetensors file stores, in header order, names prefixed with ``prefix``."""
    out: list[StTensor] = []
    for name, meta in read_header(path).items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = meta["dtype"], tuple(int(d) for d in meta["shape"]), meta["data_offsets"]
        except (KeyError, TypeError, ValueError) as e:
            raise PricingError(f"{path}: tensor {name!r} has a malformed header entry {meta!r}") from e
        out.append(StTensor(prefix + name, str(dtype), shape, int(end) - int(begin)))
    return out


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise PricingError(f"cannot read {path}: {e.strerror or e}") from e
    except ValueError as e:
        raise PricingError(f"{path} is not JSON ({e}); fix or re-download it") from e
    if not isinstance(data, dict):
        raise PricingError(f"{path} is not a JSON object")
    return data


def _weight_files(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.glob("*.safetensors") if not p.name.startswith("."))
    if not files:
        raise PricingError(f"{folder}: no *.safetensors files; fitevict prices safetensors weights only "
                           "(convert .bin checkpoints with save_pretrained(safe_serialization=True))")
    return files


def _transformers_structure(folder: Path) -> HfStructure:
    config = _read_json(folder / "config.json")
    files = _weight_files(folder)
    tensors = [t for f in files for t in header_tensors(f)]
    arch = (config.get("architectures") or [config.get("model_type") or "unknown"])[0]
    q = config.get("quantization_config")
    quant = str(q.get("quant_method")) if isinstance(q, dict) and q.get("quant_method") else None
    return HfStructure(str(folder), "transformers", str(arch), config, tuple(tensors),
                       sum(f.stat().st_size for f in files), quant)


def _diffusers_structure(folder: Path) -> HfStructure:
    index = _read_json(folder / "model_index.json")
    tensors: list[StTensor] = []
    size = 0
    components: dict[str, Mapping] = {}
    for name, spec in index.items():
        if name.startswith("_") or not isinstance(spec, list):
            continue
        sub = folder / name
        for cfg_name in ("config.json", "scheduler_config.json"):
            if (sub / cfg_name).is_file():
                components[name] = _read_json(sub / cfg_name)
        for f in sorted(sub.glob("*.safetensors")) if sub.is_dir() else ():
            tensors += header_tensors(f, prefix=f"{name}/")
            size += f.stat().st_size
    if not tensors:
        raise PricingError(f"{folder}: the pipeline's components hold no *.safetensors weights")
    return HfStructure(str(folder), "diffusers", str(index.get("_class_name", "DiffusionPipeline")), index,
                       tuple(tensors), size, None, components)


def load_hf_structure(folder: Path) -> HfStructure:
    """The structure of an HF model folder (config.json + *.safetensors) or a diffusers pipeline folder."""
    folder = Path(folder)
    if (folder / "model_index.json").is_file():
        return _diffusers_structure(folder)
    if not (folder / "config.json").is_file():
        raise PricingError(f"{folder}: no config.json or model_index.json; not a Hugging Face model folder")
    return _transformers_structure(folder)


def is_hf_folder(path: Path) -> bool:
    """True for a folder fitevict prices as an HF model (config.json or model_index.json beside weights)."""
    p = Path(path)
    return p.is_dir() and ((p / "config.json").is_file() or (p / "model_index.json").is_file())
