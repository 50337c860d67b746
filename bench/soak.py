"""Hours of mixed traffic with faults: does the front door lose requests, or grow in memory, descriptors, children or
disk? Writes docs/reliability.md (section ``soak``) and docs/img/soak-*.png.

A real ``fitevict serve`` over demo-zoo models (two copies of the ~200 MB model that cannot share the budget, two
small ones, a copy for embeddings and the reranker), so models swap. ``--clients`` threads send a mixed workload of
every API (OpenAI chat/completions/embeddings/responses, Anthropic messages, Ollama chat/generate with their
``keep_alive``, rerank, tokenize; streamed and not; over kept-alive connections), a share of the streams hung up by
the client after their first bytes. Faults are injected at random (seat SIGKILL, seat SIGSTOP, a model file touched
and the models rescanned, a burst of connections). Every 10 s the front door's RSS, PSS, descriptors, threads,
children and zombies, the database's and the data directory's size are sampled. Every sample, request outcome and
fault is appended to ``--out`` (JSONL) as it happens, so a run cut short keeps its data.

    .venv/bin/python bench/soak.py [--minutes 30] [--out soak.jsonl] [--no-doc]
    .venv/bin/python bench/soak.py --report soak.jsonl      # the doc and plots from a run's file, at any time
    .venv/bin/python bench/soak.py --minutes 30 --trace-memory 120 --no-doc   # where the door's memory grows
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _serve import cpu_model, load_average, serve, signal_exit  # noqa: E402
import soak_faults  # noqa: E402
import soak_load  # noqa: E402

SAMPLE_S = 10.0
STALL_S = 5.0  # engine.stall_seconds in the soak's config: a seat stopped this long is killed by the door
SEAT_LOGS = 4 * 2**20  # logs.seats_disk in the soak's config: reached within the warm-up (seat logs grew 4 MiB/h)
# logs.history_rows and logs.records_per_signature: small enough to be reached within the warm-up (the door records
# 10 to 60 events a minute here), so that a data directory within its bounds is flat after it
HISTORY_ROWS = 100
RECORDS_PER_SIGNATURE = 4
PRUNE_S = 300.0  # logs.prune_seconds: the store pruned and its WAL checkpointed this often


class Journal:
    """The run's JSONL file: one record per line, flushed as written, from any thread."""

    def __init__(self, path: Path) -> None:
        self.f, self.lock = path.open("a"), threading.Lock()

    def write(self, kind: str, rec: dict) -> None:
        with self.lock:
            self.f.write(json.dumps({"rec": kind, **rec}) + "\n")
            self.f.flush()


def build_models(tmp: Path) -> Path:
    """The soak's models folder (demo zoo written once, then copied)."""
    from fitevict.engines.llama_cpp.install import engine_root
    from fitevict.zoo import write_zoo
    from fitevict.zoo.rerank import write_reranker

    zoo, models = tmp / "zoo", tmp / "models"
    write_zoo(zoo, only=["llama-medium", "llama-gqa", "llama-q8_0"])
    models.mkdir(exist_ok=True)
    for name, src in (("med-a", "llama-medium"), ("med-b", "llama-medium"), ("llama-gqa", "llama-gqa"),
                      ("llama-q8_0", "llama-q8_0"), ("embedder", "llama-gqa")):
        shutil.copyfile(zoo / f"{src}.gguf", models / f"{name}.gguf")
    write_reranker(models, engine_root() / "src" / "vendor" / "llama.cpp")
    return models


def medium_bytes(models: Path) -> int:
    """The priced host bytes of one medium copy at ctx 4096, -np 1 (the budget is sized in it)."""
    from fitevict.engines.llama_cpp.machine import host_buffers
    from fitevict.pricing.footprint import HOST
    from fitevict.pricing.gguf import load_structure
    from fitevict.pricing.loadconfig import LoadConfig
    from fitevict.pricing.price import price

    fp = price(load_structure(models / "med-a.gguf"), LoadConfig(n_ctx=4096, n_parallel=1), host=host_buffers())
    return fp.footprint.bytes_on(HOST)


