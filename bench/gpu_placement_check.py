"""GPU placement pricing against a real CUDA llama-server: record on a GPU machine, replay anywhere.

One command on a machine with an NVIDIA GPU builds the CUDA variant of the pinned engine (or takes ``--bin-dir``),
then loads every demo-zoo model in every placement on ``CUDA0`` under the allocator trace (engines/llama_cpp/buftrace):
all layers, N layers, none, MoE experts on the CPU, KV off the device (``-nkvo``), flash attention on and off,
no mmap. For each load it keeps the engine's exact log, the engine's own dry run on that device (its compute
bytes), and the seat's GPU memory as NVML reads it while loaded (measured). The records go to
``--out/gpu_records.jsonl.gz``, with the GPU, driver, CUDA, CPU and build in the first line::

    python3 bench/gpu_placement_check.py --build --out "$OUT"      # about 5 min to build on 16 cores, 2 to check

``--report FILE`` (any machine, no GPU) prices each recorded load with today's code (the recorded machine's host
buffer table and the dry run's compute) and compares it with the recorded allocator bytes per device and term:
model, KV and output must be exact, compute within 1 %. It prints the table, writes it into docs/accuracy.md
(section ``gpu-placement``) unless ``--no-write``, and exits 1 on any miss.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fitevict.engines.llama_cpp.dryrun import capture_load_log, dry_run
from fitevict.pricing.loadconfig import LoadConfig

DEFAULT_MODELS = ("llama-gqa", "llama-tied", "llama-moe", "llama-q4_0", "gemma2-swa")
RECORDS = "gpu_records.jsonl.gz"
DEV = "CUDA0"


def configs(n_layer: int, moe: bool, dev: str = DEV, rpc: tuple[str, ...] = ()) -> list[tuple[str, LoadConfig]]:
    """Every placement the planner can choose on one device, as llama-server flags and a LoadConfig."""
    base = LoadConfig(n_ctx=1000, n_parallel=1, devices=(dev,), rpc=rpc)
    out = [(f"-ngl {n}", base.with_(n_gpu_layers=n)) for n in sorted({0, 1, n_layer // 2, n_layer, 99})]
    out += [("-ngl 2 -lm none", base.with_(n_gpu_layers=2, mmap=False)),
            ("-ngl 99 -nkvo", base.with_(n_gpu_layers=99, kv_offload=False)),
            ("-ngl 1 -nkvo", base.with_(n_gpu_layers=1, kv_offload=False)),
            ("-ngl 99 -fa on", base.with_(n_gpu_layers=99, flash_attn="on")),
            ("-ngl 99 -fa off", base.with_(n_gpu_layers=99, flash_attn="off"))]
    if moe:
        out += [(f"-ngl 99 --n-cpu-moe {n}", base.with_(n_gpu_layers=99, n_cpu_moe=n)) for n in (1, n_layer)]
    return out


def _text(argv: list[str]) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable, because {argv[0]} could not run: {type(e).__name__}: {e}"
    return (r.stdout or r.stderr).strip()


def machine_facts(bin_dir: Path, build_seconds: float | None, commit: str) -> dict:
    from fitevict.engines.llama_cpp.machine import host_buffers
    from fitevict.host.cpu import this_cpu

    cpu = this_cpu()
    return {"kind": "facts", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
            "gpu": _text(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,pci.bus_id",
                          "--format=csv,noheader"]),
            "nvcc": _text(["nvcc", "--version"]).splitlines()[-1:], "cpu_model": cpu.model,
            "cpu_fingerprint": cpu.fingerprint, "python": platform.python_version(),
            "build_seconds": build_seconds, "engine_version": _text([str(bin_dir / "llama-server"), "--version"]),
            "host_buffers": host_buffers(bin_dir / "llama-server").to_json()}


def nvml_used(pid: int) -> dict:
    """The process's GPU memory as NVML reads it (measured), or why not."""
    from fitevict.host.nvml import read_gpus

    reading = read_gpus()
    if not reading.available:
        return {"unavailable": f"NVML: {reading.reason}"}
    used = reading.used_by({pid})
    return {k: v for k, v in used.items()}


