"""The real half of ``bench/lifesize_planning.py``: what the simulations' life-size models cost and take to load on this
machine, measured through ``fitevict serve``, and one real contention run where two models fit and three do not.

- ``measure``: ``fitevict serve`` on the life-size zoo (RAM limit 20 GiB, reserve 0); per model the front door's
  own plan (``POST /v1/models/{m}/plan``: the price the planner counts, engine overhead included), then one load
  (``POST /v1/models/{m}/load``, timed here; the seat's own ``load_seconds``) and its unload (exit + release
  seconds). The files are read from the page cache when an earlier bench read them (warm loads; said in the doc).
- ``contend``: ``fitevict serve`` with ``ram_limit`` between the largest pair's price and the three's, reserve 0;
  ``CLIENTS`` concurrent clients, each asking the three models round-robin (client ``i`` begins at model
  ``i mod 3``) for ``seconds``; the front door's planned bytes (``/v1/models/residents``) and the seats' PSS
  (``/proc/PID/smaps_rollup`` of each seat's process group, read here) sampled every 0.25 s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from _serve import Served, cpu_model, load_average, prices_read_ahead, serve

CLIENTS = 6
MAX_TOKENS = 4
SAMPLE_S = 0.25
TIMINGS = ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms")  # kept of llama-server's timings
HISTORY_KEYS = ("id", "time", "event", "model", "seconds", "reason", "host_gb", "freed_gb")  # kept per history row
FIGURES = ("predicted", "allocated", "measured", "planned")  # per seat and sample, after its state


def plan_of(base: str, key: str) -> dict:
    """The front door's plan for a load of ``key`` now (``POST /v1/models/{key}/plan``)."""
    r = httpx.post(f"{base}/v1/models/{key}/plan", timeout=600)
    r.raise_for_status()
    return r.json()["plan"]


def measure(models_dir: Path, keys: Sequence[str], tmp: Path) -> dict:
    """Per model: the front door's plan (its price and configuration) and one timed load and unload."""
    config = '[budget]\nram_limit = "20GiB"\nram_reserve = 0\n'
    out: dict = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_model(),
                 "load_average_before": load_average(), "models": {}}
    with serve(tmp, "measure", models_dir, config) as s:
        prices_read_ahead(s.base)
        for key in keys:
            plan = plan_of(s.base, key)
            t = time.perf_counter()
            httpx.post(f"{s.base}/v1/models/{key}/load", timeout=900).raise_for_status()
            wall = time.perf_counter() - t
            view = s.residents()[key]
            gone = httpx.post(f"{s.base}/v1/models/{key}/unload", timeout=300).json()
            out["models"][key] = {
                "file_bytes": (models_dir / f"{key}.gguf").stat().st_size,
                "config": plan["config"], "needed_bytes": plan["needed_bytes"]["CPU"],
                "host_mapped_bytes": plan["host_mapped_bytes"], "host_committed_bytes": plan["host_committed_bytes"],
                "footprint": plan["footprint"], "load_wall_seconds": round(wall, 3),
                "load_seconds": view["load_seconds"], "planned_after_load": view["devices"]["CPU"]["planned_bytes"],
                "exit_seconds": gone.get("exit_seconds"), "release_seconds": gone.get("release_seconds")}
            print(f"{key}: {plan['needed_bytes']['CPU'] / 2**30:.3f} GiB, load {wall:.2f} s", flush=True)
    out["load_average_after"] = load_average()
    return out


