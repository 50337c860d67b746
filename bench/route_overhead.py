"""What does fitevict add per API? Chat, Anthropic's Messages and OpenAI's Responses side by side, in one run.

Starts ``fitevict serve`` on the tiny demo model and times 1-token answers direct to the seat and through fitevict
on each route, interleaved request by request (routes and sides in turning order) so every row sees the same
machine state. The
added latency is fitevict's p50 minus the seat's p50 on the same route; each row is the median of ``--runs`` runs.
The client is proxy_overhead's raw socket. Writes the ``route_overhead`` section of docs/benchmarks.md.

    .venv/bin/python bench/route_overhead.py [--runs 3] [--requests 300]
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import write_section  # noqa: E402
from proxy_overhead import TINY, Client, free_port, pct, request_bytes, say, wait_health  # noqa: E402

ROUTES = {  # route -> a 1-token request for the tiny model
    "/v1/chat/completions": {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                             "temperature": 0},
    "/v1/messages": {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                     "temperature": 0},
    "/v1/responses": {"model": TINY, "input": "hi", "max_output_tokens": 1, "temperature": 0},
}


def measure(port: int, dport: int, requests: int) -> dict[str, tuple[float, float]]:
    """Per route: (direct p50, fitevict p50) in seconds. Request by request, every route is asked on both sides,
    the routes' and the sides' order turning, so that each route sees the same moments of the machine."""
    direct, via = Client(dport), Client(port)
    reqs = {p: (request_bytes(dport, p, b), request_bytes(port, p, b)) for p, b in ROUTES.items()}
    for dreq, freq in reqs.values():
        for _ in range(20):  # warm both paths
            assert direct.post(dreq)[0] == 200 and via.post(freq)[0] == 200
    lat: dict[tuple[str, str], list[float]] = {(p, side): [] for p in ROUTES for side in "df"}
    paths = list(ROUTES)
    for i in range(requests):
        for path in paths[i % len(paths):] + paths[:i % len(paths)]:
            for side in (("d", "f") if i % 2 == 0 else ("f", "d")):
                cl, req = (direct, reqs[path][0]) if side == "d" else (via, reqs[path][1])
                t0 = time.perf_counter()
                assert cl.post(req)[0] == 200
                lat[(path, side)].append(time.perf_counter() - t0)
    direct.close(), via.close()
    return {p: (pct(lat[(p, "d")], 0.5), pct(lat[(p, "f")], 0.5)) for p in ROUTES}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from fitevict.zoo import write_zoo

    tmp = Path(tempfile.mkdtemp(prefix="fitevict-bench-"))
    write_zoo(tmp / "zoo", only=[TINY])
    port = free_port()
    log = (tmp / "serve.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "fitevict.cli", "serve", "--port", str(port), "--models-dir",
                             str(tmp / "zoo"), "--data-dir", str(tmp / "data")],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "FITEVICT_CONFIG": ""})
    runs: list[dict[str, tuple[float, float]]] = []
    try:
        wait_health(f"http://127.0.0.1:{port}", proc)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as c:
            c.post(f"/v1/models/{TINY}/load").raise_for_status()
            dport = c.get("/v1/models/residents").json()["data"][0]["port"]
        for r in range(args.runs):
            say(f"run {r + 1}/{args.runs}")
            runs.append(measure(port, dport, args.requests))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    body = report(runs, args)
    print(body)
    if not args.no_doc:
        write_section("route_overhead", body)


def report(runs: list[dict[str, tuple[float, float]]], args: argparse.Namespace) -> str:
    ms = 1000
    added = {p: statistics.median((f - d) * ms for d, f in (run[p] for run in runs)) for p in ROUTES}
    chat = added["/v1/chat/completions"]
    lines = ["## Added latency per API (bench/route_overhead.py)", "",
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; the tiny model ({TINY}) resident, "
             f"1-token answers, {args.requests} requests per route and side per run, median of {args.runs} runs "
             f"(p50 per run). fitevict's added latency is its p50 minus the seat's own on the same route.", "",
             "| route | seat p50 ms | fitevict p50 ms | added ms | added - chat's ms | runs (added ms) |",
             "|---|---|---|---|---|---|"]
    for p in ROUTES:
        d = statistics.median(run[p][0] for run in runs) * ms
        f = statistics.median(run[p][1] for run in runs) * ms
        each = ", ".join(f"{(run[p][1] - run[p][0]) * ms:.3f}" for run in runs)
        lines.append(f"| `{p}` | {d:.3f} | {f:.3f} | {added[p]:.3f} | {added[p] - chat:+.3f} | {each} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