def record_one(bin_dir: Path, name: str, path: Path, label: str, cfg: LoadConfig) -> dict:
    dry = dry_run(bin_dir, path, cfg, use_cache=False)
    seen: dict = {}
    cap = capture_load_log(bin_dir, path, cfg, wait_listening=True, exact=True, timeout_s=120,
                           on_ready=lambda pid: seen.update(nvml_used(pid)))
    return {"kind": "load", "model": name, "label": label, "config": cfg.to_json(), "ok": cap.ok,
            "reason": cap.reason, "log": cap.text,
            "dry_compute": None if not hasattr(dry, "compute") else dry.compute,
            "dry_unavailable": getattr(dry, "reason", None), "nvml": seen}


def build(arch: str) -> tuple[Path, float]:
    from fitevict.engines.llama_cpp.install import install

    last = [0.0]

    def say(msg: str, frac: float | None) -> None:
        if frac is None or frac >= last[0] + 0.1 or frac >= 1.0:
            last[0] = frac or last[0]
            print(f"[build {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    res = install(variant="cuda", cuda_arch=arch, progress=say)
    print(f"CUDA build {'found' if res.already else 'made'} in {res.seconds:.0f} s: {res.bin_dir}", flush=True)
    return res.bin_dir, res.seconds


def record(args: argparse.Namespace) -> int:
    from fitevict.pricing.gguf import load_structure
    from fitevict.zoo import write_zoo

    bin_dir, seconds = build(args.cuda_arch) if args.build else (args.bin_dir, None)
    zoo = write_zoo(Path(tempfile.mkdtemp(prefix="fitevict-gpu-")), only=args.models.split(","))
    jobs = [(m.name, m.path, label, cfg) for m in zoo
            for s in [load_structure(m.path)]
            for label, cfg in configs(s.n_layer, s.is_moe, args.device, tuple(filter(None, args.rpc.split(","))))]
    out = args.out / RECORDS
    args.out.mkdir(parents=True, exist_ok=True)
    t0, failed = time.monotonic(), 0
    with gzip.open(out, "wt") as f, ThreadPoolExecutor(args.parallel) as pool:
        f.write(json.dumps(machine_facts(bin_dir, seconds, args.commit)) + "\n")
        for rec in pool.map(lambda j: record_one(bin_dir, *j), jobs):
            f.write(json.dumps(rec) + "\n")
            f.flush()
            failed += not rec["ok"]
            print(f"{'ok  ' if rec['ok'] else 'FAIL'} {rec['model']:12s} {rec['label']:24s} "
                  f"nvml {rec['nvml']} {rec['reason']}", flush=True)
    print(f"{len(jobs)} loads recorded in {time.monotonic() - t0:.0f} s ({failed} failed to load) -> {out}")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin-dir", type=Path, help="a CUDA build's bin directory (instead of --build)")
    ap.add_argument("--build", action="store_true", help="build the CUDA variant first (engine install, cached)")
    ap.add_argument("--cuda-arch", default="native", help="CMAKE_CUDA_ARCHITECTURES for --build (e.g. 90)")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--device", default=DEV, help="the engine's device to place on (CUDA0; RPC0 with --rpc)")
    ap.add_argument("--rpc", default="", help="rpc-server endpoints HOST:PORT,... for an RPC device")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or tempfile.mkdtemp()))
    ap.add_argument("--parallel", type=int, default=4, help="loads at once (each a small model)")
    ap.add_argument("--commit", default=os.environ.get("FITEVICT_COMMIT", "unavailable, because not given"))
    ap.add_argument("--report", type=Path, help="replay a records file here and write the table")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if args.report:
        from gpu_placement_report import report
        return report(args.report, write=not args.no_write)
    if not args.build and args.bin_dir is None:
        ap.error("give --build or --bin-dir")
    return record(args)


if __name__ == "__main__":
    sys.exit(main())
