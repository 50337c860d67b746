"""Fair to every client, through a real door: priority classes and a fair share per key on and off, side by side.
Writes docs/scheduling.md (section ``fairness``).

Two ``fitevict serve`` doors over the same generated models and the same RAM budget (``budget.ram_limit``: the chat
model with the embedder fits, the chat model with the flood model does not), with real llama-server seats:

- **on**: ``[fair]`` with its default classes (interactive 4, batch 1) and one key per client in ``[fair.keys]``;
- **off**: no keys: every request is the anonymous interactive client, so a model's queue is first come, first
  served (the scheduler before classes and keys).

Each door runs three scenarios in turn, every seat unloaded between them:

- **a**: an interactive client (one request at a time on the chat model) against a batch flood (closed-loop
  clients on the flood model, which cannot be resident with it);
- **b**: three keys at 1:1:8 load on the chat model (one, one and eight closed-loop clients), and the two light keys
  alone for the baseline;
- **c**: an embedder at 20 concurrent requests (a batch key) against a chat client, both models resident together.

A request's wait is the door's own ``x-fitevict-waited`` (queued and waiting for a load; a request handed its seat
at once waited 0), its estimate the ``x-fitevict-wait-estimate`` stated when it was queued. Loads are the history's
``load`` events of the scenario; lost is every answer that was not a 200.

    .venv/bin/python bench/fairness.py [--no-write] [--json OUT] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import ROOT, STARTED, write_section  # noqa: E402
from _serve import Served, cpu_model, load_average, prices_read_ahead, serve, signal_exit  # noqa: E402

CHAT, FLOOD, EMBED = "llama-gqa", "llama-tied", "llama-q8_0"  # the embedder: embeddings = true; smaller than FLOOD
KEYS = {  # client: (key, class) when classes are on
    "chat": ("sk-chat", "interactive"), "batch": ("sk-batch", "batch"), "light-1": ("sk-light-1", "interactive"),
    "light-2": ("sk-light-2", "interactive"), "heavy": ("sk-heavy", "interactive"), "embedder": ("sk-embed", "batch"),
}
CHAT_TOKENS, FLOOD_TOKENS = 256, 512  # generated to the end (ignore_eos): short, yet long enough to queue
ADMIN = "sk-bench-admin"
MiB = 2**20
DOC = ROOT / "docs" / "scheduling.md"
WITHIN = 0.30  # an estimate within 30 % of the wait it had


@dataclass(frozen=True, slots=True)
class Call:
    """One request as the bench saw it."""

    fair: str  # "on" or "off"
    scenario: str
    client: str
    klass: str
    model: str
    status: int
    waited: float  # the door's x-fitevict-waited; 0 when it was handed its seat at once
    estimate: float | None  # the door's x-fitevict-wait-estimate (None: handed at once, no estimate stated)
    total: float  # seconds from sending to the whole answer


def config(budget: int, fair: bool) -> str:
    models = (f"[budget]\nram_limit = {budget}\nram_reserve = 0\n"
              f"[models.{CHAT}]\nparallel = 2\n[models.{FLOOD}]\nparallel = 2\n"
              f"[models.{EMBED}]\nparallel = 4\nembeddings = true\n")
    if not fair:
        return models
    keys = "".join(f'[fair.keys.{c}]\nkey = "{k}"\nclass = "{cl}"\n' for c, (k, cl) in KEYS.items())
    return f'[server]\nadmin_keys = ["{ADMIN}"]\n' + models + "[fair]\nclasses = { interactive = 4, batch = 1 }\n" + keys


def call(s: Served, fair: bool, scenario: str, client: str, model: str, tokens: int) -> Call:
    """One request of ``client`` (an embedding for the embedder, else a chat generating ``tokens`` to the end)."""
    key, klass = KEYS[client]
    headers = {"Authorization": f"Bearer {key}"} if fair else {}
    if client == "embedder":
        path, body = "/v1/embeddings", {"model": model, "input": ["the quick brown fox jumps over the lazy dog"] * 4}
    else:
        path, body = "/v1/chat/completions", {"model": model, "max_tokens": tokens, "temperature": 0,
                                              "ignore_eos": True, "messages": [{"role": "user", "content": "Count."}]}
    t0 = time.monotonic()
    try:
        r = httpx.post(s.base + path, json=body, headers=headers, timeout=600)
        status, h = r.status_code, r.headers
    except httpx.HTTPError:
        status, h = 0, httpx.Headers()
    est = h.get("x-fitevict-wait-estimate")
    return Call("on" if fair else "off", scenario, client, klass if fair else "interactive", model, status,
                float(h.get("x-fitevict-waited", 0.0)), float(est) if est is not None else None,
                time.monotonic() - t0)


def loop(fn: Callable[[], Call], out: list[Call], until: threading.Event, n: int | None = None,
         think: float = 0.0) -> None:
    """A closed-loop client: ``n`` requests (None: until ``until`` is set), each when the last was answered."""
    i = 0
    while (n is None and not until.is_set()) or (n is not None and i < n):
        out.append(fn())
        i += 1
        if think:
            time.sleep(think)


def run_clients(groups: list[tuple[Callable[[], Call], int | None, int, float]]) -> list[Call]:
    """Run each group (a request, how many per client (None: until the counted ones end), clients, think seconds)
    at once; the open-ended groups stop when every counted one has ended."""
    out: list[Call] = []
    stop = threading.Event()
    counted = [(fn, n, k, th) for fn, n, k, th in groups if n is not None]
    flood = [(fn, n, k, th) for fn, n, k, th in groups if n is None]
    with ThreadPoolExecutor(sum(k for _f, _n, k, _t in groups)) as pool:
        bg = [pool.submit(loop, fn, out, stop, None, th) for fn, _n, k, th in flood for _ in range(k)]
        time.sleep(1.0 if flood else 0.0)  # the flood is queued before the counted clients start
        fg = [pool.submit(loop, fn, out, stop, n, th) for fn, n, k, th in counted for _ in range(k)]
        for f in fg:
            f.result()
        stop.set()
        for f in bg:
            f.result()
    return out


def scenario_plan(s: Served, fair: bool, n: int) -> dict[str, list[tuple[Callable[[], Call], int | None, int, float]]]:
    """Each scenario's client groups (``run_clients``) on door ``s``."""
    def req(scenario: str, client: str, model: str, tokens: int = CHAT_TOKENS) -> Callable[[], Call]:
        return lambda: call(s, fair, scenario, client, model, tokens)

    return {
        "a": [(req("a", "chat", CHAT), n, 1, 1.0), (req("a", "batch", FLOOD, FLOOD_TOKENS), None, 4, 0.0)],
        "b": [(req("b", "light-1", CHAT), n, 1, 0.0), (req("b", "light-2", CHAT), n, 1, 0.0),
              (req("b", "heavy", CHAT), None, 8, 0.0)],
        "b alone": [(req("b alone", "light-1", CHAT), n, 1, 0.0), (req("b alone", "light-2", CHAT), n, 1, 0.0)],
        "c": [(req("c", "chat", CHAT), n, 1, 0.5), (req("c", "embedder", EMBED), None, 20, 0.0)],
    }


