"""How llama.cpp prices a GGUF file: its structure and context, the price from the file's structure (a stored
measurement of the same signature first, else the formula with the engine's dry-run figures, corrected by this
file's accepted loads, with its projector), the process terms that scale with the model, the dry run, the build key,
the host buffer table and the process overhead's calibration."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fitevict import planner as pl
from fitevict.engines.base import PricerBase
from fitevict.engines.llama_cpp import census, dryrun, install, machine, overhead
from fitevict.host.cpu import Cpu
from fitevict.pricing import price as pricing
from fitevict.pricing.correction import Correction, apply_correction, correction
from fitevict.pricing.footprint import Footprint, as_stored, footprint_from_json
from fitevict.pricing.gguf import GgufStructure, PricingError, load_structure
from fitevict.pricing.hostbufs import HostBuffers
from fitevict.pricing.kv import resolve_context
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.logparse import PRECISION_BYTES
from fitevict.pricing.lora import load_adapter
from fitevict.pricing.placement import place
from fitevict.pricing.process import ProcessTerm, model_terms
from fitevict.pricing.rpcserver import rpc_devices, rpc_server_parts, with_rpc_servers
from fitevict.pricing.projector import price_projector, with_projector

# a measured term sums at most three logged buffers (KV, SWA KV, recurrent state), each printed to +-0.005 MiB
LOG_TERM_PRECISION = 3 * PRECISION_BYTES
SERVER = "llama-server"


def correction_of(structure: GgufStructure, loads: Mapping[LoadConfig, Footprint],
                  host: HostBuffers) -> Correction | None:
    """How far this file's formula was from what its accepted loads measured (any settings), per term."""
    pairs, seen = [], []
    for c, measured in loads.items():
        try:
            pairs.append((pricing.price(structure, c, host=host).footprint, measured))
        except PricingError:
            continue  # priced no more (the rules changed): nothing to learn from it
        seen.append(f"ctx {c.n_ctx}, " + pl.describe(c, structure.n_layer + 1))
    origin = "; ".join(seen[:4]) + (" ..." if len(seen) > 4 else "")
    return correction(pairs, origin, tolerance=LOG_TERM_PRECISION)


class GgufPricer(PricerBase):
    kind = "gguf"
    words = "GGUF model"
    builds = True

    def claims(self, path: Path) -> bool:
        return not Path(path).is_dir()

    def structure(self, path: Path) -> GgufStructure:
        return load_structure(path)  # cached by the pricing module

    def context(self, structure: GgufStructure, cfg: LoadConfig) -> int:
        return resolve_context(structure, cfg).n_ctx

    def quantization(self, structure: GgufStructure) -> str:
        return structure.dominant_type()

    def sheet_parts(self, structure: GgufStructure, *, ident: tuple[str, int, int], loras: tuple[str, ...],
                    extra_args: tuple[str, ...], learned: Mapping, host: HostBuffers,
                    mmproj: Path | None) -> dict[str, Any]:
        return {"correction": correction_of(structure, learned.get(ident, {}), host),
                "projector": load_structure(mmproj) if mmproj is not None else None,
                "lora_files": {a: load_adapter(a) for a in loras}}

    def price(self, sheet: Any, cfg: LoadConfig) -> tuple[Footprint, tuple[ProcessTerm, ...]]:
        stored = sheet.stored.get(sheet.signature(cfg))
        if stored is not None:
            fp = as_stored(footprint_from_json(dict(stored)))
        else:
            fp = pricing.price(sheet.structure, cfg, host=sheet.host, compute=sheet.compute.get(cfg),
                               context=sheet.dry_context.get(cfg.without_placement()),
                               loras=sheet.lora_files).footprint
            fp = apply_correction(fp, sheet.correction)
            if sheet.projector is not None:
                estimate = sheet.projector_estimate.get(cfg.without_placement())
                fp = with_projector(fp, price_projector(sheet.projector, estimate))
            if rpc_devices(cfg):  # an RPC device's rpc-server holds its own parts beside the engine's buffers
                fp = with_rpc_servers(fp, rpc_server_parts(sheet.structure, cfg,
                                                           place(sheet.structure, cfg, sheet.host)))
        return fp, model_terms(sheet.structure, cfg, sheet.host, n_threads=sheet.threads, tiled=sheet.tiled)

    def dry_run(self, engine_dir: Path, path: Path, cfg: LoadConfig, *, extra_args: tuple[str, ...] = (),
                mmproj: Path | str | None = None) -> dryrun.DryRun | dryrun.Unavailable:
        return dryrun.dry_run(engine_dir, path, cfg, extra_args=tuple(extra_args), mmproj=mmproj)

    def build_key(self, engine_dir: Path, cpu: Cpu | None) -> str:
        return machine.machine_key(Path(engine_dir) / SERVER, cpu)

    def build_id(self, binary: Path) -> str:
        return machine.engine_build(binary)

    def build_change(self, binary: Path) -> str | None:
        stamp = machine.install_stamp(binary)
        return machine.stamp_differs(binary, stamp) if stamp is not None else None

    def host_buffers(self, engine_dir: Path) -> HostBuffers:
        return machine.host_buffers(Path(engine_dir) / SERVER)

    def work_facts(self) -> tuple[int, bool]:
        return overhead.engine_threads(), overhead.tiled_here()

    def overhead_key(self, binary: Path, cpu: Cpu | None) -> str:
        return f"engine-overhead:v{overhead.RECORD_VERSION}:{machine.machine_key(binary, cpu)}"

    def calibratable(self, binary: Path) -> bool:
        return overhead.calibratable(binary)

    def calibrated_overhead(self, binary: Path) -> dict[str, int] | None:
        return overhead.calibrated_overhead(binary)

    def calibrate_overhead(self, binary: Path, *, timeout_s: float) -> Any:
        return overhead.calibrate_overhead(binary, timeout_s=timeout_s)

    def shared_pages(self, binary: Path) -> Any:
        return overhead.shared_pages(binary) if overhead.calibratable(binary) else None

    def resolve_build(self, configured: str | None) -> tuple[Path | None, str, Path]:
        found = install.resolve_binary(SERVER, configured=configured)
        return found.path, found.why, install.installed_bin_dir() / SERVER

    def census(self, binary: Path, *, rpc: Sequence[str], declared: Mapping[str, bool]) -> Any:
        return census.take_census(binary, rpc=rpc, declared=declared)


PRICER = GgufPricer()
