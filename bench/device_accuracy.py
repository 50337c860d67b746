"""Prices on real device backends against the engine's allocator: writes a table per backend into docs/accuracy.md.

Each placement (all layers, N layers, MoE experts on the CPU, KV off the device, flash attention on and off, two
devices split by -ts with and without -nkvo, weights kept in host memory) is priced as ``fitevict price`` prices it
(the backend rules the device probe learned from the engine, compute from the engine's own dry run on that device)
and then loaded under the allocator trace; every term on every device is put beside the traced bytes. Targets:
model, context and output to the byte, compute within 1 %.

- RPC: one and two ``ggml-rpc-server`` processes on loopback, started and stopped here (the CPU build's);
- Vulkan: the Vulkan build's llama-server on ``Vulkan0`` (lavapipe needs ``GGML_VK_VISIBLE_DEVICES=0``, set here
  unless already set).

    .venv/bin/python bench/device_accuracy.py [--backends rpc,vulkan] [--models a,b] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import write_section  # noqa: E402
from _serve import cpu_model, load_average  # noqa: E402

from fitevict.engines.base import Unavailable
from fitevict.engines.llama_cpp.install import engine_root
from fitevict.engines.llama_cpp.devcheck import TERMS, Check, check, rpc_servers
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.units import MiB
from fitevict.zoo import write_zoo
from fitevict.zoo.recipes import MAMBA2_BY_STATE
from fitevict.zoo.write import write_gguf

DOC = Path(__file__).resolve().parents[1] / "docs" / "accuracy.md"
MODELS = ("llama-gqa", "llama-q4_0", "llama-moe", "gemma2-swa", "granitehybrid-moe", "mamba")


def mamba2_models() -> dict[str, Path]:
    """The pure mamba2 models kept outside the zoo, written to a temporary folder."""
    dest = Path(tempfile.mkdtemp(prefix="fitevict-devacc-mamba2-"))
    for r in MAMBA2_BY_STATE:
        write_gguf(r, dest / f"{r.name}.gguf")
    return {r.name: dest / f"{r.name}.gguf" for r in MAMBA2_BY_STATE}


def placements(n_layer: int, moe: bool, devs: tuple[str, ...], rpc: tuple[str, ...]) -> list[tuple[str, LoadConfig]]:
    """The placements priced on ``devs`` (two devices: split by -ts too)."""
    base = LoadConfig(n_ctx=1024, n_parallel=1, devices=devs[:1], rpc=rpc, n_gpu_layers=99)
    out = [("-ngl 99", base), (f"-ngl {max(n_layer // 2, 1)}", base.with_(n_gpu_layers=max(n_layer // 2, 1))),
           ("-ngl 99 -nkvo", base.with_(kv_offload=False)), ("-ngl 99 -fa on", base.with_(flash_attn="on")),
           ("-ngl 99 -fa off", base.with_(flash_attn="off")), ("-ngl 2 -lm none", base.with_(n_gpu_layers=2, mmap=False))]
    if moe:
        out.append(("-ngl 99 --n-cpu-moe 1", base.with_(n_cpu_moe=1)))
    if len(devs) > 1:  # with and without pipeline parallelism (-nkvo turns it off)
        two = base.with_(devices=devs, tensor_split=(1.0, 3.0))
        two_dev = f"-dev {','.join(devs)} -ts 1,3"
        out += [(two_dev, two), (f"{two_dev} -nkvo", two.with_(kv_offload=False))]
    return out


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / MiB:.3f}"


def rows(name: str, label: str, res: Check | Unavailable) -> list[str]:
    if isinstance(res, Unavailable):
        return [f"| {name} | {label} | — | unavailable, because {res.reason[:160]} | | | | |"]
    out = []
    for dev in sorted({t.device for t in res.terms}, key=lambda d: (d != "CPU", d)):
        cells = []
        for term in TERMS:
            t = next(x for x in res.terms if x.device == dev and x.term == term)
            err = "" if t.traced is None or t.traced == t.priced else f" ({t.priced - t.traced:+d} B)"
            cells.append(f"{_mib(t.priced)} / {_mib(t.traced)}{err}{'' if t.ok else ' ✗'}")
        out.append(f"| {name} | {label} | {dev} | " + " | ".join(cells) + f" | {'yes' if res.exact else 'no'} |")
    return out


def run_backend(title: str, bin_dir: Path, zoo: dict[str, Path], devs: tuple[str, ...], rpc: tuple[str, ...],
                say: Callable[[str], None]) -> tuple[list[str], int, int]:
    lines = [f"| model | placement | device | model MiB priced / traced | context | output | compute | exact |",
             "|---|---|---|---|---|---|---|---|"]
    n = bad = 0
    for name, path in zoo.items():
        s = load_structure(path)
        for label, cfg in placements(s.n_layer, s.is_moe, devs, rpc):
            res = check(bin_dir, path, cfg)
            n += 1
            bad += 0 if isinstance(res, Check) and res.ok else 1
            lines += rows(name, label, res)
            say(f"{title} {name} {label}: {'ok' if isinstance(res, Check) and res.ok else 'MISS'}"
                f"{'' if not isinstance(res, Check) or res.ok else ' ' + '; '.join(res.failures())}"
                f"{' ' + res.reason if isinstance(res, Unavailable) else ''}")
    return lines, n, bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="rpc,vulkan")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    root = engine_root()
    zoo = {m.name: m.path for m in write_zoo(Path(tempfile.mkdtemp(prefix="fitevict-devacc-")),
                                            only=args.models.split(","))}
    failed = 0
    for backend in args.backends.split(","):
        load_before = load_average()
        if backend == "rpc":
            bin_dir = root / "bin"
            with rpc_servers(bin_dir, 2) as eps:
                lines, n, bad = run_backend("rpc", bin_dir, zoo, ("RPC0", "RPC1"), eps, print)
            what = ("RPC devices: two `ggml-rpc-server -t 1` on loopback (RPC0, RPC1), the CPU build. The compute of a "
                    "device that takes over from another is the dry run's less the pipeline copies of the norm its "
                    "reserve counts there (`pricing/pipeline.py`, docs/machines.md); the compute terms are the dry "
                    "run's 0.01 MiB print, so a buffer of a few KiB cannot meet 1 %")
        elif backend == "vulkan":
            bin_dir = root / "build-vulkan" / "bin"
            os.environ.setdefault("GGML_VK_VISIBLE_DEVICES", "0")
            lines, n, bad = run_backend("vulkan", bin_dir, {**zoo, **mamba2_models()}, ("Vulkan0",), (), print)
            what = ("Vulkan0 (Mesa lavapipe, GGML_VK_VISIBLE_DEVICES=0), the Vulkan build; beside the zoo, two pure "
                    "mamba2 models whose weights agree in type and shape but whose SSM state (16, 128) decides "
                    "whether the device runs their scan (`zoo.recipes.MAMBA2_BY_STATE`)")
        else:
            raise SystemExit(f"unknown backend {backend!r}: rpc or vulkan")
        failed += bad
        body = "\n".join([
            f"## Device backend: {backend} (`bench/device_accuracy.py`)", "",
            f"{what}. Each cell: priced / traced MiB (the allocator's exact bytes), with the difference in bytes; "
            "✗ where a term misses its target (model, context, output to the byte; compute within 1 %). "
            f"{n - bad} of {n} placements on target.", "",
            *lines, "",
            f"CPU {cpu_model()}, load average {load_before} before, {load_average()} after."])
        print(body)
        if not args.no_write and backend == "rpc":
            write_section("devices-rpc", body, doc=DOC)
        elif not args.no_write:
            write_section("devices-vulkan", body, doc=DOC)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
