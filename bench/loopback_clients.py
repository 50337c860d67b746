"""What a client to a seat costs to make: httpx's default (a TLS context of its own, its CA bundle loaded) against
``engines.loopback`` (one shared context), side by side in one run, each made and closed ``--n`` times on an event
loop as the door makes them (a prompt saved at an eviction, restored at a load). Writes the ``loopback_clients``
section of docs/benchmarks.md.

    .venv/bin/python bench/loopback_clients.py [--n 50] [--no-doc]
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import write_section  # noqa: E402
from _serve import cpu_model, load_average  # noqa: E402

from fitevict.engines import loopback  # noqa: E402

BASE = "http://127.0.0.1:9"


def _counted(make) -> tuple[list[float], int]:
    """Seconds to make and close each client, and the TLS contexts made meanwhile."""
    made = []
    real = ssl.create_default_context

    def count(*a, **kw):
        made.append(1)
        return real(*a, **kw)

    async def run(n: int) -> list[float]:
        out = []
        for _ in range(n):
            t = time.perf_counter()
            async with make():
                pass
            out.append(time.perf_counter() - t)
        return out

    ssl.create_default_context = count
    try:
        return asyncio.run(run(ARGS.n)), len(made)
    finally:
        ssl.create_default_context = real


def main() -> None:
    loopback.tls()  # the shared context is made once, before the timings
    before = load_average()
    default, d_ctx = _counted(lambda: httpx.AsyncClient(base_url=BASE, timeout=5))
    shared, s_ctx = _counted(lambda: loopback.aclient(BASE, 5))
    md, ms = statistics.median(default), statistics.median(shared)
    body = (f"## Making a client to a seat (`bench/loopback_clients.py`)\n\n"
            f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {cpu_model()} (load averages "
            f"{before}), {ARGS.n} clients each, made and closed on an event loop, measured:\n\n"
            "| client | median ms to make and close | TLS contexts made |\n|---|---:|---:|\n"
            f"| `httpx.AsyncClient` (its own context, CA bundle loaded) | {md * 1e3:.2f} | {d_ctx} |\n"
            f"| `engines.loopback.aclient` (one shared context) | {ms * 1e3:.3f} | {s_ctx} |\n\n"
            f"The shared context makes a client {md / ms:.0f} times faster; the door made one for every prompt it "
            "saved or restored, on its event loop.\n")
    print(body)
    if not ARGS.no_doc:
        write_section("loopback_clients", body)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--no-doc", action="store_true")
    ARGS = p.parse_args()
    main()
