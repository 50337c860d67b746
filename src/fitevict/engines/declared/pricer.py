"""How the declared family prices a model: the footprint its manifest declares, all on the host (source: declared),
the process at rest as the model term and each token of context as the context term; the price holds the whole
process, so no engine overhead joins it. Once a seat of the same manifest and configuration was measured on this
machine (its PSS, accepted by the guard and stored), that measurement is its price (source: stored-measurement).
The planner sees the folder as one layer: a declared server places itself."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fitevict.engines.base import PricerBase
from fitevict.engines.declared.manifest import MANIFEST, Manifest, read_manifest
from fitevict.pricing.footprint import HOST, DeviceFootprint, Footprint, Term, as_stored, footprint_from_json
from fitevict.pricing.loadconfig import LoadConfig


@dataclass(frozen=True, slots=True)
class DeclaredShape:
    n_ctx_train: int
    n_layer: int = 0
    is_moe: bool = False


def declared_footprint(m: Manifest, n_ctx: int) -> Footprint:
    """What ``m`` declares a seat serving ``n_ctx`` tokens holds, labelled declared."""
    at_rest, context = m.declared_bytes(n_ctx)
    where = f"declared in {m.folder / MANIFEST}"
    host = DeviceFootprint(HOST, model=Term(at_rest, "declared", f"{where}: [memory] bytes"),
                           context=Term(context, "declared", f"{where}: [memory] per_context_token x {n_ctx}"))
    return Footprint((host,), host_mapped_bytes=0, host_committed_bytes=at_rest + context, host_source="declared")


class DeclaredPricer(PricerBase):
    kind = "declared"
    words = "declared server (a folder with fitevict-engine.toml)"

    def __init__(self) -> None:
        self._manifests: dict[tuple[str, int], Manifest] = {}  # (folder, manifest's mtime_ns) -> its manifest

    def claims(self, path: Path) -> bool:
        return (Path(path) / MANIFEST).is_file()

    def model_folder(self, names: Sequence[str]) -> bool:
        return MANIFEST in names

    def model_files(self, folder: Path, names: Sequence[str]) -> tuple[Path, ...]:
        return tuple(folder / n for n in sorted(names) if not n.startswith(".") and (folder / n).is_file())

    def structure(self, path: Path) -> Manifest:
        key = (str(path), (Path(path) / MANIFEST).stat().st_mtime_ns)
        hit = self._manifests.get(key)
        if hit is None:
            hit = self._manifests[key] = read_manifest(Path(path))
        return hit

    def shape(self, structure: Manifest) -> DeclaredShape:
        return DeclaredShape(n_ctx_train=structure.context)

    def context(self, structure: Manifest, cfg: LoadConfig) -> int:
        return structure.context or cfg.n_ctx

    def quantization(self, structure: Manifest) -> str:
        return f"declared:{structure.digest}"

    def price(self, sheet: Any, cfg: LoadConfig) -> tuple[Footprint, None]:
        stored = sheet.stored.get(sheet.signature(cfg))
        if stored is not None:
            return as_stored(footprint_from_json(dict(stored))), None
        return declared_footprint(sheet.structure, self.context(sheet.structure, cfg)), None


PRICER = DeclaredPricer()
