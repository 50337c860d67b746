"""Table-driven footprints: explicit per-layer and per-token byte tables turned into a Footprint.

This is input data for the planner, not a stand-in for pricing: every byte a configuration costs is
a sum over these tables, so the tests can carry the arithmetic in their comments. Layout follows
llama.cpp's rules: the last ``ngl`` of the ``n_layer`` offloadable layers (blocks, then the output
pseudo-layer) go to the GPUs, split evenly in order; ``--n-cpu-moe N`` keeps the experts of blocks
0..N-1 on the CPU; token embeddings stay on the CPU; KV lives with its layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitevict.pricing.footprint import HOST, DeviceFootprint, Footprint, Term
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.planner import PlanRequest


@dataclass(frozen=True)
class TableModel:
    key: str
    dense: tuple[int, ...]  # per block: attention + dense FFN weight bytes
    experts: tuple[int, ...] = ()  # per block: expert weight bytes (() = dense model)
    output: int = 0  # output layer weights
    embd: int = 0  # token embeddings, always on the CPU (mapped)
    kv_per_token: int = 0  # per block, per context token
    gpu_compute: int = 0  # per GPU in use, plus gpu_compute_per_token * ctx
    gpu_compute_per_token: int = 0
    cpu_compute: int = 0
    n_ctx_train: int = 4096

    @property
    def n_blocks(self) -> int:
        return len(self.dense)

    def request(self, n_ctx: int = 1024, mode: str = "max-gpu", **kw) -> PlanRequest:
        base = kw.pop("config", LoadConfig())
        return PlanRequest(
            self.key,
            base.with_(n_ctx=n_ctx),
            mode,  # type: ignore[arg-type]
            n_layer=self.n_blocks + 1,
            n_moe_layers=self.n_blocks if self.experts else 0,
            n_ctx_train=self.n_ctx_train,
            **kw,
        )

    def footprint(self, c: LoadConfig) -> Footprint:
        L = self.n_blocks + 1
        ctx = c.n_ctx or self.n_ctx_train
        devs = c.devices
        ngl = 0 if not devs else (L if c.n_gpu_layers < 0 else min(c.n_gpu_layers, L))
        start = L - ngl
        gpu: dict[str, list[int]] = {d: [0, 0, 0] for d in devs}  # model, context, compute
        cpu_w = self.embd
        cpu_kv = 0
        for i in range(L):
            on = devs[(i - start) * len(devs) // ngl] if i >= start else None
            if i == L - 1:
                w, e, kv = self.output, 0, 0
            else:
                w, kv = self.dense[i], self.kv_per_token * ctx
                e = self.experts[i] if self.experts else 0
            if on is None:
                cpu_w += w + e
                cpu_kv += kv
            else:
                gpu[on][0] += w + (e if i >= c.n_cpu_moe else 0)
                cpu_w += 0 if i >= c.n_cpu_moe else e
                gpu[on][1] += kv
        for d in devs:
            gpu[d][2] = self.gpu_compute + self.gpu_compute_per_token * ctx
        cpu_compute = self.cpu_compute
        f = lambda n: Term(n, "declared")  # noqa: E731
        devices = [DeviceFootprint(HOST, f(cpu_w), f(cpu_kv), f(cpu_compute), f(0))]
        devices += [DeviceFootprint(d, f(m), f(k), f(cp), f(0)) for d, (m, k, cp) in gpu.items()]
        mapped = cpu_w if c.mmap else 0
        return Footprint(tuple(devices), mapped, cpu_w - mapped + cpu_kv + cpu_compute, "declared")


def footprint_fn(*models: TableModel):
    by_key = {m.key: m for m in models}
    return lambda key, cfg: by_key[key].footprint(cfg)