def config(ram_limit: int) -> str:
    """The soak's config: the two medium copies cannot be resident together; the data directory's bounds small
    enough to be reached, and its pruning frequent enough to be seen, within a run."""
    return (f"[budget]\nram_limit = {ram_limit}\nram_reserve = 0\n[engine]\nstall_seconds = {STALL_S}\n"
            f"[policy]\nidle_unload_seconds = 90\n[logs]\nseats_disk = {SEAT_LOGS}\nhistory_rows = {HISTORY_ROWS}\n"
            f"records_per_signature = {RECORDS_PER_SIGNATURE}\nprune_seconds = {PRUNE_S}\n")


def bounds(cfg_path: Path) -> dict:
    """The data directory's configured bounds, as the door reads its config."""
    from fitevict.config import load_config

    cfg = load_config(cfg_path)
    return {"seat_logs": cfg.logs.seats_disk, "seats_per_model": cfg.logs.seats_per_model,
            "prompt_cache": cfg.policy.prompt_cache_disk, "history_rows": cfg.logs.history_rows,
            "history_days": cfg.logs.history_days, "prune_seconds": cfg.logs.prune_seconds,
            "records_per_signature": cfg.logs.records_per_signature, "records_rows": cfg.logs.records_rows}


def client_loop(base: str, journal: Journal, until: float, seed: int, hangups: float, stop: threading.Event) -> None:
    rng = random.Random(seed)
    with httpx.Client(timeout=httpx.Timeout(180.0, connect=10.0)) as client:
        n = 0
        while time.time() < until and not stop.is_set():
            kind, model, stream, hangup = soak_load.pick(rng, hangups)
            n += 1
            journal.write("request", soak_load.send(client, base, kind, model, stream, hangup, rng, f"soak-{seed}-{n}"))
            stop.wait(rng.uniform(0.3, 2.0))


def fault_loop(base: str, door_pid: int, models: Path, journal: Journal, until: float, every: float,
               stop: threading.Event) -> None:
    rng = random.Random(7)
    while not stop.wait(rng.expovariate(1.0 / every)) and time.time() < until - 30:
        kind = rng.choice(soak_faults.FAULTS)
        journal.write("fault", soak_faults.inject(kind, base, door_pid, models, STALL_S, rng))


def sample_loop(door_pid: int, data_dir: Path, base: str, journal: Journal, stop: threading.Event) -> None:
    while True:
        try:
            journal.write("sample", soak_faults.sample(door_pid, data_dir, base))
        except Exception as e:  # noqa: BLE001 - a sample that could not be read is recorded with why
            journal.write("sample-failed", {"t": time.time(), "why": f"{type(e).__name__}: {e}"})
        if stop.wait(SAMPLE_S):
            return


def door_history(base: str) -> list[dict] | str:
    """The door's whole history at the end (oldest first), or why it could not be read."""
    try:
        r = httpx.get(base + "/v1/models/history", params={"limit": 10000}, timeout=120)
        r.raise_for_status()
    except httpx.HTTPError as e:
        return f"unavailable, because {type(e).__name__}: {e}"
    keep = ("time", "event", "model", "reason", "request_id")
    return [{k: e.get(k) for k in keep} for e in reversed(r.json()["data"])]


def tree_commit() -> str:
    import fitevict

    src = Path(fitevict.__file__).resolve().parent
    head = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return f"{head.stdout.strip() or 'unknown commit'} ({src})"


