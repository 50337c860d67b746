"""What does fitevict add on the way to llama-server? Every row measured side by side in one run.

Starts ``fitevict serve`` on demo-zoo models and compares, alternating so both see the same machine state:
- 1-token chat latency (p50, p99) on the tiny model resident in RAM, direct to the seat vs through fitevict;
- stream chunks/s on the ~200 MB f16 model (fresh connection per stream: llama-server drops keep-alive after one);
- 16 concurrent clients' throughput, as a ratio to direct;
- cold start to first token: the seat's own argv run as a bare llama-server vs fitevict loading it for a request;
- fitevict's own RSS/PSS after start and after ``--mem-requests`` requests.
Each row is the median of ``--runs`` runs. The client is a raw socket with httptools (no HTTP library in the
measurement). ``--profile DIR`` records fitevict with py-spy during one extra latency loop. Writes the
``proxy_overhead`` section of docs/benchmarks.md.

    .venv/bin/python bench/proxy_overhead.py [--runs 3] [--profile /tmp/prof]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httptools
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import write_section  # noqa: E402

TINY, MEDIUM = "llama-gqa", "llama-medium"


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Answer:
    def __init__(self) -> None:
        self.done, self.events, self.first, self.keep_alive = False, 0, None, True
        self.parser = httptools.HttpResponseParser(self)

    def on_body(self, b: bytes) -> None:
        if self.first is None:
            self.first = time.perf_counter()
        self.events += b.count(b"data: ")

    def on_message_complete(self) -> None:
        self.done = True
        self.keep_alive = self.parser.should_keep_alive()


def request_bytes(port: int, path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


class Client:
    """One kept-alive connection; ``post`` returns (status, SSE events, first-body time). llama-server closes
    a kept-alive connection after a few requests (``Connection: close``): the next ``post`` reconnects, inside
    its timing, as any client of llama-server must."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None

    def _connect(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def post(self, req: bytes, retry: bool = True) -> tuple[int, int, float | None]:
        if self.sock is None:
            self._connect()
        a = _Answer()
        self.sock.sendall(req)
        while not a.done:
            data = self.sock.recv(1 << 16)
            if not data:
                self.close()
                if retry and a.first is None:  # an idle connection the server had closed: once more
                    return self.post(req, retry=False)
                raise ConnectionError("closed")
            a.parser.feed_data(data)
        if not a.keep_alive:
            self.close()
        return a.parser.get_status_code(), a.events, a.first

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def once(port: int, req: bytes) -> tuple[int, int, float | None]:
    c = Client(port)
    try:
        return c.post(req)
    finally:
        c.close()


async def concurrent_throughput(port: int, req: bytes, clients: int, per_client: int) -> float:
    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(per_client):
            a = _Answer()
            writer.write(req)
            while not a.done:
                a.parser.feed_data(await reader.read(1 << 16))
            assert a.parser.get_status_code() == 200
            if not a.keep_alive:
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    return clients * per_client / (time.perf_counter() - t0)


def proc_mem(pid: int) -> tuple[float, float]:
    """(RSS, PSS) MiB of one process, from /proc/PID/smaps_rollup (measured)."""
    vals = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        parts = line.split()
        if parts and parts[0] in ("Rss:", "Pss:"):
            vals[parts[0]] = int(parts[1]) / 1024
    return vals["Rss:"], vals["Pss:"]


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of one process so far, from /proc/PID/stat (measured)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_health(url: str, proc: subprocess.Popen, timeout: float = 60, poll: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5) as c:
        while True:
            try:
                if c.get(url + "/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{url} not healthy")
            time.sleep(poll)


def cold_bare(argv: list[str], port: int, req: bytes) -> float:
    """Spawn the seat's argv on ``port``, poll /health every 5 ms, then time to the first streamed event."""
    argv = list(argv)
    argv[argv.index("--port") + 1] = str(port)
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_health(f"http://127.0.0.1:{port}", proc)
        _, _, first = once(port, req)
        return first - t0
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@dataclass(frozen=True)
class Paths:
    """The seats measured, each reached two ways: direct to its own port and through fitevict's."""

    port: int  # fitevict's
    dport: int  # the tiny model's seat
    mport: int  # the medium model's seat
    seat_argv: list[str]  # the medium seat's command line, for the bare cold starts
    sbody: dict  # the stream's request body
    dchat: bytes
    fchat: bytes
    dstream: bytes
    fstream: bytes


@dataclass(frozen=True)
class Memory:
    """fitevict's own (RSS, PSS) MiB after start, before and after the memory requests, and its CPU seconds and
    wall seconds over them."""

    start: tuple[float, float]
    before: tuple[float, float]
    after: tuple[float, float]
    cpu: float
    loop_s: float


def parse_args() -> argparse.Namespace:
    """The command line: how many of each measurement, fitevict's log level and config, profile, doc."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--stream-tokens", type=int, default=128)
    ap.add_argument("--streams", type=int, default=6)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--per-client", type=int, default=20)
    ap.add_argument("--cold", type=int, default=3)
    ap.add_argument("--mem-requests", type=int, default=10000)
    ap.add_argument("--log-level", default="info", help="fitevict's log level (info writes the request line)")
    ap.add_argument("--profile", type=Path, default=None, help="py-spy raw profile of fitevict into this folder")
    ap.add_argument("--config", type=Path, default=None, help="a fitevict.toml for the front door (default: none)")
    ap.add_argument("--no-doc", action="store_true")
    return ap.parse_args()


def start_fitevict(args: argparse.Namespace) -> tuple[subprocess.Popen, int]:
    """``fitevict serve`` over the two models in a temporary folder, in its own process group: (process, port)."""
    from fitevict.zoo import write_zoo

    tmp = Path(tempfile.mkdtemp(prefix="fitevict-bench-"))
    write_zoo(tmp / "zoo", only=[TINY, MEDIUM])
    port = free_port()
    log = (tmp / "serve.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "fitevict.cli", "serve", "--port", str(port), "--models-dir",
                             str(tmp / "zoo"), "--data-dir", str(tmp / "data"), "--log-level", args.log_level],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "FITEVICT_CONFIG": str(args.config or "")})
    return proc, port


def load_seats(port: int, stream_tokens: int) -> Paths:
    """Both models loaded through fitevict; their seats' ports and the requests for each path."""
    front = f"http://127.0.0.1:{port}"
    chat = {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}
    sbody = {"model": MEDIUM, "prompt": "once", "max_tokens": stream_tokens, "stream": True,
             "temperature": 0, "ignore_eos": True}
    with httpx.Client(base_url=front, timeout=300) as c:
        for m in (TINY, MEDIUM):
            c.post(f"/v1/models/{m}/load").raise_for_status()
        seats = {r["key"]: r for r in c.get("/v1/models/residents").json()["data"]}
    dport, mport = seats[TINY]["port"], seats[MEDIUM]["port"]
    seat_argv = Path(f"/proc/{seats[MEDIUM]['pid']}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
    return Paths(port=port, dport=dport, mport=mport, seat_argv=seat_argv, sbody=sbody,
                 dchat=request_bytes(dport, "/v1/chat/completions", chat),
                 fchat=request_bytes(port, "/v1/chat/completions", chat),
                 dstream=request_bytes(mport, "/v1/completions", sbody),
                 fstream=request_bytes(port, "/v1/completions", sbody))


def time_latency(requests: int, direct: Client, via: Client, t: Paths) -> dict[str, list[float]]:
    """Seconds of each 1-token chat, direct ("d") and through fitevict ("f"), alternating which goes first."""
    lat: dict[str, list[float]] = {"d": [], "f": []}
    for i in range(requests):
        for name in (("d", "f") if i % 2 == 0 else ("f", "d")):
            cl, req = (direct, t.dchat) if name == "d" else (via, t.fchat)
            t0 = time.perf_counter()
            st, _, _ = cl.post(req)
            lat[name].append(time.perf_counter() - t0)
            assert st == 200
    return lat


def time_streams(streams: int, t: Paths) -> dict[str, list[float]]:
    """Chunks per second of each stream, direct ("d") and through fitevict ("f"), each on a fresh connection."""
    tps: dict[str, list[float]] = {"d": [], "f": []}
    for i in range(streams):
        for name in (("d", "f") if i % 2 == 0 else ("f", "d")):
            p, req = (t.mport, t.dstream) if name == "d" else (t.port, t.fstream)
            t0 = time.perf_counter()
            st, n, _ = once(p, req)
            tps[name].append((n - 1) / (time.perf_counter() - t0))  # [DONE] is not a chunk of text
    return tps


def one_run(args: argparse.Namespace, t: Paths, direct: Client, via: Client, rows: dict[str, list[float]],
            run: int) -> None:
    """One run of the side-by-side measures (latency, streams, concurrency), its medians added to ``rows``."""
    say(f"run {run + 1}/{args.runs}: latency")
    direct.close(), via.close()  # fresh kept-alive connections, outside the timing
    direct.post(t.dchat), via.post(t.fchat)
    lat = time_latency(args.requests, direct, via, t)
    rows["d50"].append(pct(lat["d"], 0.5)), rows["f50"].append(pct(lat["f"], 0.5))
    rows["d99"].append(pct(lat["d"], 0.99)), rows["f99"].append(pct(lat["f"], 0.99))
    say("streams")
    tps = time_streams(args.streams, t)
    if args.streams:
        rows["sd"].append(statistics.median(tps["d"])), rows["sf"].append(statistics.median(tps["f"]))
    say("concurrency")
    for name in ("d", "f"):
        p, req = (t.dport, t.dchat) if name == "d" else (t.port, t.fchat)
        rows["c" + name].append(asyncio.run(concurrent_throughput(p, req, args.clients, args.per_client)))


def cold_starts(cold: int, t: Paths, rows: dict[str, list[float]]) -> None:
    """Seconds to the first streamed event, ``cold`` times each: the seat's argv run bare ("bare"), and fitevict
    loading the medium model again for a request ("cold")."""
    say("cold starts")
    cold_req = request_bytes(t.port, "/v1/completions", {**t.sbody, "max_tokens": 1})
    with httpx.Client(base_url=f"http://127.0.0.1:{t.port}", timeout=300) as c:
        for _ in range(cold):
            bare_port = free_port()
            rows["bare"].append(cold_bare(t.seat_argv, bare_port,
                                          request_bytes(bare_port, "/v1/completions", {**t.sbody, "max_tokens": 1})))
            c.post(f"/v1/models/{MEDIUM}/unload").raise_for_status()
            t0 = time.perf_counter()
            _, _, first = once(t.port, cold_req)
            rows["cold"].append(first - t0)


def profile(folder: Path, pid: int, via: Client, fchat: bytes) -> None:
    """py-spy records fitevict (raw, into ``folder``) during 3000 chats through it."""
    say("profile")
    folder.mkdir(parents=True, exist_ok=True)
    spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid), "--rate", "2000", "--format", "raw",
                            "--output", str(folder / "fitevict.txt"), "--nonblocking"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    time.sleep(1.0)  # py-spy attaches
    for _ in range(3000):
        via.post(fchat)
    spy.send_signal(signal.SIGINT)
    spy.wait(60)


def measure(args: argparse.Namespace, proc: subprocess.Popen, port: int) -> tuple[dict[str, list[float]], Memory]:
    """Every figure of the section, from a running fitevict: each measure's value per run, and its memory."""
    rows: dict[str, list[float]] = {k: [] for k in ("d50", "f50", "d99", "f99", "sd", "sf", "cd", "cf", "bare",
                                                   "cold")}
    wait_health(f"http://127.0.0.1:{port}", proc)
    time.sleep(1.0)  # let start-up work settle before the idle figure
    mem_start = proc_mem(proc.pid)
    t = load_seats(port, args.stream_tokens)
    direct, via = Client(t.dport), Client(port)
    for _ in range(20):  # warm both paths
        direct.post(t.dchat), via.post(t.fchat)
    for run in range(args.runs):
        one_run(args, t, direct, via, rows, run)
    cold_starts(args.cold, t, rows)
    via.close()
    via = Client(port)  # the old connection idled past uvicorn's keep-alive timeout during the cold starts
    if args.profile is not None:
        profile(args.profile, proc.pid, via, t.fchat)
    say(f"{args.mem_requests} requests for memory")
    mem_before, cpu0, t_loop = proc_mem(proc.pid), proc_cpu(proc.pid), time.perf_counter()
    for _ in range(args.mem_requests):
        via.post(t.fchat)
    t_loop, cpu = time.perf_counter() - t_loop, proc_cpu(proc.pid) - cpu0
    mem_after = proc_mem(proc.pid)
    direct.close(), via.close()
    return rows, Memory(start=mem_start, before=mem_before, after=mem_after, cpu=cpu, loop_s=t_loop)


def section(args: argparse.Namespace, rows: dict[str, list[float]], mem: Memory) -> str:
    """The ``proxy_overhead`` section: how it was measured, the table of medians, each run, fitevict's memory."""
    med = {k: statistics.median(v) if v else float("nan") for k, v in rows.items()}
    ms = lambda x: x * 1000  # noqa: E731
    runs = lambda k, f=ms: ", ".join(f"{f(x):.3f}" if f is ms else f"{x:.1f}" for x in rows[k])  # noqa: E731
    per = lambda k: runs(k, f=None)  # noqa: E731
    add50 = statistics.median(f - d for d, f in zip(rows["d50"], rows["f50"]))
    add99 = statistics.median(f - d for d, f in zip(rows["d99"], rows["f99"]))
    return f"""## Proxy overhead (`bench/proxy_overhead.py`)

Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores shared with other work running
at the same time (so every figure is a ratio or difference taken side by side, alternating), Python
{platform.python_version()}, fitevict at log level `{args.log_level}`. Medians of {args.runs} runs; each run:
{args.requests} 1-token chats per path on `{TINY}` (resident in RAM), alternating direct-to-seat and through
fitevict on one kept-alive connection each; {args.streams} streams of {args.stream_tokens} tokens per path on
`{MEDIUM}` (~200 MB f16), each on a fresh connection; {args.clients} concurrent clients x {args.per_client} chats per
path. Cold start: the seat's own argv run as a bare llama-server (health polled every 5 ms) vs a request that
makes fitevict load the model, both to the first streamed event, {args.cold} times each. The client is a raw
socket with httptools. All figures measured.

| measure | direct | via fitevict | added / ratio | target |
|---|---|---|---|---|
| p50, 1-token chat | {ms(med['d50']):.3f} ms | {ms(med['f50']):.3f} ms | {ms(add50):+.3f} ms | <= +0.3 ms |
| p99, 1-token chat | {ms(med['d99']):.3f} ms | {ms(med['f99']):.3f} ms | {ms(add99):+.3f} ms | <= +2 ms |
| stream chunks/s, {args.stream_tokens} tokens | {med['sd']:.1f} | {med['sf']:.1f} | ratio {med['sf'] / med['sd']:.3f} | >= 0.99 |
| {args.clients} clients, requests/s | {med['cd']:.1f} | {med['cf']:.1f} | ratio {med['cf'] / med['cd']:.3f} | >= 0.95 |
| cold start to first token | {med['bare']:.3f} s bare | {med['cold']:.3f} s | ratio {med['cold'] / med['bare']:.2f} | <= 1.05 |

Runs (direct / via): p50 ms {runs('d50')} / {runs('f50')}; p99 ms {runs('d99')} / {runs('f99')};
chunks/s {per('sd')} / {per('sf')}; requests/s {per('cd')} / {per('cf')}; cold s
{', '.join(f'{x:.3f}' for x in rows['bare'])} / {', '.join(f'{x:.3f}' for x in rows['cold'])}.

fitevict's own memory (`/proc/PID/smaps_rollup`, measured, seats excluded): RSS {mem.start[0]:.1f} MiB, PSS
{mem.start[1]:.1f} MiB after start; RSS {mem.after[0]:.1f} MiB, PSS {mem.after[1]:.1f} MiB after
the loads, the runs above and {args.mem_requests} more requests; growth over those {args.mem_requests} requests
{mem.after[0] - mem.before[0]:+.2f} MiB RSS, {mem.after[1] - mem.before[1]:+.2f} MiB PSS. fitevict's own CPU
over those requests (`/proc/PID/stat` utime + stime, measured): {1e6 * mem.cpu / max(1, args.mem_requests):.0f} µs per
request, at {args.mem_requests / mem.loop_s:.0f} requests/s from one client.
"""


def main() -> None:
    """Measure fitevict side by side with its seats, print the section and (unless --no-doc) write it."""
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop fitevict and its seats on the way out
    proc, port = start_fitevict(args)
    try:
        rows, mem = measure(args, proc, port)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    body_md = section(args, rows, mem)
    print(body_md)
    if not args.no_doc:
        write_section("proxy_overhead", body_md)


if __name__ == "__main__":
    main()
