"""Check GPU placement pricing against a real CUDA llama-server (needs a GPU and a CUDA build).

For each demo-zoo model and -ngl / --n-cpu-moe / -lm setting it starts llama-server on CUDA0, reads the
buffers the load log reports (CUDA0 / CUDA_Host / CPU_Mapped model buffers, KV per device, output,
compute) and prints them beside ``price(..., LoadConfig(devices=("CUDA0",), ...), host=HERE)``, exiting 1 on any
model, context or output buffer that differs at the log's printed precision (compute is reported only:
without a dry run for CUDA here, it is a formula).

    .venv/bin/python bench/gpu_placement_check.py --bin-dir /path/to/cuda/build/bin [--models a,b]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from fitevict.engines.dryrun import capture_load_log
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.logparse import parse_load_log
from fitevict.pricing.price import price
from fitevict.units import MiB
from fitevict.zoo import write_zoo
from fitevict.engines.machine import host_buffers

HERE = host_buffers()  # this machine's extra host buffers (its probe, else the rule table): as its engine places

DEFAULT_MODELS = ("llama-gqa", "llama-tied", "llama-moe", "llama-q4_0", "gemma2-swa", "llama-medium")


def configs(n_layer: int, moe: bool) -> list[tuple[str, LoadConfig]]:
    out: list[tuple[str, LoadConfig]] = []
    for ngl in (0, 1, 2, n_layer, n_layer + 1, 99):
        out.append((f"-ngl {ngl}", LoadConfig(n_ctx=1000, n_parallel=1, devices=("CUDA0",), n_gpu_layers=ngl)))
    out.append(("-ngl 2 -lm none", LoadConfig(n_ctx=1000, n_parallel=1, devices=("CUDA0",), n_gpu_layers=2,
                                              mmap=False)))
    if moe:
        for n in (1, n_layer):
            out.append((f"-ngl 99 --n-cpu-moe {n}", LoadConfig(n_ctx=1000, n_parallel=1, devices=("CUDA0",),
                                                               n_gpu_layers=99, n_cpu_moe=n)))
    return out


def mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / MiB:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin-dir", type=Path, required=True, help="directory of a CUDA build's llama-server")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    args = ap.parse_args()
    zoo = {m.name: m for m in write_zoo(Path(tempfile.mkdtemp(prefix="fitevict-gpu-")),
                                        only=args.models.split(","))}
    failures = 0
    for name, m in zoo.items():
        s = load_structure(m.path)
        for label, cfg in configs(s.n_layer, s.is_moe):
            p = price(s, cfg, host=HERE)
            cap = capture_load_log(args.bin_dir, m.path, cfg)
            if not cap.ok:
                print(f"{name:14s} {label:24s} server failed: {cap.reason}")
                failures += 1
                continue
            log = parse_load_log(cap.text)
            got = {k: mib(v) for k, v in log.model_buffers}
            want = {b.name: mib(b.bytes) for b in p.buffers}
            meas = log.to_footprint()
            rows = []
            ok = got == want
            for d in p.footprint.devices:
                md = meas.device(d.name)
                ctx_ok = md is not None and mib(md.context.bytes) == mib(d.context.bytes)
                out_ok = md is not None and mib(md.output.bytes) == mib(d.output.bytes)
                ok = ok and ctx_ok and out_ok
                rows.append(f"{d.name}: ctx {mib(md.context.bytes if md else None)}/{mib(d.context.bytes)} "
                            f"out {mib(md.output.bytes if md else None)}/{mib(d.output.bytes)} "
                            f"compute {mib(md.compute.bytes if md else None)}/{mib(d.compute.bytes)} ({d.compute.source})")
            print(f"{'ok  ' if ok else 'FAIL'} {name:14s} {label:24s} model log {got} priced {want}; " + "; ".join(rows))
            failures += 0 if ok else 1
    print(f"{failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
