"""How long one plan() takes: 100 residents, a 1,000-model catalog, p50/p99 over many runs.

The footprint function is the real ``fitevict.pricing.price`` over the structures of demo-zoo GGUF
files (1,000 catalog keys share them), called uncached and behind a per-(key, config) cache; when
pricing cannot be imported, a table-driven function stands in and the output says so.

Budgets are declared so that the residents fill them and most loads must evict; a tenth of the
requests ask for a context no budget holds, so refusals (with their largest-ctx search) are in
the mix. Writes its figures between the plan_latency markers of docs/benchmarks.md.

    .venv/bin/python bench/plan_latency.py [--runs 3000] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import write_section  # noqa: E402

from fitevict.budget import Budget  # noqa: E402
from fitevict.planner import FootprintFn, PlanRequest, Policy, Resident, plan
from fitevict.pricing.footprint import HOST, DeviceFootprint, Footprint, Term
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.engines.llama_cpp.machine import host_buffers

HERE = host_buffers()  # this machine's extra host buffers (its probe, else the rule table): as its engine places

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "plan_latency"
N_MODELS, N_RESIDENTS = 1000, 100
ZOO_SUBSET = ("llama-gqa", "llama-tied", "llama-moe", "gemma2-swa", "llama-q8_0", "llama-q4_0", "deci-kvarray")
GPU = "CUDA0"


class Facts:
    """What a PlanRequest needs to know about one catalog model."""

    def __init__(self, n_layer: int, n_moe_layers: int, n_ctx_train: int) -> None:
        self.n_layer, self.n_moe_layers, self.n_ctx_train = n_layer, n_moe_layers, n_ctx_train


def real_catalog(tmp: Path) -> tuple[FootprintFn, dict[str, Facts], str]:
    from fitevict.pricing.gguf import load_structure
    from fitevict.pricing.price import price
    from fitevict.zoo import write_zoo

    structures = [load_structure(z.path) for z in write_zoo(tmp, only=ZOO_SUBSET)]
    by_key = {f"m{i:04d}": structures[i % len(structures)] for i in range(N_MODELS)}
    facts = {k: Facts(s.n_layer + 1, s.n_layer if s.is_moe else 0, s.n_ctx_train) for k, s in by_key.items()}

    def fn(key: str, cfg: LoadConfig) -> Footprint:
        return price(by_key[key], cfg, host=HERE).footprint

    return fn, facts, f"fitevict.pricing.price on {len(structures)} demo-zoo GGUF structures ({', '.join(ZOO_SUBSET)})"


def table_catalog() -> tuple[FootprintFn, dict[str, Facts], str]:
    rng = random.Random(7)
    MiB = 1024**2
    tables = {f"m{i:04d}": (rng.randint(4, 80), rng.randint(20, 400) * MiB, rng.randint(8, 128) * 1024) for i in range(N_MODELS)}

    def fn(key: str, cfg: LoadConfig) -> Footprint:
        blocks, per_layer, kv = tables[key]
        L = blocks + 1
        ngl = 0 if not cfg.devices else (L if cfg.n_gpu_layers < 0 else min(cfg.n_gpu_layers, L))
        ctx = cfg.n_ctx or 4096
        on_gpu = ngl * per_layer + max(0, ngl - 1) * kv * ctx
        on_cpu = per_layer // 2 + (L - ngl) * per_layer + (blocks - max(0, ngl - 1)) * kv * ctx  # + token_embd
        devs = [DeviceFootprint(HOST, Term(on_cpu, "declared"))]
        if cfg.devices:
            devs.append(DeviceFootprint(GPU, Term(on_gpu, "declared"), compute=Term(256 * MiB, "declared")))
        return Footprint(tuple(devs), on_cpu, 0, "declared")

    facts = {k: Facts(b + 1, 0, 4096) for k, (b, _, _) in tables.items()}
    return fn, facts, "a table-driven footprint function (fitevict.pricing.price was not importable)"


def cached(fn: FootprintFn) -> FootprintFn:
    memo: dict[tuple[str, LoadConfig], Footprint] = {}

    def wrapped(key: str, cfg: LoadConfig) -> Footprint:
        k = (key, cfg)
        hit = memo.get(k)
        if hit is None:
            hit = memo[k] = fn(key, cfg)
        return hit

    return wrapped


def request(key: str, f: Facts, cfg: LoadConfig, mode: str) -> PlanRequest:
    return PlanRequest(key, cfg, mode, f.n_layer, f.n_moe_layers, f.n_ctx_train)  # type: ignore[arg-type]


def scenario(fn: FootprintFn, facts: dict[str, Facts], seed: int) -> tuple[list[Resident], Budget, list[PlanRequest]]:
    rng = random.Random(seed)
    keys = sorted(facts)
    residents: list[Resident] = []
    for i, key in enumerate(rng.sample(keys, N_RESIDENTS)):
        f = facts[key]
        cfg = LoadConfig(n_ctx=rng.choice((2048, 4096)), devices=(GPU,), n_gpu_layers=f.n_layer)
        fp = fn(key, cfg)
        residents.append(Resident(
            key, cfg, {HOST: fp.bytes_on(HOST), GPU: fp.bytes_on(GPU)}, last_used=float(rng.randint(0, 10_000)),
            pinned=rng.random() < 0.05, in_flight=1 if rng.random() < 0.05 else 0,
        ))
    held = {d: sum(r.bytes[d] for r in residents) for d in (HOST, GPU)}
    typical = {d: statistics.median(r.bytes[d] for r in residents) for d in (HOST, GPU)}
    budget = Budget.declared({d: int(held[d] + typical[d] // 2) for d in (HOST, GPU)})
    reqs: list[PlanRequest] = []
    for _ in range(2000):
        roll = rng.random()
        if roll < 0.1:  # a hit
            r = rng.choice(residents)
            reqs.append(request(r.key, facts[r.key], r.config.with_(n_gpu_layers=0, devices=()), "max-gpu"))
            continue
        key = rng.choice(keys)
        ctx = 1 << 22 if roll > 0.9 else rng.choice((2048, 4096, 8192))  # the last tenth cannot fit
        mode = "gpu-only" if roll < 0.2 else "ram-only" if roll < 0.25 else "max-gpu"
        reqs.append(request(key, facts[key], LoadConfig(n_ctx=ctx), mode))
    return residents, budget, reqs


def measure(fn: FootprintFn, residents: list[Resident], budget: Budget, reqs: list[PlanRequest], runs: int,
            warm: bool) -> tuple[list[float], dict[str, list[float]]]:
    policy = Policy()
    times: list[float] = []
    by_action: dict[str, list[float]] = defaultdict(list)
    if warm:
        for r in reqs:
            plan(r, residents, budget, fn, policy, 10_001.0)
    for i in range(runs):
        r = reqs[i % len(reqs)]
        t0 = time.perf_counter_ns()
        p = plan(r, residents, budget, fn, policy, 10_001.0)
        dt = (time.perf_counter_ns() - t0) / 1e3
        times.append(dt)
        by_action[p.action].append(dt)
    return times, by_action


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            base, facts, what = real_catalog(Path(tmp))
        except ImportError as e:
            base, facts, what = table_catalog()
            what += f" ({e})"
        warm = cached(base)
        residents, budget, reqs = scenario(warm, facts, seed=1)
        rows = []
        mix: Counter[str] = Counter()
        for label, fn, is_warm in (("priced on every call", base, False), ("pricing cached per (key, config)", warm, True)):
            times, by_action = measure(fn, residents, budget, reqs, a.runs, is_warm)
            mix = Counter({k: len(v) for k, v in by_action.items()})
            rows.append((label, times, by_action))
    lines = [
        "## plan() latency",
        "",
        f"`bench/plan_latency.py`: {N_RESIDENTS} residents, a {N_MODELS}-model catalog, {a.runs} plans per row; "
        f"footprints from {what}. Budgets (CPU + {GPU}, declared) are the residents' bytes plus half a typical "
        "model, so most loads evict; a tenth of the requests ask for a context that fits nowhere (refusal with "
        "largest-ctx search). Target: p99 < 1 ms.",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores (shared), Python {platform.python_version()}. "
        f"Action mix: {', '.join(f'{k} {v}' for k, v in sorted(mix.items()))}.",
        "",
        "| footprint function | p50 µs | p99 µs | p99 without refusals µs | max µs | p99 by action (µs) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for label, times, by_action in rows:
        per = ", ".join(f"{k} {pct(v, 0.99):.0f}" for k, v in sorted(by_action.items()))
        served = [t for k, v in by_action.items() if k != "refuse" for t in v]
        lines.append(f"| {label} | {pct(times, 0.5):.0f} | {pct(times, 0.99):.0f} | {pct(served, 0.99):.0f} "
                     f"| {max(times):.0f} | {per} |")
    section = "\n".join(lines)
    print(section)
    if not a.no_write:
        write_section(SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
