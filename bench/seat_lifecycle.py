"""Load, measure and stop every demo-zoo model through the real supervisor; report what was measured.

For each model: load seconds (start to /health), fitevict's predicted bytes against the engine's own
buffers (its load log), the seat's PSS, and on stop the exit time, release time and committed memory that
came back. Writes docs/benchmarks.md (section ``seat_lifecycle``).

    .venv/bin/python bench/seat_lifecycle.py
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import write_section  # noqa: E402


def mib(n: int | None) -> str:
    return "unavailable" if n is None else f"{n / 2**20:.2f}"


async def run(zoo_dir: Path, data: Path) -> list[dict]:
    from fitevict.config import load_config
    from fitevict.engines.llama_cpp.install import resolve_binary
    from fitevict.pricing.footprint import HOST
    from fitevict.request.catalog import Catalog
    from fitevict.store import Store
    from fitevict.supervisor import Supervisor

    cfg = load_config(None, env={}, overrides={"data_dir": str(data), "models_dirs": [str(zoo_dir)]})
    store = Store.open(cfg.store_url)
    sup = Supervisor(config=cfg, catalog=Catalog.from_config(cfg), store=store,
                     engine_binary=resolve_binary().path)
    await sup.start()
    rows = []
    try:
        for entry in sup.catalog.entries():
            seat = await sup.load(entry.key)
            load_s = seat.load_seconds
            predicted = seat.predicted.device(HOST)
            measured = seat.measured.device(HOST) if seat.measured else None
            pss = seat.host_mem
            stop = await sup.unload(entry.key)
            ev = store.events(model=entry.key, event="unload", limit=1)[0]
            rows.append({
                "model": entry.key, "load_s": load_s,
                "pred": predicted.total_bytes if predicted else None,
                "meas": measured.total_bytes if measured else None,
                "pss_committed": pss.committed_bytes if pss else None, "pss_mapped": pss.mapped_bytes if pss else None,
                "exit_s": stop.exit_seconds, "release_s": stop.release_seconds, "verified": stop.verified,
                "freed": stop.freed_bytes, "held": ev.details.get("held_committed_bytes"),
                "avail": ev.details.get("mem_available_delta_bytes"),
            })
    finally:
        await sup.shutdown()
        store.close()
    return rows


def main() -> None:
    from fitevict.zoo import write_zoo

    tmp = Path(tempfile.mkdtemp(prefix="fitevict-seats-"))
    write_zoo(tmp / "zoo")
    rows = asyncio.run(run(tmp / "zoo", tmp / "data"))
    errs = [abs(r["pred"] - r["meas"]) / r["meas"] for r in rows if r["pred"] and r["meas"]]
    rel = [r["release_s"] for r in rows if r["release_s"] is not None]
    lines = [
        "## Seat lifecycle (`bench/seat_lifecycle.py`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores: every demo-zoo model "
        "loaded by the supervisor (ctx 4096, -np 1, CPU), measured, then unloaded with release verification.",
        "Predicted = fitevict's price of the engine's buffers (formula + dry-run compute); engine = the same buffers "
        "from llama-server's load log (measured); PSS from /proc/PID/smaps_rollup (measured); came back = fall of "
        "/proc/meminfo AnonPages+Shmem (measured); MemAvailable delta shown beside it.",
        "",
        f"|error| predicted vs engine total: median {100 * statistics.median(errs):.3f}%, max {100 * max(errs):.3f}%. "
        f"Release verified {sum(r['verified'] for r in rows)}/{len(rows)}; release time median "
        f"{statistics.median(rel) * 1000:.0f} ms, max {max(rel) * 1000:.0f} ms." if rel and errs else "",
        "",
        "| model | load s | predicted MiB | engine MiB | PSS committed / mapped MiB | exit ms | release ms | "
        "held / came back MiB | MemAvailable delta MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['load_s']:.2f} | {mib(r['pred'])} | {mib(r['meas'])} | "
            f"{mib(r['pss_committed'])} / {mib(r['pss_mapped'])} | {r['exit_s'] * 1000:.0f} | "
            f"{'unverified' if r['release_s'] is None else round(r['release_s'] * 1000)} | "
            f"{mib(r['held'])} / {mib(r['freed'])} | {mib(r['avail'])} |")
    body = "\n".join(lines)
    write_section("seat_lifecycle", body)
    print(body)


if __name__ == "__main__":
    main()