def scenarios(doors: dict[bool, Served], quick: bool, notes: list[str]) -> tuple[list[Call], dict[str, dict[str, int]]]:
    """Every scenario on the door with classes and keys, then at once on the one without (side by side in time: the
    machine's other work changes slowly)."""
    plans = {fair: scenario_plan(s, fair, 3 if quick else 8) for fair, s in doors.items()}
    calls: list[Call] = []
    loads: dict[str, dict[str, int]] = {"on": {}, "off": {}}
    for name in plans[True]:
        for fair, s in doors.items():
            unload_all(s, fair)
            warm(s, fair, name)
            t0 = time.time()
            got = run_clients(plans[fair][name])
            mode = "on" if fair else "off"
            loads[mode][name] = sum(1 for e in history(s, fair) if e["event"] == "load" and e["time"] >= t0)
            unload_all(s, fair)
            calls += got
            notes.append(f"{name} {mode}: {load_average()}")
            print(f"{mode} {name}: {len(got)} requests, {loads[mode][name]} loads, load average {load_average()}",
                  file=sys.stderr)
    return calls, loads


def admin_headers(fair: bool) -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"} if fair else {}


def history(s: Served, fair: bool) -> list[dict]:
    r = httpx.get(s.base + "/v1/models/history", params={"limit": 1000}, headers=admin_headers(fair), timeout=60)
    r.raise_for_status()
    return r.json()["data"]


def unload_all(s: Served, fair: bool) -> None:
    r = httpx.get(s.base + "/v1/models/residents", headers=admin_headers(fair), timeout=60)
    for x in r.json()["data"]:
        httpx.post(f"{s.base}/v1/models/{x['key']}/unload", headers=admin_headers(fair), timeout=300)


