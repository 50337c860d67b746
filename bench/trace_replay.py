"""Replay request traces through fitevict's scheduler and four baselines, side by side, in simulated time.

fitevict's rows run the real ``Scheduler`` (``fitevict.supervisor.scheduler``) over the real planner with a
declared budget; the baselines (``baselines.py``) are small simulations of other servers' policies. All
run in the same discrete-event world (``tracesim.Sim``) with the demo zoo's real prices and measured load
and release times (``traces.py``). Writes docs/benchmarks.md (section ``trace_replay``).

    .venv/bin/python bench/trace_replay.py [--zoo DIR] [--no-write]
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import write_section  # noqa: E402
from baselines import CountLRU, FifoSwap, KeepAlive  # noqa: E402
from traces import adversarial_trace, bursty_trace, total_bytes, zipf_trace, zoo_specs  # noqa: E402
from tracesim import FitevictPolicy, ModelSpec, Policy, Result, Sim, Trace  # noqa: E402

from fitevict.config import Config, load_config  # noqa: E402
from fitevict.contract import Contract  # noqa: E402
from fitevict.host.budget import Budget  # noqa: E402
from fitevict.pricing.footprint import HOST  # noqa: E402
from fitevict.supervisor.core import sched_policy  # noqa: E402

MiB = 2**20
CONTRACT = Contract(ctx=4096, parallel=1)  # what bench/seat_lifecycle.py measured: ctx 4096, -np 1, CPU
ADVERSARIAL_PAIR = ("llama-q8_0", "llama-q4_0")
ISSUE_TRIO = (*ADVERSARIAL_PAIR, "mamba")  # two that cannot be co-resident and a small third
BURSTY_MODELS = ("llama-gqa", "gemma2-swa", "llama-q8_0", "qwen2-bias", "phi-fusedqkv", "gpt2-ln",
                 "bloom-alibi", "gemma3-q4_0")


@dataclass(frozen=True, slots=True)
class Case:
    """One trace over some models under one budget."""

    trace: Trace
    models: Mapping[str, ModelSpec]
    budget_bytes: int
    why_budget: str


def count_lru_max(models: Mapping[str, ModelSpec], budget: int) -> int:
    """The largest ``--models-max`` that never holds more than ``budget``: the N biggest models fit."""
    sizes = sorted((sum(m.bytes.values()) for m in models.values()), reverse=True)
    n, held = 0, 0
    for b in sizes:
        if held + b > budget:
            break
        n, held = n + 1, held + b
    return max(1, n)


def count_lru_fill(models: Mapping[str, ModelSpec], budget: int) -> int:
    """The ``--models-max`` that fills ``budget`` with models of the mean size."""
    mean = total_bytes(models) / len(models)
    return max(1, int(budget // mean))


def policies(config: Config, case: Case) -> list[tuple[str, Callable[[Sim], Policy]]]:
    p = config.policy
    out: list[tuple[str, Callable[[Sim], Policy]]] = []
    safe, fill = count_lru_max(case.models, case.budget_bytes), count_lru_fill(case.models, case.budget_bytes)
    for n in dict.fromkeys((safe, fill)):
        out.append(("cost", lambda sim, n=n: CountLRU(sim, n, queue_timeout=p.queue_timeout_seconds,
                                                      engine_queue_depth=p.engine_queue_depth)))
    out.append(("cost", lambda sim: FifoSwap(sim, queue_timeout=p.queue_timeout_seconds,
                                             engine_queue_depth=p.engine_queue_depth)))
    out.append(("cost", lambda sim: KeepAlive(sim, 300.0, queue_timeout=p.queue_timeout_seconds)))
    for ev in ("lru", "cost"):
        out.append((ev, lambda sim, ev=ev: FitevictPolicy(sim, replace(sched_policy(config), eviction=ev),
                                                          idle_unload_seconds=p.idle_unload_seconds)))
    return out


def run_case(config: Config, case: Case) -> list[Result]:
    budget = Budget.declared({HOST: case.budget_bytes})
    out = []
    for eviction, make in policies(config, case):
        sim = Sim(case.models, budget, eviction=eviction, exclusive_fraction=config.policy.exclusive_fraction)
        out.append(sim.run(make(sim), case.trace))
    return out


def cases(zoo: Path, *, quick: bool = False) -> list[Case]:
    zoo_all = zoo_specs(zoo, CONTRACT)
    scale = 10 if quick else 1
    big = max(sum(m.bytes.values()) for m in zoo_all.values())
    zipf_budget = 320 * MiB
    pair = {k: zoo_all[k] for k in ADVERSARIAL_PAIR}
    pair_budget = max(sum(m.bytes.values()) for m in pair.values()) + 1 * MiB
    trio = {k: zoo_all[k] for k in ISSUE_TRIO}
    trio_budget = pair_budget + sum(zoo_all[ISSUE_TRIO[2]].bytes.values())
    small = {k: m for k, m in zoo_all.items() if sum(m.bytes.values()) < 64 * MiB}
    small_budget = 96 * MiB
    burst = {k: zoo_all[k] for k in BURSTY_MODELS}
    burst_budget = 48 * MiB
    return [
        Case(zipf_trace(list(zoo_all), n=3000 // scale, rate=2.0, service=0.25, s=1.0, seed=1), zoo_all, zipf_budget,
             f"{zipf_budget / MiB:.0f} MiB: the largest model ({big / MiB:.1f} MiB) plus a few small ones, or every "
             f"small one; the whole zoo needs {total_bytes(zoo_all) / MiB:.1f} MiB"),
        Case(replace(adversarial_trace(ADVERSARIAL_PAIR, clients=8, per_client=24 // (2 if quick else 1), service=1.0),
                     name="adversarial, service 1 s"),
             pair, pair_budget,
             f"{pair_budget / MiB:.2f} MiB: the larger of the two plus 1 MiB; the two together need "
             f"{total_bytes(pair) / MiB:.2f} MiB"),
        Case(replace(adversarial_trace(ADVERSARIAL_PAIR, clients=8, per_client=24 // (2 if quick else 1),
                                       service=0.05), name="adversarial, service 0.05 s"),
             pair, pair_budget, "as above"),
        Case(replace(adversarial_trace(ISSUE_TRIO, clients=8, per_client=3, service=0.05), name="8 clients x 3 models"),
             trio, trio_budget,
             f"{trio_budget / MiB:.2f} MiB: the larger of the pair plus {ISSUE_TRIO[2]} plus 1 MiB"),
        Case(replace(zipf_trace(list(small), n=3000 // scale, rate=2.0, service=0.25, s=1.0, seed=2), name="zipf-small"),
             small, small_budget,
             f"{small_budget / MiB:.0f} MiB: about 9 of the {len(small)} small models "
             f"(all {len(small)} need {total_bytes(small) / MiB:.1f} MiB)"),
        Case(bursty_trace(BURSTY_MODELS, bursts=120 // scale, size=(5, 30), gap=3.0, spacing=0.1, service=0.25,
                          seed=3), burst, burst_budget,
             f"{burst_budget / MiB:.0f} MiB: about 4 of the 8 models; all 8 need {total_bytes(burst) / MiB:.1f} MiB"),
    ]


def fmt_s(x: float) -> str:
    return "-" if x != x else f"{x:.2f}"


def table(config: Config, rows: Sequence[tuple[Case, list[Result]]]) -> str:
    bound = config.policy.max_wait_seconds
    out = ["| trace | policy | swaps (loads) | reload MiB | loaded MiB | load s | p50 wait s | p99 wait s | max wait s | "
           f"lost | over budget MiB | evicted unserved | swaps per {bound:g} s bound | makespan s |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for case, results in rows:
        for r in results:
            lost = str(r.lost) + (f" ({', '.join(f'{k} {v}' for k, v in sorted(r.lost_by.items()))})" if r.lost else "")
            per = r.loads / max(1.0, r.makespan / bound)
            out.append(f"| {case.trace.name} | {r.policy} | {r.loads} | {r.reload_bytes / MiB:.1f} | "
                       f"{r.loaded_bytes / MiB:.1f} | {r.load_seconds:.1f} | {fmt_s(r.wait_p50)} | {fmt_s(r.wait_p99)} | {fmt_s(r.wait_max)} | "
                       f"{lost} | {r.over_budget_bytes / MiB if r.over_budget_bytes > 0 else 0:.1f} | "
                       f"{r.evicted_unserved} | {per:.2f} | {r.makespan:.0f} |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", type=Path, help="the demo zoo's folder (default: written to a temporary folder)")
    ap.add_argument("--quick", action="store_true", help="a tenth of the requests (no doc written)")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    config = load_config(None, env={}, overrides={})
    with tempfile.TemporaryDirectory() as tmp:
        zoo = a.zoo
        if zoo is None:
            from fitevict.zoo import write_zoo

            zoo = Path(tmp) / "zoo"
            write_zoo(zoo)
        t0 = time.perf_counter()
        rows = [(c, run_case(config, c)) for c in cases(zoo, quick=a.quick)]
        took = time.perf_counter() - t0
    text = table(config, rows)
    print(text)
    for _case, results in rows:
        for r in results:
            for line in r.anomalies[:5]:
                print(f"ANOMALY {r.trace} / {r.policy}: {line}", file=sys.stderr)
    print(f"replayed in {took:.1f} s", file=sys.stderr)
    if not (a.no_write or a.quick):
        write_section("trace_replay", doc_body(config, rows, took))
    return 0


def doc_body(config: Config, rows: Sequence[tuple[Case, list[Result]]], took: float) -> str:
    return "## Trace replay (`bench/trace_replay.py`)\n\n" + table(config, rows)  # filled in below


if __name__ == "__main__":
    raise SystemExit(main())
