"""How the transformers family prices a Hugging Face folder: from its safetensors headers and config.json (a seat's
walk equals that to the byte), under the seat's own flags (dtype, quantization), with its PEFT adapters and its
own process overhead as measured on this machine. A walk has no cache or activations to reuse, so no stored
figure stands in, and the planner sees the folder as one layer (the seat places whole modules by its device map)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fitevict.engines.base import PricerBase
from fitevict.engines.transformers.engine import hf_config
from fitevict.pricing.footprint import Footprint
from fitevict.pricing.hf_kv import training_context
from fitevict.pricing.hf_price import price_hf
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.peft import load_peft_adapter
from fitevict.pricing.safetensors import load_hf_structure
from fitevict.sources.files import hf_files, is_hf_dir


@dataclass(frozen=True, slots=True)
class HfShape:
    n_ctx_train: int
    n_layer: int = 0
    is_moe: bool = False


def hf_dtype(structure: Any) -> str:
    """The safetensors dtype holding the most bytes: an HF folder's quantization, for signatures."""
    by: dict[str, int] = {}
    for t in structure.tensors:
        by[t.dtype] = by.get(t.dtype, 0) + t.nbytes
    return "hf:" + (max(by, key=by.__getitem__) if by else "empty")


class HfPricer(PricerBase):
    kind = "hf"
    words = "Hugging Face safetensors model"
    own_overhead = True

    def __init__(self) -> None:
        self._structures: dict[tuple[str, int], Any] = {}  # (folder, mtime_ns) -> its structure

    def claims(self, path: Path) -> bool:
        return Path(path).is_dir() and self.model_folder(os.listdir(path))

    def model_folder(self, names: Sequence[str]) -> bool:
        return is_hf_dir(names)

    def model_files(self, folder: Path, names: Sequence[str]) -> tuple[Path, ...]:
        return hf_files(folder, names)

    def structure(self, path: Path) -> Any:
        key = (str(path), Path(path).stat().st_mtime_ns)
        hit = self._structures.get(key)
        if hit is None:
            hit = self._structures[key] = load_hf_structure(Path(path))
        return hit

    def shape(self, structure: Any) -> HfShape:
        return HfShape(n_ctx_train=training_context(structure.config) or 0)

    def context(self, structure: Any, cfg: LoadConfig) -> int:
        return training_context(structure.config) or cfg.n_ctx

    def quantization(self, structure: Any) -> str:
        return hf_dtype(structure)

    def sheet_parts(self, structure: Any, *, ident: tuple[str, int, int], loras: tuple[str, ...],
                    extra_args: tuple[str, ...], learned: Mapping, host: Any, mmproj: Path | None) -> dict[str, Any]:
        hf = hf_config(LoadConfig(loras=loras), extra_args=extra_args)
        return {"peft": {a: load_peft_adapter(a) for a in hf.adapters}}

    def price(self, sheet: Any, cfg: LoadConfig) -> tuple[Footprint, None]:
        hf = hf_config(cfg, extra_args=sheet.extra_args)
        return price_hf(sheet.structure, hf, overhead_bytes=sheet.torch_overhead_for(cfg.loras),
                        adapters=tuple(sheet.peft[a] for a in hf.adapters)).footprint, None


PRICER = HfPricer()
