"""Switch between 4 LoRA adapters on one resident base, against 4 full copies of the model, under a RAM budget
that holds one full model. Writes docs/benchmarks.md (section ``adapter_switch``).

Both runs go through the real supervisor and real llama-server seats (CPU): each request acquires a seat for
its model (``Supervisor.acquire``, which loads or evicts as the budget demands), then streams one token from the
seat with the ``lora`` field the front door sends. Reported per switch (every request after the first):
time to first token (the whole wait: queue, load, first token), bytes loaded, and the bytes resident after.

    .venv/bin/python bench/adapter_switch.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import write_section  # noqa: E402
from fitevict.engines.llama_cpp.machine import host_buffers

HERE = host_buffers()  # this machine's extra host buffers (its probe, else the rule table): as its engine places

BASE = "llama-medium"
NAMES = ("a", "b", "c", "d")


def mib(n: float | None) -> str:
    return "unavailable" if n is None else f"{n / 2**20:.1f}"


async def drive(models: Path, data: Path, keys: list[str], ram_limit: int) -> dict:
    from fitevict.config import load_config
    from fitevict.engines.llama_cpp.install import resolve_binary
    from fitevict.pricing.logparse import parse_load_log
    from fitevict.request.catalog import Catalog
    from fitevict.request.contract import with_lora
    from fitevict.supervisor.loadreport import resident_bytes
    from fitevict.store import Store
    from fitevict.supervisor import Supervisor

    cfg = load_config(None, env={}, overrides={"data_dir": str(data), "models_dirs": [str(models)],
                                               "budget.ram_limit": ram_limit, "budget.ram_reserve": 0})
    store = Store.open(cfg.store_url)
    sup = Supervisor(config=cfg, catalog=Catalog.from_config(cfg), store=store, engine_binary=resolve_binary().path)
    await sup.start()
    rows = []
    try:
        async with httpx.AsyncClient(timeout=300) as http:
            for i, key in enumerate(keys):
                entry = sup.catalog.resolve(key)
                timing: dict = {}
                t0 = time.perf_counter()
                async with sup.acquire(sup.ask(key), request_id=f"r{i}", timing=timing) as seat:
                    body = with_lora({"prompt": "the cat sat on", "n_predict": 1, "stream": True,
                                      "cache_prompt": False, "temperature": 0}, seat.config.loras, entry, None)
                    async with http.stream("POST", seat.base_url + "/completion", json=body) as r:
                        async for _chunk in r.aiter_raw():
                            break
                    ttft = time.perf_counter() - t0
                    log = parse_load_log(seat.log_path.read_text(errors="replace"))
                rep = timing["load_report"]
                loaded = [e for e in store.events(event="load", limit=1000) if e.request_id == f"r{i}"]
                rows.append({"key": key, "ttft": ttft, "hit": rep.base_hit, "adapter_hit": rep.adapter_hit,
                             "loaded_bytes": sum(sup.catalog.resolve(e.model).file_bytes for e in loaded),
                             "resident": resident_bytes(sup.seats.values()).get("CPU", (0, ""))[0],
                             "evicted": list(rep.evicted), "compute_now": dict(log.compute_buffers),
                             "compute_at_load": seat.measured.device("CPU").compute.bytes if seat.measured else None,
                             "adapters_measured": seat.measured.device("CPU").adapters.bytes if seat.measured else None,
                             "adapters_priced": seat.predicted.device("CPU").adapters.bytes,
                             "load_s": rep.base_load_seconds, "adapter_s": rep.adapter_load_seconds})
    finally:
        await sup.shutdown()
        store.close()
    return {"rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3, help="cycles through the 4 models")
    args = ap.parse_args()
    from fitevict.pricing.footprint import HOST
    from fitevict.pricing.gguf import load_structure
    from fitevict.pricing.loadconfig import LoadConfig
    from fitevict.pricing.price import price
    from fitevict.zoo import write_zoo
    from fitevict.zoo.gguf_adapters import write_adapters

    tmp = Path(tempfile.mkdtemp(prefix="fitevict-adapters-"))
    try:
        shared, copies = tmp / "shared", tmp / "copies"
        write_zoo(shared, only=[BASE])
        adapters = write_adapters(shared, base=BASE, names=NAMES)
        copies.mkdir()
        for n in NAMES:
            shutil.copyfile(shared / f"{BASE}.gguf", copies / f"{BASE}-{n}.gguf")
        one = price(load_structure(shared / f"{BASE}.gguf"), LoadConfig(n_ctx=4096, n_parallel=1), host=HERE).footprint
        limit = int(1.5 * one.bytes_on(HOST))  # one full model (with its adapters) fits, two do not
        order = [n for _ in range(args.rounds) for n in NAMES]
        load_before = os.getloadavg()[0]
        a = asyncio.run(drive(shared, tmp / "data-a", [f"{BASE}:{n}" for n in order], limit))["rows"]
        b = asyncio.run(drive(copies, tmp / "data-b", [f"{BASE}-{n}" for n in order], limit))["rows"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def summary(rows: list[dict]) -> dict:
        sw = rows[1:]
        return {"ttft_p50": statistics.median(r["ttft"] for r in sw), "ttft_max": max(r["ttft"] for r in sw),
                "bytes": statistics.mean(r["loaded_bytes"] for r in sw), "hits": sum(r["hit"] for r in sw),
                "resident": max(r["resident"] for r in rows), "loads": sum(1 for r in rows if not r["hit"]),
                "first": rows[0]["ttft"]}

    sa, sb = summary(a), summary(b)
    comp = [(r["compute_at_load"], sum(r["compute_now"].values())) for r in a]
    grew = max(now - (at or 0) for at, now in comp)
    adapter_file = adapters[0].file_bytes
    body = "\n".join([
        "## Adapter switching (`bench/adapter_switch.py`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores, CPU only: "
        f"`{BASE}` from the demo zoo (f16, {mib(one.bytes_on(HOST))} MiB priced at ctx 4096, -np 1) with 4 rank-8 "
        f"LoRA adapters ({adapter_file / 1024:.0f} KiB each, file-size), against 4 full copies of the model. RAM budget "
        f"{mib(limit)} MiB (declared `ram_limit`, 1.5 x one model): one full model fits, two do not. "
        f"{len(order)} requests cycling a, b, c, d; each acquires its seat through the supervisor and streams one "
        "token. Time to first token is measured client-side and includes any queueing, eviction and load. "
        f"The machine is shared: load average {load_before:.1f} before the run, {os.getloadavg()[0]:.1f} after, "
        f"on {os.cpu_count()} cores, so one token alone takes about a second here; compare the columns, not the "
        "absolute times.",
        "",
        "| per switch | 4 adapters on one base | 4 full copies |",
        "|---|---|---|",
        f"| time to first token, median (measured) | {sa['ttft_p50'] * 1000:.1f} ms | {sb['ttft_p50'] * 1000:.1f} ms |",
        f"| time to first token, max (measured) | {sa['ttft_max'] * 1000:.1f} ms | {sb['ttft_max'] * 1000:.1f} ms |",
        f"| bytes loaded per switch (file-size of what was loaded) | {mib(sa['bytes'])} MiB | {mib(sb['bytes'])} MiB |",
        f"| base hits among {len(order) - 1} switches (load reports) | {sa['hits']} | {sb['hits']} |",
        f"| seat loads in all (history) | {sa['loads']} | {sb['loads']} |",
        f"| resident bytes, max (measured) | {mib(sa['resident'])} MiB | {mib(sb['resident'])} MiB |",
        f"| first request (cold load) | {sa['first'] * 1000:.0f} ms | {sb['first'] * 1000:.0f} ms |",
        "",
        f"The adapters' LoRA buffers: {mib(a[0]['adapters_priced'])} MiB priced (formula), "
        f"{mib(a[0]['adapters_measured'])} MiB in the engine's log (measured, 0.01 MiB steps); their load took "
        f"{(a[0]['adapter_s'] or 0) * 1000:.1f} ms of the base's {(a[0]['load_s'] or 0) * 1000:.0f} ms start "
        "(engine log timestamps). Compute buffer once an adapter is applied (the engine re-reserves its graph "
        f"when the scales change) minus the one at load: {grew / 2**20:+.2f} MiB (measured, log).",
    ])
    write_section("adapter_switch", body)
    print(body)


if __name__ == "__main__":
    main()
