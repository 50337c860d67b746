"""LoadConfig: one llama-server load configuration, named as llama-server names its flags.

Shared by pricing (what does this cost?), the planner (which configuration fits?) and the engine
adapter (which argv starts it?). Frozen, hashable, so it can key caches and signatures.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Literal

from fitevict.config.records import CACHE_TYPES  # the config's one list of KV cache types (re-exported)

FlashAttn = Literal["on", "off", "auto"]
__all__ = ["CACHE_TYPES", "FlashAttn", "LoadConfig"]


@dataclass(frozen=True, slots=True)
class LoadConfig:
    n_ctx: int = 4096  # -c; 0 = the model's training context
    n_parallel: int | None = None  # -np; None = flag absent (this build then uses 4 slots, unified KV)
    kv_unified: bool | None = None  # -kvu; None = the engine's default for the given -np
    n_gpu_layers: int = 0  # -ngl; -1 = all layers
    n_cpu_moe: int = 0  # --n-cpu-moe: keep the experts of the first N layers on the CPU
    cache_type_k: str = "f16"  # -ctk
    cache_type_v: str = "f16"  # -ctv
    flash_attn: FlashAttn = "auto"  # -fa
    n_batch: int = 2048  # -b
    n_ubatch: int = 512  # -ub
    mmap: bool = True  # False = "-lm none" in the pinned build
    swa_full: bool = False  # --swa-full
    devices: tuple[str, ...] = ()  # -dev; () = CPU only ("-dev none")
    # -ot PATTERN=BUFT, in command-line order (after --n-cpu-moe's own overrides); first match wins
    tensor_overrides: tuple[tuple[str, str], ...] = ()
    embeddings: bool = False  # --embeddings: the output buffer also holds n_embd floats per output
    # --lora FILE per adapter (with --lora-init-without-apply: loaded at scale 0, applied per request), in
    # order: a request's ``lora`` ids index this tuple
    loras: tuple[str, ...] = ()
    # -ts: each device's share of the offloaded layers. The planner fills it for a load over several GPUs with the
    # layers llama.cpp's default split by free memory gives each (placement.default_split, layers_per_device);
    # () = no -ts (one device; or priced as an even split when the free memory is unknown)
    tensor_split: tuple[float, ...] = ()
    repack: bool = True  # False = -nr (--no-repack): no extra CPU buffer types (AMX, CPU_REPACK, ...)
    # --rpc HOST:PORT,...: rpc-server endpoints, in order; the engine names their devices RPC0, RPC1, ... (each
    # server's devices in turn), which ``devices`` may then name
    rpc: tuple[str, ...] = ()
    kv_offload: bool = True  # False = -nkvo (--no-kv-offload): the KV cache stays in host memory

    def without_placement(self) -> "LoadConfig":
        """This configuration on the CPU alone: the key under which a dry run's context caches serve every
        placement (they size per layer; only the devices differ). Compute buffers do differ per placement."""
        return replace(self, devices=(), n_gpu_layers=0, n_cpu_moe=0, tensor_overrides=(), tensor_split=(), rpc=(),
                       kv_offload=True)

    def with_(self, **changes: object) -> "LoadConfig":
        return replace(self, **changes)  # type: ignore[arg-type]

    def to_json(self) -> dict:
        d = asdict(self)
        d["devices"] = list(self.devices)
        d["tensor_overrides"] = [list(o) for o in self.tensor_overrides]
        d["loras"] = list(self.loras)
        if not self.loras:
            del d["loras"]  # a seat without adapters keeps the signature it had before adapters existed
        if self.tensor_split:
            d["tensor_split"] = list(self.tensor_split)
        else:
            del d["tensor_split"]  # absent when unset, so signatures of earlier configurations stay the same
        for key in ("repack", "kv_offload"):  # absent at their defaults: earlier signatures stay the same
            if d[key]:
                del d[key]
        if self.rpc:
            d["rpc"] = list(self.rpc)
        else:
            del d["rpc"]
        return d

    @staticmethod
    def from_json(d: dict) -> "LoadConfig":
        d = dict(d)
        if "devices" in d:
            d["devices"] = tuple(d["devices"])
        if "tensor_split" in d:
            d["tensor_split"] = tuple(float(x) for x in d["tensor_split"])
        if "tensor_overrides" in d:
            d["tensor_overrides"] = tuple((str(p), str(b)) for p, b in d["tensor_overrides"])
        if "loras" in d:
            d["loras"] = tuple(str(p) for p in d["loras"])
        if "rpc" in d:
            d["rpc"] = tuple(str(e) for e in d["rpc"])
        return LoadConfig(**d)