def warm(s: Served, fair: bool, scenario: str) -> None:
    """Each model of the scenario served once alone (then unloaded): its load, release and generation measured, as
    on a door that has run a while."""
    models = {"a": (CHAT, FLOOD), "b": (CHAT,), "b alone": (CHAT,), "c": (CHAT, EMBED)}[scenario]
    for m in models:
        call(s, fair, "warm", "embedder" if m == EMBED else "chat", m, CHAT_TOKENS)
    unload_all(s, fair)


def budget_for(tmp: Path, models: Path) -> tuple[int, dict[str, int]]:
    """A RAM budget that holds the chat model with the embedder, or the flood model, but not the chat model with the
    flood model: each model's planned bytes (the planner's dry run on a door without a limit)."""
    with serve(tmp, "pricing", models, config(2**40, False).replace(f"ram_limit = {2**40}\n", "")) as s:
        prices_read_ahead(s.base)
        need = {}
        for m in (CHAT, FLOOD, EMBED):
            r = httpx.post(f"{s.base}/v1/models/{m}/plan", json={}, timeout=300)
            r.raise_for_status()
            need[m] = sum(r.json()["plan"]["needed_bytes"].values())
    budget = max(need[FLOOD], need[CHAT] + need[EMBED]) + MiB
    if need[CHAT] + need[FLOOD] <= budget:
        raise SystemExit(f"{CHAT} ({need[CHAT]} B) and {FLOOD} ({need[FLOOD]} B) fit together in {budget} B: pick a "
                         "larger flood model")
    return budget, need


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def f2(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def within(c: Call) -> bool:
    """The estimate was within WITHIN of the wait had (a wait under 0.05 s: within 0.05 s)."""
    assert c.estimate is not None
    return abs(c.estimate - c.waited) <= max(WITHIN * c.waited, 0.05)


def rows(calls: list[Call], loads: dict[str, dict[str, int]]) -> list[str]:
    """One row per scenario, door and client: its waits, lost, the scenario's loads and the estimate's error."""
    out = ["| scenario | classes and keys | client (class) | model | requests | p50 wait s | p95 wait s | worst wait s | "
           "lost | loads | estimated | within ±30 % |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    groups: dict[tuple[str, ...], list[Call]] = {}
    for c in calls:
        groups.setdefault((c.scenario, c.fair, c.client, c.klass, c.model), []).append(c)
    for (scn, mode, client, klass, model), cs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] == "off")):
        ok = [c for c in cs if c.status == 200]
        waits = [c.waited for c in ok]
        est = [c for c in ok if c.estimate is not None]
        hit = sum(within(c) for c in est)
        out.append(f"| {scn} | {mode} | {client} ({klass}) | {model} | {len(cs)} | {f2(pct(waits, .5))} | "
                   f"{f2(pct(waits, .95))} | {f2(max(waits, default=None))} | {len(cs) - len(ok)} | "
                   f"{loads[mode].get(scn, 0)} | {len(est)} | {f'{hit}/{len(est)}' if est else '-'} |")
    return out


def accuracy(calls: list[Call]) -> str:
    """The estimate's error over every request that was stated one, per door."""
    parts = []
    for mode in ("on", "off"):
        est = [c for c in calls if c.fair == mode and c.status == 200 and c.estimate is not None]
        if est:
            hit = sum(within(c) for c in est)
            ratio = statistics.median(c.estimate / c.waited for c in est if c.waited > 0.05) if any(
                c.waited > 0.05 for c in est) else None
            parts.append(f"{mode}: {hit} of {len(est)} ({hit / len(est):.0%}) within ±30 % (or 0.05 s), median "
                         f"estimate / wait {f2(ratio)}")
    return "; ".join(parts) or "no request was stated an estimate"


def targets(calls: list[Call]) -> list[str]:
    """The light keys' p95 against alone (target 1.5x), and the interactive p95 under a flood."""
    def p95(mode: str, scn: str, clients: tuple[str, ...]) -> float | None:
        return pct([c.waited for c in calls if c.fair == mode and c.scenario == scn and c.client in clients
                    and c.status == 200], 0.95)

    out = []
    for mode in ("on", "off"):
        both, alone = p95(mode, "b", ("light-1", "light-2")), p95(mode, "b alone", ("light-1", "light-2"))
        out.append(f"- {mode}: the light keys' p95 wait {f2(both)} s beside the heavy key, {f2(alone)} s alone; "
                   f"the interactive client's p95 wait under the flood {f2(p95(mode, 'a', ('chat',)))} s; beside "
                   f"the embedder {f2(p95(mode, 'c', ('chat',)))} s")
    return out


