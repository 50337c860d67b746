"""From another program's growth to fitevict's decision to give memory back: the memory sampler's reaction time at
``server.sample_seconds`` 1.0 (the default) and 0.25. Writes docs/benchmarks.md (section ``pressure``).

One ``fitevict serve`` at a time, first at one sampling interval, then (stopped, and started again) at the other,
with one idle seat of the demo zoo's largest model (``llama-medium``) and ``budget.ram_reserve`` set to MemAvailable
minus ``--room`` when the bench starts. A hog process then maps ``--hog`` bytes with MAP_POPULATE (every page
touched at once), which takes free memory below the reserve. The bench reads /proc/meminfo's MemAvailable every
``--every`` seconds to find the moment it fell below the reserve, and compares it with the server's ``pressure``
event (``details.detected_at``: the reading that decided; its time: once the stops were done) and the ``evict``
event of the idle seat (recorded when its stop was done). Its own release check counts only the seat's processes:
just before the hog it reads the seat's process tree (the seat and every descendant, Pss_Anon + Pss_Shmem from
smaps_rollup), and it counts the release as seen when every one of those processes is gone. The hog is let go, the
seat loads again, and the next repetition starts.

    .venv/bin/python bench/pressure.py [--reps 5] [--no-doc]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from fitevict.engines.process import alive
from fitevict.host.procmem import descendants, read_meminfo, read_tree

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import STARTED, Stamp, write_section  # noqa: E402
from _serve import Served, cpu_model, fmt, load_average, med, scale, serve, signal_exit, wait_for  # noqa: E402

MODEL = "llama-medium"
GiB, MiB = 2**30, 2**20
INTERVALS = ("1.0", "0.25")  # server.sample_seconds, as written in each config

HOG = """
import mmap, sys, time
print(time.time(), flush=True)
m = mmap.mmap(-1, int(sys.argv[1]), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
print(time.time(), flush=True)
sys.stdin.read()
"""


def available() -> int:
    """MemAvailable, read as fitevict reads it."""
    return read_meminfo().available_bytes


class Watch(threading.Thread):
    """MemAvailable every ``every`` seconds, with the wall-clock time of each reading, and the moment the last of
    ``pids`` (the seat's processes) is gone, until stopped."""

    def __init__(self, every: float, pids: tuple[int, ...]) -> None:
        super().__init__(daemon=True)
        self.every, self.samples, self.done = every, [], threading.Event()
        self.pids, self.gone = pids, {}
        self.exited: float | None = None

    def run(self) -> None:
        while not self.done.is_set():
            now = time.time()
            self.samples.append((now, available()))
            for pid in self.pids:
                if pid not in self.gone and not alive(pid):
                    self.gone[pid] = now
            if self.exited is None and len(self.gone) == len(self.pids):
                self.exited = now
            self.done.wait(self.every)

    def crossing(self, reserve: int, after: float) -> tuple[float, float] | None:
        """(last reading at or above the reserve, first below it) after ``after``; None when it was already below
        at ``after`` (something else took the memory) or never fell."""
        before = [x for x in self.samples if x[0] < after]
        if not before or before[-1][1] < reserve:
            return None
        prev = before[-1][0]
        for t, n in self.samples[len(before):]:
            if n < reserve:
                return prev, t
            prev = t
        return None


def chat_ok(s: Served) -> bool:
    r = httpx.post(s.base + "/v1/chat/completions", timeout=300, json={
        "model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    return r.status_code == 200


def newest(s: Served, event: str, after: float) -> dict | None:
    return next((e for e in s.history(event) if e["time"] >= after and e["model"] in (None, MODEL)), None)


def one_rep(s: Served, reserve: int, hog_bytes: int, every: float) -> dict:
    """The seat loaded and idle; its processes read; the hog grows; the pressure and evict events; the hog let go."""
    wait_for(lambda: chat_ok(s), f"{s.name}: {MODEL} loading", 120, 0.5)
    time.sleep(2.5)  # idle, and a few calm readings
    root = s.residents()[MODEL]["pid"]
    tree = read_tree(root)
    pids = (root, *descendants(root))
    watch = Watch(every, pids)
    watch.start()
    time.sleep(0.2)
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(hog_bytes)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        started, grown = float(hog.stdout.readline()), float(hog.stdout.readline())
        ev = wait_for(lambda: newest(s, "pressure", started), f"{s.name}: a pressure event", 60, 0.2)
        wait_for(lambda: watch.exited is not None or None, f"{s.name}: the seat's processes gone", 60, 0.05)
        time.sleep(0.3)
    finally:
        hog.stdin.close()
        hog.wait(30)
        watch.done.set()
        watch.join()
    return {"started": started, "grown": grown, "cross": watch.crossing(reserve, started), "hog_pid": hog.pid,
            "pressure": ev, "evict": newest(s, "evict", started), "exited": watch.exited, "seat_pids": list(pids),
            "seat_committed": tree.committed_bytes, "seat_source": tree.source,
            "seat_gone": len(watch.gone) == len(pids)}


def latencies(reps: list[dict]) -> dict[str, list[float]]:
    """Per repetition: from the crossing (first reading below the reserve) to the server's moments."""
    got: dict[str, list[float]] = {k: [] for k in ("detect", "exited", "evict", "done", "freed", "held", "grew",
                                                   "bracket", "verified", "seat", "gone")}
    for r in reps:
        if r["cross"] is None:
            continue
        above, below = r["cross"]
        ev, evict = r["pressure"], r["evict"]
        got["bracket"].append(below - above)
        got["detect"].append(ev["details"]["detected_at"] - below)
        got["done"].append(ev["time"] - below)
        got["gone"].append(float(r["seat_gone"]))
        if r["seat_committed"] is not None:
            got["seat"].append(r["seat_committed"])
        if r["exited"] is not None:
            got["exited"].append(r["exited"] - below)
        if evict:
            got["evict"].append(evict["time"] - below)
            got["verified"].append(float(bool(evict["details"].get("release_verified"))))
        if evict and evict["bytes"]["freed"] is not None:
            got["freed"].append(evict["bytes"]["freed"])
        got["held"] += [sum(x["held"].values()) for x in ev["details"]["stopped"]]
        host = next((d for d in ev["details"]["devices"] if d["device"] == "CPU"), {})
        if host.get("others_grew_bytes") is not None:
            got["grew"].append(host["others_grew_bytes"])
    return got


def said(reps: list[dict]) -> dict:
    """What the last repetition's pressure event said."""
    r = reps[-1]
    ev = r["pressure"]
    host = next((d for d in ev["details"]["devices"] if d["device"] == "CPU"), {})
    return {"reason": ev["reason"], "stopped": [x["model"] for x in ev["details"]["stopped"]],
            "hog_named": any(p.get("pid") == r["hog_pid"] for p in ev["details"]["largest_others"]),
            "short": ev["details"]["short_bytes"], "free_after": host.get("free_after_bytes"),
            "verified": [bool((r["evict"] or {}).get("details", {}).get("release_verified"))]}


def _row(label: str, xs: dict[str, dict[str, list[float]]], key: str, k: float = 1.0, spec: str = ".3f") -> str:
    cells = [fmt(scale(med(xs[n][key]), k), spec) for n in INTERVALS]
    return f"| {label} | " + " | ".join(cells) + " |"


def _runs(xs: dict[str, dict[str, list[float]]], key: str) -> str:
    return "; ".join(f"sample_seconds {n}: " + ", ".join(f"{x:.3f}" for x in xs[n][key]) for n in INTERVALS)


def report(reps: dict[str, list[dict]], ctx: dict) -> str:
    xs = {n: latencies(reps[n]) for n in INTERVALS}
    every = [r for n in INTERVALS for r in reps[n]]
    valid = sum(1 for r in every if r["cross"] is not None)
    fill = med([r["grown"] - r["started"] for r in every])
    into = med([r["cross"][1] - r["started"] for r in every if r["cross"]])
    lines = [
        "## Memory pressure from other programs (`bench/pressure.py`)",
        "",
        f"Measured {ctx['date']} on {ctx['cpu']} ({platform.machine()}, {ctx['cores']} cores shared "
        f"with other work: load average {ctx['load_before']} before, {ctx['load_after']} after), CPU only. One "
        "`fitevict serve` at a time: `server.sample_seconds` 1.0 (the default), then, stopped and started again, "
        f"0.25; its one idle seat of `{MODEL}` (demo zoo, f16), `budget.ram_reserve` = MemAvailable at the start "
        f"minus {ctx['room'] / GiB:.2f} GiB ({ctx['reserve'] / GiB:.2f} GiB), `pressure_margin` at its default, "
        f"`min_residency_seconds` 0. A hog maps {ctx['hog'] / GiB:.2f} GiB with MAP_POPULATE (median "
        f"{fmt(fill, '.2f')} s to touch it all; MemAvailable fell below the reserve {fmt(into, '.2f')} s after it "
        f"began). The bench reads MemAvailable every {ctx['every'] * 1000:.0f} ms (median "
        f"{fmt(scale(med(xs[INTERVALS[0]]['bracket']), 1e3), '.1f')} ms between its readings around the "
        f"crossing): the crossing is its first reading below the reserve. {valid} of {len(every)} repetitions "
        "counted (one where MemAvailable was already below the reserve before the hog began would not be). The "
        "bench's own release check counts only the seat's processes (the seat and its descendants, read just "
        "before the hog): released when every one of them is gone; what they held is their Pss_Anon + Pss_Shmem "
        "at that reading. fitevict's `freed_bytes` is the machine's AnonPages + Shmem fall across the stop, so it "
        "also moves with every other program (the hog among them).",
        "",
        "| from the crossing (median) | sample_seconds 1.0 | sample_seconds 0.25 |",
        "|---|---:|---:|",
        _row("to the decision (pressure event `details.detected_at`), s", xs, "detect"),
        _row("to the last of the seat's processes gone (measured by the bench, /proc), s", xs, "exited"),
        _row("to its `evict` event (recorded once its release is verified or timed out), s", xs, "evict"),
        _row("to the pressure event (recorded once the stopped seats' processes exited), s", xs, "done"),
        "| the seat's processes all gone (the bench's check, only the seat's own processes) | "
        + " | ".join(f"{int(sum(xs[n]['gone']))} of {len(xs[n]['gone'])}" for n in INTERVALS) + " |",
        _row("what the seat's processes held, MiB (Pss_Anon + Pss_Shmem, read by the bench)", xs, "seat",
             1 / MiB, ".1f"),
        _row("what the stopped seat held, MiB (the pressure event's sampled committed bytes)", xs, "held", 1 / MiB,
             ".1f"),
        "| releases verified by fitevict (`release_verified` of the evict events) | "
        + " | ".join(f"{int(sum(xs[n]['verified']))} of {len(xs[n]['verified'])}" for n in INTERVALS) + " |",
        _row("the machine's AnonPages+Shmem fall across the stop, MiB (`freed_bytes`, machine-wide)", xs, "freed",
             1 / MiB, ".1f"),
        _row("other programs grew, MiB (`others_grew_bytes`)", xs, "grew", 1 / MiB, ".1f"),
        "",
        f"Runs, crossing to decision s: {_runs(xs, 'detect')}. Crossing to the seat's processes gone s: "
        f"{_runs(xs, 'exited')}. "
        f"Crossing to the evict event s: {_runs(xs, 'evict')}.",
        "",
        *_waited(reps, xs, fill, into),
    ]
    for n in INTERVALS:
        s = said(reps[n])
        lines.append(f"What the last pressure event said (sample_seconds {n}): \"{s['reason']}\"; stopped "
                     f"{', '.join(s['stopped']) or 'nothing'} (release verified: {s['verified']}); free after "
                     f"{fmt(None if s['free_after'] is None else s['free_after'] / GiB, '.2f')} GiB; still short "
                     f"{', '.join(f'{k} {v / MiB:.0f} MiB' for k, v in s['short'].items()) or 'nothing'}; the hog "
                     f"{'named' if s['hog_named'] else 'not named'} among the largest other processes.")
        lines.append("")
    lines.append(f"Rerun: `nice -n 5 .venv/bin/python bench/pressure.py --reps {ctx['reps']}` (writes this section; "
                 f"`--no-doc` prints it only).")
    return "\n".join(lines)


def _waited(reps: dict[str, list[dict]], xs: dict[str, dict[str, list[float]]], fill: float | None,
            into: float | None) -> list[str]:
    """Why an evict event came late, when one did: its release could not be verified while the hog grew."""
    late = {n: sum(1 for v in xs[n]["verified"] if not v) for n in INTERVALS}
    if not any(late.values()):
        return []
    note = next((r["evict"]["details"].get("release_note") for n in INTERVALS for r in reps[n]
                 if r["evict"] and not r["evict"]["details"].get("release_verified")), "")
    return ["Stops whose release fitevict did not verify: " + ", ".join(f"{v} of {len(xs[n]['verified'])} at "
            f"sample_seconds {n}" for n, v in late.items()) + ". A stop is recorded once the memory its seat held "
            "is seen back (AnonPages+Shmem up by 90% of it, against a reading taken just before the stop) or "
            "`engine.release_timeout_seconds` (30 s) has passed. The hog took "
            f"{fmt(fill, '.2f')} s to touch its pages and crossed the reserve {fmt(into, '.2f')} s in, so a decision "
            "made in between stops the seat while the hog is still adding more anonymous memory than the seat gives "
            "back: the check waits out its timeout, the evict and pressure events come 30 s late, although the "
            f"seat's processes were gone in the time the table gives. The release note of one such stop: \"{note}\"",
            ""]


def config(reserve: int, every: str) -> str:
    return (f"[budget]\nram_reserve = {reserve}\n[server]\nsample_seconds = {every}\n"
            "[policy]\nmin_residency_seconds = 0\nidle_unload_seconds = 0\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--hog", type=float, default=1.5, help="GiB the hog maps")
    ap.add_argument("--room", type=float, default=1.0, help="GiB above the reserve when the bench starts")
    ap.add_argument("--every", type=float, default=0.01, help="seconds between the bench's MemAvailable readings")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    signal_exit()
    from fitevict.zoo import write_zoo

    tmp = Path(tempfile.mkdtemp(prefix="fitevict-pressure-"))
    write_zoo(tmp / "zoo", only=[MODEL])
    reserve = available() - int(args.room * GiB)
    ctx = {"cpu": cpu_model(), "cores": os.cpu_count(), "load_before": load_average(), "room": int(args.room * GiB),
           "reserve": reserve, "hog": int(args.hog * GiB), "every": args.every, "reps": args.reps,
           "date": time.strftime("%Y-%m-%d"), "stamp": STARTED.to_json()}
    reps: dict[str, list[dict]] = {n: [] for n in INTERVALS}
    try:
        for n in INTERVALS:
            with serve(tmp, f"s{n}", tmp / "zoo", config(reserve, n)) as server:
                for i in range(args.reps):
                    reps[n].append(one_rep(server, reserve, ctx["hog"], args.every))
                    x = latencies(reps[n][-1:])
                    print(f"sample_seconds {n}, rep {i + 1}/{args.reps}: decided "
                          f"{fmt(med(x['detect']), '+.3f')} s, seat gone {fmt(med(x['exited']), '+.3f')} s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ctx["load_after"] = load_average()
    body = report(reps, ctx)
    if not args.no_doc:
        write_section("pressure", body, stamp=Stamp.from_json(ctx["stamp"]))
    print(body)


if __name__ == "__main__":
    main()
