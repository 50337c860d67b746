"""An RPC device's price against its rpc-server's memory through a filled context: a section of docs/accuracy.md.

Per model, every layer on one ``ggml-rpc-server`` on loopback (``-t 1``, started here): the device priced as
``fitevict price`` prices it (its probe's rules, compute from the engine's own dry run, the rpc-server's own parts by
rule: ``pricing/rpcserver``), then a seat on a fresh rpc-server whose context is filled twice (a prompt of
``n_ctx - 32`` tokens, 32 generated), and the server's PSS growth over its idle baseline read as the supervisor reads
an RPC device (``host.devmem.RpcServerReader``). Target: the price within -2 % / +10 % of that growth. Beside it:
the engine's buffers alone against the same growth, and what the server kept once the seat stopped.

    .venv/bin/python bench/rpc_filled.py [--models a,b] [--ctx 2048] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import write_section  # noqa: E402
from _serve import cpu_model, load_average  # noqa: E402

from fitevict.engines.llama_cpp.install import engine_root
from fitevict.engines.llama_cpp.rpcfilled import RpcFilled, RpcPrice, fill_rpc_seat, predict_rpc
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.units import MiB
from fitevict.zoo import write_zoo

DOC = Path(__file__).resolve().parents[1] / "docs" / "accuracy.md"
MODELS = ("llama-medium", "llama-gqa", "llama-q4_0", "gemma2-swa", "granitehybrid-moe")
BELOW, ABOVE = 0.02, 0.10  # the price may fall 2 % under the measured growth and exceed it by 10 %


def error(priced: int, measured: int) -> float:
    return (priced - measured) / measured


def within(priced: int, measured: int) -> bool:
    return -BELOW <= error(priced, measured) <= ABOVE


def row(name: str, ctx: int, p: RpcPrice, got: RpcFilled) -> str:
    parts = ", ".join(f"{t.name} {t.bytes / MiB:.2f}" for t in p.terms)
    return (f"| {name} | {ctx} | {p.buffers_total / MiB:.2f} / {got.traced_total / MiB:.2f} | {parts} | "
            f"**{p.total / MiB:.2f}** | {got.loaded / MiB:.2f} | {got.first / MiB:.2f} | "
            f"**{got.filled / MiB:.2f}** | "
            f"{100 * error(p.total, got.filled):+.2f} % | {100 * error(p.buffers_total, got.filled):+.2f} % | "
            f"{'yes' if within(p.total, got.filled) else '**no**'} | {got.kept / MiB:.2f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    bin_dir = engine_root() / "bin"
    load_before = load_average()
    lines = ["| model | ctx | buffers MiB priced / traced | rpc-server's parts priced (MiB) | price MiB | "
             "growth listening MiB | growth, first fill | growth filled MiB (measured, second fill) | price vs growth | buffers alone vs growth | "
             "in -2 % / +10 % | kept after the seat stopped MiB |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    bad = 0
    with tempfile.TemporaryDirectory(prefix="fitevict-rpcfill-") as tmp:
        for m in write_zoo(Path(tmp), only=args.models.split(",")):
            cfg = LoadConfig(n_ctx=args.ctx, n_parallel=1, devices=("RPC0",), n_gpu_layers=99)
            p = predict_rpc(bin_dir, m.path, cfg)
            logs = Path(tmp) / m.name
            logs.mkdir()
            got = fill_rpc_seat(bin_dir, m.path, cfg, logs)
            bad += 0 if within(p.total, got.filled) else 1
            lines.append(row(m.name, args.ctx, p, got))
            print(lines[-1], flush=True)
    n = len(lines) - 2
    body = "\n".join([
        "## RPC device through a filled context (`bench/rpc_filled.py`)", "",
        f"Every layer on one `ggml-rpc-server -t 1` on loopback (the CPU build), `-c {args.ctx} -np 1`. The price is "
        "`fitevict price`'s for RPC0: the engine's buffers there (probe rules, dry-run compute) and the rpc-server's "
        "own parts by rule (`pricing/rpcserver.py`: its CPU backend's work buffer over the device's layers; the "
        "largest input a ubatch sends it, received whole on its heap). The growth is the rpc-server's committed PSS "
        "over its idle baseline (`host/devmem.RpcServerReader`), measured once the seat listens and after every "
        "slot's context was filled, once and then again (a prompt of ctx − 32 tokens, 32 generated): the first fill's "
        "largest input is larger than any message before it, so glibc maps and unmaps it; from the second fill on "
        "it stays on the heap, as on a server that has served a while (`engines/llama_cpp/rpcfilled.py`). The traced buffers are the allocator "
        "trace's bytes on RPC0. The server keeps freed heap pages after the seat stops (last column): glibc serves "
        "allocations under its mmap threshold, which grows to the largest freed chunk (the weights' messages), "
        f"from the heap. {n - bad} of {n} within -2 % / +10 %.", "",
        *lines, "",
        f"CPU {cpu_model()}, load average {load_before} before, {load_average()} after (other processes ran on the "
        "machine; the figures are bytes, not times)."])
    print(body)
    if not args.no_write:
        write_section("devices-rpc-filled", body, doc=DOC)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
