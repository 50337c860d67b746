"""Where fitevict's CPU goes per request, from a py-spy raw profile (``proxy_overhead.py --profile DIR``).

Samples in the event loop's own C code with no Python frame above it (``Runner.run`` as the leaf: epoll,
uvloop's callbacks) are left out; the rest is split into the parts below by the first matching frame, leaf
first, so each sample counts once. Shares are of fitevict's Python-level samples.

    .venv/bin/python bench/spy_summary.py DIR/fitevict.txt [--us-per-request 420]
"""

from __future__ import annotations

import argparse
import collections

# (part, marks): a frame belongs to the first part with a mark that is a substring of "function (path:line)";
# the leaf-most frame that belongs to a part decides the sample
PARTS = [
    ("send to the engine (the write syscall)", ("UpstreamConn._send (", "SocketStream.send (")),
    ("send to the client (uvicorn's send: head, body, write syscalls)", ("RequestResponseCycle.send (",)),
    ("request log line (json, logging, stderr)", ("RequestLog.write", "log_line", "logging/")),
    ("metrics (prometheus_client)", ("prometheus_client/",)),
    ("upstream client: httpx, httpcore, anyio, h11", ("httpx/", "httpcore/", "anyio/", "h11/")),
    ("upstream client: fitevict's own (httptools)", ("fitevict/server/upstream.py",)),
    ("supervisor: acquire and release the seat", ("fitevict/supervisor/", "contextlib.py")),
    ("seat memory readings (supervisor, not per request)", ("psutil/", "procmem.py")),
    ("body, keys, model, contract checks", ("fitevict/server/door.py", "fitevict/request/", "fitevict/stores/files.py",
                                            "json/")),
    ("FastAPI / Starlette routing, validation, responses", ("fastapi/", "starlette/", "pydantic")),
    ("fast path: relay and handler", ("fitevict/server/fastpath.py",)),
    ("old proxy handler", ("fitevict/server/openai.py",)),
    ("uvicorn: HTTP parsing, ASGI cycle", ("uvicorn/",)),
    ("asyncio: tasks, futures, events", ("asyncio/",)),
]


def summarize(path: str) -> tuple[int, list[tuple[str, int]]]:
    parts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in open(path):
        line = line.rstrip()
        if not line:
            continue
        stack, n_text = line.rsplit(" ", 1)
        if not n_text.isdigit():
            continue  # a line cut short when py-spy was stopped
        frames = stack.split(";")
        if frames[-1].startswith("Runner.run ("):
            continue  # the loop itself, waiting or in C
        total += int(n_text)
        for frame in reversed(frames):
            part = next((name for name, marks in PARTS if any(m in frame for m in marks)), None)
            if part is not None:
                parts[part] += int(n_text)
                break
        else:
            parts["other"] += int(n_text)
    return total, parts.most_common()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("--us-per-request", type=float, default=None, help="measured CPU µs per request, to scale by")
    args = ap.parse_args()
    total, parts = summarize(args.profile)
    print("| part | share | µs per request |" if args.us_per_request else "| part | share |")
    print("|---|---:|---:|" if args.us_per_request else "|---|---:|")
    for name, n in parts:
        share = n / total
        us = f" {share * args.us_per_request:.0f} |" if args.us_per_request else ""
        print(f"| {name} | {100 * share:.1f}% |{us}")


if __name__ == "__main__":
    main()
