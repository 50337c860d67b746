"""fitevict's cluster placement against Ray Serve's model multiplexing, side by side, on the same nodes and traces.

Simulated time (``clustersim``, ``servesim``): the Zipf and adversarial traces of ``trace_replay.py`` on 3 nodes,
each with that bench's single-node budget. fitevict's rows run the real routing rule (``fitevict.cluster.route``)
and, per node, the real ``Scheduler`` and planner over a declared budget; Serve's rows are a model of
``@serve.multiplexed(max_num_models_per_replica=N)`` with one replica per node, at two N: the largest that never
oversubscribes a node with this size mix, and the one at which the mean model fits. The same traces then run on
3 to 100 nodes to time the routing decisions. A short real run (``cluster_real.py``) is read from its JSON.

    .venv/bin/python bench/cluster_vs_serve.py [--quick] [--no-write] [--real bench/cluster_real.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import write_section  # noqa: E402
from _serve import load_average  # noqa: E402
from clustersim import ClusterResult, FitevictFront, route_costs, run_cluster  # noqa: E402
from servesim import ServeFront  # noqa: E402
from trace_replay import CONTRACT, Case, cases, count_lru_fill, count_lru_max, measured_zoo  # noqa: E402
from traces import adversarial_trace, zoo_specs  # noqa: E402

from fitevict.config import Config, load_config  # noqa: E402
from fitevict.supervisor.core import sched_policy  # noqa: E402

MiB, GiB = 2**20, 2**30
NODES = 3
FLEETS = (3, 10, 30, 100)
TRACES = ("zipf", "adversarial, service 1 s", "adversarial, service 0.05 s", "8 clients x 3 models", "zipf-small",
          "zipf-mixed")
SCALE_TRACES = ("zipf", "adversarial, service 0.05 s")
FOUR = ("llama-q8_0", "llama-q4_0", "qwen3-headdim", "qwen2-k256")  # one at a time fits a node of the pair budget
HERE = Path(__file__).resolve().parent
REAL = HERE / "cluster_real.json"


def four_models(pair: Case, zoo_all: dict, quick: bool) -> Case:
    """Beyond trace_replay's traces: the adversarial trace over four models of which a node holds one, so that
    three nodes cannot hold them all (on three nodes, the pair and the trio each get a node per model)."""
    trace = replace(adversarial_trace(FOUR, clients=8, per_client=24 // (2 if quick else 1), service=0.05),
                    name="adversarial, 4 models, service 0.05 s")
    return Case(trace, {k: zoo_all[k] for k in FOUR}, pair.budget_bytes, "that of the adversarial pair")


def serve_ns(case: Case) -> tuple[int, int]:
    """(the largest N whose N biggest models fit one node's budget, the budget over the mean model size)."""
    return count_lru_max(case.models, case.budget_bytes), count_lru_fill(case.models, case.budget_bytes)


def fitevict_front(config: Config) -> FitevictFront:
    return FitevictFront(sched_policy(config), idle_unload_seconds=config.policy.idle_unload_seconds)


def run_case(config: Config, case: Case, nodes: int = NODES) -> list[ClusterResult]:
    p = config.policy
    kw = {"eviction": p.eviction, "exclusive_fraction": p.exclusive_fraction}
    out = [run_cluster(nodes, case.models, case.budget_bytes, case.trace, lambda: fitevict_front(config), **kw)]
    safe, fill = serve_ns(case)
    for n, why in ((safe, "largest safe"), (fill, "mean fits")):
        out.append(run_cluster(nodes, case.models, case.budget_bytes, case.trace,
                               lambda n=n, why=why: ServeFront(n, queue_timeout=p.queue_timeout_seconds,
                                                               name=f"Serve N={n} ({why})"), **kw))
    return out


def router_seeds(config: Config, all_cases: Sequence[Case], seeds: Sequence[int] = (1, 2, 3, 4)) -> list[str]:
    """Serve's rows at the largest safe N again with other seeds of its router's random choices: reload bytes."""
    p = config.policy
    out = []
    for case in all_cases:
        safe, _fill = serve_ns(case)
        got = [run_cluster(NODES, case.models, case.budget_bytes, case.trace,
                           lambda s=s: ServeFront(safe, queue_timeout=p.queue_timeout_seconds, seed=s),
                           eviction=p.eviction, exclusive_fraction=p.exclusive_fraction) for s in seeds]
        unit, name = unit_of(case)
        lo, hi = min(r.reload_bytes for r in got), max(r.reload_bytes for r in got)
        out.append(f"- {case.trace.name}, Serve N={safe}: reload {lo / unit:.1f} to {hi / unit:.1f} {name} over router "
                   f"seeds {', '.join(map(str, seeds))}; over-budget events "
                   f"{min(r.over_events for r in got)} to {max(r.over_events for r in got)}")
    return out


def scaling(config: Config, all_cases: Sequence[Case], fleets: Sequence[int]) -> list[ClusterResult]:
    p = config.policy
    out = []
    for case in all_cases:
        if case.trace.name not in SCALE_TRACES:
            continue
        for n in fleets:
            out.append(run_cluster(n, case.models, case.budget_bytes, case.trace, lambda: fitevict_front(config),
                                   eviction=p.eviction, exclusive_fraction=p.exclusive_fraction))
    return out


def unit_of(case: Case) -> tuple[int, str]:
    return (GiB, "GiB") if case.budget_bytes > 10 * GiB else (MiB, "MiB")


def fmt(x: float, nd: int = 2) -> str:
    return "-" if x != x else f"{x:.{nd}f}"


def table(rows: Sequence[tuple[Case, list[ClusterResult]]]) -> str:
    out = ["| trace | policy | loads | reload | reload vs fitevict | loaded | over-budget events | max over | "
           "p50 wait s | p99 wait s | max wait s | lost | waits > timeout | loads per node |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for case, results in rows:
        unit, name = unit_of(case)
        base = results[0].reload_bytes
        for r in results:
            ratio = "1.00x" if r is results[0] else (f"{r.reload_bytes / base:.2f}x" if base else
                                                    ("-" if not r.reload_bytes else "inf"))
            out.append(f"| {case.trace.name} | {r.policy} | {r.loads} | {r.reload_bytes / unit:.1f} {name} | {ratio} | "
                       f"{r.loaded_bytes / unit:.1f} {name} | {r.over_events} | {r.over_max_bytes / unit:.1f} {name} | "
                       f"{fmt(r.wait_p50)} | {fmt(r.wait_p99)} | {fmt(r.wait_max)} | {r.lost} | {r.over_timeout} | "
                       f"{'/'.join(map(str, r.loads_per_node))} |")
    return "\n".join(out)


def scale_table(results: Sequence[ClusterResult]) -> str:
    out = ["| trace | nodes | decisions | hits | misses | rule per hit us | rule per miss us | dry runs per miss us "
           "(summed) | one dry run us | facts per node per poll us | loads | reload MiB | p99 wait s | lost |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        c = route_costs(r)
        out.append(f"| {r.trace} | {r.nodes} | {c['hits'] + c['misses']:.0f} | {c['hits']:.0f} | {c['misses']:.0f} | "
                   f"{fmt(c['hit_us'], 1)} | {fmt(c['miss_us'], 1)} | {fmt(c['dry_runs_us'], 0)} | "
                   f"{fmt(c['dry_run_node_us'], 1)} | {fmt(c['facts_node_us'], 1)} | {r.loads} | "
                   f"{r.reload_bytes / MiB:.1f} | {fmt(r.wait_p99)} | {r.lost} |")
    return "\n".join(out)


def goal(rows: Sequence[tuple[Case, list[ClusterResult]]], real: dict | None = None) -> list[str]:
    """fitevict: at most half the reload bytes of Serve at the largest safe N, 0 over-budget events, 0 lost."""
    out = []
    for case, (fe, safe, _fill) in rows:
        unit, name = unit_of(case)
        half = fe.reload_bytes <= 0.5 * safe.reload_bytes
        ok = half and fe.over_events == 0 and fe.lost == 0
        ratio = (f"{fe.reload_bytes / safe.reload_bytes:.4f}x" if safe.reload_bytes else
                 "neither reloads" if not fe.reload_bytes else "Serve reloads nothing")
        out.append(f"- {case.trace.name}: fitevict reloads {fe.reload_bytes / unit:.1f} {name} against "
                   f"{safe.reload_bytes / unit:.1f} {name} for {safe.policy} ({ratio}), {fe.over_events} over-budget "
                   f"events, {fe.lost} lost: {'met' if ok else 'MISSED'}")
    if real is not None:
        fe, safe = real["rows"][0], real["rows"][1]
        ok = fe["reload_bytes"] <= 0.5 * safe["reload_bytes"] and fe["over_events"] == 0 and fe["lost"] == 0
        out.append(f"- real run (below): fitevict reloads {fe['reload_bytes'] / MiB:.1f} MiB against "
                   f"{safe['reload_bytes'] / MiB:.1f} MiB for {safe['policy']}, {fe['over_events']} over-budget "
                   f"events, {fe['lost']} lost: {'met' if ok else 'MISSED'}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", type=Path, help="the demo zoo's folder (default: written to a temporary folder)")
    ap.add_argument("--quick", action="store_true", help="a tenth of the requests; fleets of 3 and 10 (no doc)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--real", type=Path, default=REAL, help="the real run's JSON (cluster_real.py)")
    a = ap.parse_args(argv)
    config = load_config(None, env={}, overrides={})
    load_before = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        zoo = measured_zoo(a.zoo, Path(tmp))
        all_cases = [c for c in cases(zoo, quick=a.quick) if c.trace.name in TRACES]
        all_cases.insert(3, four_models(all_cases[1], zoo_specs(zoo, CONTRACT), a.quick))
        t0 = time.perf_counter()
        rows = [(c, run_case(config, c)) for c in all_cases]
        t1 = time.perf_counter()
        scaled = scaling(config, all_cases, FLEETS[:2] if a.quick else FLEETS)
        t2 = time.perf_counter()
        seeds = router_seeds(config, all_cases)
    print(table(rows))
    print(scale_table(scaled))
    print("\n".join(goal(rows)))
    print("\n".join(seeds))
    for r in [r for _c, rs in rows for r in rs] + list(scaled):
        for line in r.anomalies[:3]:
            print(f"ANOMALY {r.trace} / {r.policy} / {r.nodes} nodes: {line}", file=sys.stderr)
    print(f"3 nodes: {t1 - t0:.1f} s; fleets: {t2 - t1:.1f} s", file=sys.stderr)
    if not (a.no_write or a.quick):
        from cluster_doc import doc_body

        real = json.loads(a.real.read_text()) if a.real.exists() else None
        write_section("cluster_vs_serve", doc_body(config, real, (t1 - t0, t2 - t1), table(rows),
                                                   scale_table(scaled), goal(rows, real), seeds,
                                                   (load_before, load_average())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