def trace_env(args: argparse.Namespace) -> dict[str, str] | None:
    """``--trace-memory``: the door runs with ``bench/memtrace`` on its path, which records every
    ``--trace-memory`` seconds where its memory grew (tracemalloc, object types, the C allocator, RSS) to
    ``<out>.memtrace.jsonl``, growth counted from the end of warm-up. Tracing slows the door and adds its own memory: a traced run's RSS is not the soak's
    figure."""
    if not args.trace_memory:
        return None
    here = str(Path(__file__).resolve().parent / "memtrace")
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "FITEVICT_MEMTRACE": str(args.out.with_suffix(".memtrace.jsonl").resolve()),
            "FITEVICT_MEMTRACE_SECONDS": str(args.trace_memory),
            "FITEVICT_MEMTRACE_BASELINE_SECONDS": str(args.warmup * 60)}  # the fit's warm-up, the tracer's too


def run(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="fitevict-soak-"))
    journal = Journal(args.out)
    models = build_models(tmp)
    ram_limit = int(1.5 * medium_bytes(models))
    cfg = config(ram_limit)
    (tmp / "probe.toml").write_text(cfg)
    meta = {"t": time.time(), "command": " ".join(["bench/soak.py", *sys.argv[1:]]), "fitevict": tree_commit(),
            "cpu": cpu_model(), "cores": os.cpu_count(), "load_before": load_average(), "minutes": args.minutes,
            "warmup_minutes": args.warmup, "clients": args.clients, "fault_every": args.fault_every,
            "hangups": args.hangups, "ram_limit": ram_limit, "bounds": bounds(tmp / "probe.toml"), "config": cfg,
            "models": sorted(p.stem for p in models.glob("*.gguf")), "sample_seconds": SAMPLE_S}
    try:
        with serve(tmp, "soak", models, cfg, env=trace_env(args)) as door:
            journal.write("meta", {**meta, "door_pid": door.pid})
            stop, until = threading.Event(), time.time() + args.minutes * 60
            data_dir = tmp / "soak" / "data"
            threads = [threading.Thread(target=sample_loop, daemon=True,
                                        args=(door.pid, data_dir, door.base, journal, stop)),
                       threading.Thread(target=fault_loop, daemon=True, args=(
                           door.base, door.pid, models, journal, until, args.fault_every, stop))]
            threads += [threading.Thread(target=client_loop, daemon=True, args=(
                door.base, journal, until, i + 1, args.hangups, stop)) for i in range(args.clients)]
            for t in threads:
                t.start()
            try:
                for t in threads[2:]:
                    t.join()
            finally:
                stop.set()
                for t in threads[:2]:
                    t.join(120)
            journal.write("end", {"t": time.time(), "load_after": load_average(),
                                  "door_alive": soak_faults.healthy(door.base), "history": door_history(door.base)})
    finally:
        log = tmp / "soak" / "serve.log"
        if log.exists():
            shutil.copyfile(log, args.out.with_suffix(".serve.log"))  # kept beside the run's file
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=None, help="minutes left out of the growth fits "
                    "(default: 10, or a fifth of a shorter run)")
    ap.add_argument("--clients", type=int, default=3, help="client threads (each waits 0.3-2 s between requests)")
    ap.add_argument("--fault-every", type=float, default=60.0, help="mean seconds between injected faults")
    ap.add_argument("--hangups", type=float, default=0.15, help="share of streams the client hangs up")
    ap.add_argument("--out", type=Path, default=Path("soak.jsonl"))
    ap.add_argument("--report", type=Path, default=None, help="only write the doc and plots from this run's file (with --no-doc: print them, the docs untouched)")
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--trace-memory", type=float, default=None, metavar="SECONDS",
                    help="trace where the door's memory grows, every SECONDS, to <out>.memtrace.jsonl")
    args = ap.parse_args()
    if args.warmup is None:
        args.warmup = min(10.0, args.minutes / 5)
    import soak_report

    if args.report is not None:
        soak_report.main(args.report, args.warmup if "--warmup" in " ".join(sys.argv) else None, doc=not args.no_doc)
        return
    signal_exit()
    run(args)
    if not args.no_doc:
        soak_report.main(args.out, None)


if __name__ == "__main__":
    main()