def doc(calls: list[Call], loads: dict[str, dict[str, int]], budget: int, need: dict[str, int], run: dict) -> str:
    return "\n".join([
        "## Fairness between clients, measured (`bench/fairness.py`)", "",
        f"{run['cpu']}, load average {run['load_before']} before and {run['load_after']} after "
        f"(1 / 5 / 15 min): the machine was busy with other work, so the figures are of a shared CPU. Two doors "
        f"over the same generated models and a RAM budget of {budget / MiB:.1f} MiB ({CHAT} {need[CHAT] / MiB:.1f}, "
        f"{FLOOD} {need[FLOOD] / MiB:.1f}, {EMBED} {need[EMBED] / MiB:.1f} MiB planned: {CHAT} fits with {EMBED}, "
        f"not with {FLOOD}), real llama-server seats (CPU), {CHAT} and {FLOOD} with 2 slots, {EMBED} with 4 and "
        "`embeddings = true`. **on**: `[fair]` with the default classes (interactive 4, batch 1) and one key per "
        "client (`chat`, `light-*`, `heavy`: interactive; `batch`, `embedder`: batch). **off**: no keys, every "
        "request the anonymous interactive client (first come, first served in a model's queue).", "",
        f"- **a**: `chat` sends one request at a time ({CHAT_TOKENS} tokens, 1 s apart) to {CHAT} while 4 `batch` "
        f"clients flood {FLOOD} ({FLOOD_TOKENS} tokens each).",
        f"- **b**: `light-1`, `light-2` (one client each) and `heavy` (8 clients) on {CHAT}, {CHAT_TOKENS} tokens "
        "each; **b alone**: the light keys without `heavy`.",
        f"- **c**: 20 `embedder` clients on {EMBED} (4 inputs each) against `chat` ({CHAT_TOKENS} tokens, 0.5 s "
        f"apart) on {CHAT}, both resident.",
        "- Before each scenario every seat is unloaded and each of its models served once alone, so its load, stop "
        "and generation rate are measured, as on a door that has run a while. Wait: the door's `x-fitevict-waited`; "
        "estimated: requests that queued and were stated `x-fitevict-wait-estimate`; within ±30 %: of those, the "
        "estimate within 30 % of the wait (or 0.05 s). Loads: the history's `load` events during the scenario.",
        "", *rows(calls, loads), "", f"The estimate: {accuracy(calls)}.",
        *([f"The same bench with the earlier estimate (one weighted mean of seconds per request, load seconds alone; "
           f"no concurrency, generation length or release): {run['before']}."] if run.get("before") else []),
        "", *targets(calls), "",
        "Load average (1 / 5 / 15 min) after each scenario: " + "; ".join(run.get("loadavg", [])) + ".", ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 requests per counted client (no doc written)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--json", type=Path, help="write every request's figures here")
    ap.add_argument("--before", type=Path, help="a run's --json under the earlier estimate rule, to compare")
    a = ap.parse_args(argv)
    signal_exit()
    from fitevict.zoo import write_zoo

    run = {"load_before": load_average(), "cpu": cpu_model(), "stamp": STARTED.to_json()}
    with tempfile.TemporaryDirectory(prefix="fitevict-fair-") as tmp:
        write_zoo(Path(tmp) / "models", only=[CHAT, FLOOD, EMBED])
        budget, need = budget_for(Path(tmp), Path(tmp) / "models")
        with serve(Path(tmp), "on", Path(tmp) / "models", config(budget, True)) as on, \
                serve(Path(tmp), "off", Path(tmp) / "models", config(budget, False)) as off:
            prices_read_ahead(on.base)
            prices_read_ahead(off.base)
            calls, loads = scenarios({True: on, False: off}, a.quick, run.setdefault("loadavg", []))
    run["load_after"] = load_average()
    if a.before:
        run["before"] = accuracy([Call(**c) for c in json.loads(a.before.read_text())["calls"]])
    text = doc(calls, loads, budget, need, run)
    print(text)
    if a.json:
        a.json.write_text(json.dumps({"calls": [asdict(c) for c in calls], "loads": loads, "budget": budget,
                                      "need": need, "run": run}, indent=1))
    if not (a.no_write or a.quick):
        write_section("fairness", text, DOC)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