def pss_of_group(pid: int) -> int | None:
    """PSS (Pss_Anon + Pss_File + Pss_Shmem) of every process in ``pid``'s process group, from smaps_rollup."""
    total, found = 0, False
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pid:  # pgrp
                continue
            for line in (proc / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    found = True
        except (OSError, IndexError, ValueError):
            continue
    return total if found else None


class Sampler(threading.Thread):
    """The front door's planned bytes and the seats' PSS, every ``SAMPLE_S`` seconds, until stopped."""

    def __init__(self, s: Served) -> None:
        super().__init__(daemon=True)
        self.s, self.stop_at = s, threading.Event()
        self.rows: list[dict] = []
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop_at.is_set():
            try:
                views = self.s.residents()
            except httpx.HTTPError as e:
                self.errors.append(repr(e))
                continue
            planned = sum(v["devices"]["CPU"]["planned_bytes"] for v in views.values())
            pss = [pss_of_group(v["pid"]) for v in views.values() if v.get("pid")]
            per = {k: [v["state"], *(v["devices"]["CPU"][f"{f}_bytes"] for f in FIGURES)] for k, v in views.items()}
            self.rows.append({"t": time.monotonic(), "seats": sorted(views), "planned": planned,
                              "pss": sum(x for x in pss if x is not None), "pss_missing": pss.count(None),
                              "per_seat": per})
            self.stop_at.wait(SAMPLE_S)


def thin(samples: list[dict]) -> list[dict]:
    """The samples that say something new: the first and the last, any with a seat unread, and any whose seats, their
    states, or their planned bytes or PSS (to a MiB) differ from the sample kept before it."""
    def shape(r: dict) -> tuple:
        return (tuple((k, v[0]) for k, v in sorted(r.get("per_seat", {}).items())), tuple(r["seats"]),
                r["planned"] >> 20, r["pss"] >> 20)

    out: list[dict] = []
    for i, r in enumerate(samples):
        if not out or i == len(samples) - 1 or r["pss_missing"] or shape(r) != shape(out[-1]):
            out.append(r)
    return out


def client(base: str, keys: Sequence[str], start: int, until: float, log: list[dict]) -> None:
    """Round-robin over ``keys`` from ``keys[start]``, one request at a time, until ``until`` (monotonic)."""
    i = start
    with httpx.Client(timeout=900) as http:
        while time.monotonic() < until:
            key = keys[i % len(keys)]
            i += 1
            t = time.monotonic()
            try:
                r = http.post(base + "/v1/chat/completions", json={
                    "model": key, "max_tokens": MAX_TOKENS, "temperature": 0,
                    "messages": [{"role": "user", "content": f"Hi {i}"}]})
                status = r.status_code
                got = (r.json().get("timings") or {}) if status == 200 else {}
                detail = {k: got.get(k) for k in TIMINGS} if status == 200 else r.text[:200]
            except (httpx.HTTPError, ValueError) as e:
                status, detail = 0, repr(e)
            log.append({"model": key, "sent": t, "seconds": time.monotonic() - t, "status": status,
                        "timings" if status == 200 else "detail": detail})


def contend(models_dir: Path, keys: Sequence[str], limit_bytes: int, seconds: float, tmp: Path) -> dict:
    """The real run (module docstring): every request's status and seconds, the samples, the history."""
    config = f'[budget]\nram_limit = {limit_bytes}\nram_reserve = 0\n'
    out: dict = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_model(),
                 "load_average_before": load_average(), "keys": list(keys), "limit_bytes": limit_bytes,
                 "clients": CLIENTS, "seconds": seconds, "max_tokens": MAX_TOKENS}
    with serve(tmp, "contend", models_dir, config) as s:
        prices_read_ahead(s.base)
        out["prices"] = {k: plan_of(s.base, k)["needed_bytes"]["CPU"] for k in keys}
        sampler = Sampler(s)
        sampler.start()
        log: list[dict] = []
        t0 = time.monotonic()
        threads = [threading.Thread(target=client, args=(s.base, keys, i % len(keys), t0 + seconds, log))
                   for i in range(CLIENTS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        out["wall_seconds"] = time.monotonic() - t0
        sampler.stop_at.set()
        sampler.join()
        out["history"] = [{k: h.get(k) for k in HISTORY_KEYS} for h in s.history()]  # a fresh data folder: this run's
        out["requests"] = [{**r, "sent": r["sent"] - t0} for r in log]
        out["samples_taken"] = len(sampler.rows)
        out["samples"] = thin([{**r, "t": round(r["t"] - t0, 2)} for r in sampler.rows])
        out["sampler_errors"] = sampler.errors
    out["load_average_after"] = load_average()
    return out
