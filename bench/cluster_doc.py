"""The docs/benchmarks.md section of ``cluster_vs_serve.py``: the simulated tables, the routing cost per fleet size,
and the real run's figures from ``cluster_real.json``."""

from __future__ import annotations

import platform
import time
from collections.abc import Sequence
from typing import Any

from _docs import Stamp
from trace_replay import cpu_words

MiB = 2**20


def real_table(real: dict[str, Any]) -> list[str]:
    out = ["| policy | requests | served | lost | loads | reload MiB | reload vs fitevict | loaded MiB | "
           "over-budget events | max over MiB | p50 latency s | p99 latency s | loads per node |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    rows = real["rows"]
    base = rows[0]["reload_bytes"]
    for r in rows:
        ratio = "1.00x" if r is rows[0] else (f"{r['reload_bytes'] / base:.2f}x" if base else
                                            ("-" if not r["reload_bytes"] else "n/a (fitevict 0)"))
        per = "/".join(str(v) for _k, v in sorted(r.get("loads_per_node", {}).items()))
        out.append(f"| {r['policy']} | {r['requests']} | {r['served']} | {r['lost']} | {r['loads']} | "
                   f"{r['reload_bytes'] / MiB:.1f} | {ratio} | {r['loaded_bytes'] / MiB:.1f} | {r['over_events']} | "
                   f"{r['max_over_bytes'] / MiB:.1f} | {_s(r['p50_s'])} | {_s(r['p99_s'])} | {per} |")
    return out


def _s(x: Any) -> str:
    return "-" if x is None or x != x else f"{x:.2f}"


def real_part(real: dict[str, Any] | None) -> list[str]:
    if real is None:
        return ["### Real run", "", "Not run yet: `bench/cluster_real.py` writes `bench/cluster_real.json`."]
    sizes = ", ".join(f"{k} {v:.1f}" for k, v in real["sizes_mib"].items())
    plain = real.get("table_sizes_mib", {})
    table = ", ".join(f"{plain[k]:.1f}" for k in real["sizes_mib"] if k in plain)
    return [
        "### Real run (`bench/cluster_real.py`, measured)",
        "",
        f"Run {real['date']} ({real['took_s']:.0f} s with the clusters' starts"
        + (f"; {real['cpu']}, load average {real['load_before']} before, {real['load_after']} after; "
           f"the real run's commit {Stamp.from_json(real['stamp']).commit}" if "stamp" in real else "") + "). Each side on its own real 3-node Ray "
        "cluster on this machine (`ray.cluster_utils.Cluster`, one CPU per node), with a budget of "
        f"{real['budget_mib']} MiB per node; both serve with real llama-server processes, one request at a time "
        "per model (max_tokens 1). Trace: " + real["trace"] + ". Models and their bytes as a node's door plans them "
        "(`fitevict plan`, MiB: ctx 4096, -np 1, the llama-server process's own overhead included), the one ruler "
        "of both sides' loads, reload bytes, over-budget events and Serve's N: " + sizes + " (the simulated tables' "
        f"prices, without the process's overhead: {table}).",
        "",
        "- fitevict: a real `fitevict serve --ray ADDRESS` over a door per node (`fitevict_ram_limit_mib` declared); "
        "requests as OpenAI chat completions to the front door. Over-budget events from the doors' own planned bytes "
        "in `/v1/models/residents`, sampled every 0.1 s.",
        "- Serve: a deployment of one replica per node (`bench/serve_zoo.py`) whose `@serve.multiplexed` load "
        "function starts a llama-server for the model (`-c 4096 -np 1`, CPU); the model object has no `__del__`, so "
        "a model dropped from the cache stops its process when its last request finishes. Requests through Serve's "
        "HTTP proxy with the `serve_multiplexed_model_id` header. Over-budget events from the replicas' loads and "
        "releases.",
        "- Latency = send to answer, loads included; lost = any answer but 200.",
        "",
        *real_table(real),
        *_hop(real["rows"][0].get("hop")),
    ]


def _hop(hop: dict[str, Any] | None) -> list[str]:
    """What routing through the cluster's front door adds to a hit, measured after the fitevict side's trace."""
    if not hop:
        return []
    return ["", f"Routing's own cost (measured after the trace, on the same cluster): a one-token chat to "
            f"`{hop['model']}` (resident), {hop['n']} at the node's own door and {hop['n']} through the cluster's "
            f"front door, alternated: p50 {hop['direct_p50_s'] * 1e3:.1f} ms at the node's door, "
            f"{hop['routed_p50_s'] * 1e3:.1f} ms through the front door, {hop['added_s'] * 1e3:+.1f} ms for "
            "routing (one lookup in the front door's facts and one more HTTP relay on loopback)."]


def doc_body(config: Any, real: dict | None, took: tuple[float, float], table: str, scale_table: str,
             goal: Sequence[str], seeds: Sequence[str], load: tuple[str, str] | None = None) -> str:
    p = config.policy
    lines = [
        "## Cluster placement against Ray Serve multiplexing (`bench/cluster_vs_serve.py`)",
        "",
        f"Simulated {time.strftime('%Y-%m-%d')} on {cpu_words()} (`lscpu`), Python "
        f"{platform.python_version()}, Ray 2.60; the 3-node tables took {took[0]:.0f} s, the fleets {took[1]:.0f} s"
        + (f" (load average {load[0]} before, {load[1]} after: the routing cost table's wall times move with it)"
           if load else "") + ". "
        "Rerun: `.venv/bin/python bench/cluster_real.py` (real run, about 3 minutes, writes `bench/cluster_real.json`), "
        "then `.venv/bin/python bench/cluster_vs_serve.py` (simulations, then this section).",
        "",
        "### Simulated (`bench/clustersim.py`, `bench/servesim.py`)",
        "",
        "Simulated time, the traces, models, measured load times and single-node budgets of the trace replay above, on "
        "3 nodes with that budget each. Nothing is loaded: the figures are the simulated world's.",
        "",
        "- **fitevict**: the real routing rule (`fitevict.cluster.route`) over facts polled from every node every "
        "0.5 s (as the front door polls its agents), and on a miss over each node's fresh dry run: the real planner "
        "(`fitevict.planner.plan`) over that node's real `Scheduler` residents, each resident with its seat's bytes "
        "(a loading seat its priced bytes, as the supervisor gives them). Each node runs the real `Scheduler` with "
        f"the configuration's defaults (eviction `{p.eviction}`, queue_timeout_seconds {p.queue_timeout_seconds:g}) "
        "over a declared budget.",
        "- **Serve**: a model of `@serve.multiplexed(max_num_models_per_replica=N)` with one replica per node, from "
        "Ray 2.60's `multiplex.py` and `request_router` source (see `bench/servesim.py`): an LRU cache of N models "
        "per replica, one load at a time under the replica's lock, a model dropped from the cache kept (and its bytes "
        "held) until its requests in flight finish; routing to replicas that hold or load the model, else to those "
        "with the fewest models, by power of two choices on queue length with `max_ongoing_requests` 5 and Serve's "
        "retry backoff. N at two values: the largest N whose N biggest models fit a node's budget (**largest safe**) "
        "and the budget over the mean model size (**mean fits**).",
        "- Columns: loads = loads started on all nodes; reload = bytes of loads of a model loaded before on any node; "
        "over-budget events = a node's resident bytes (a seat counts from the start of its load to the end of its "
        "release) going from within its budget to over it; wait = arrival at the front door to the start of "
        "service; lost = refused or timed out (Serve has no request timeout: waits over queue_timeout_seconds are "
        "counted apart). The adversarial trace over 4 models is added here: on 3 nodes, the pair and the trio of the "
        "trace replay get a node per model, so nothing contends.",
        "",
        table,
        "",
        "Goal for fitevict: at most half the reload bytes of Serve at the largest safe N, 0 over-budget events, 0 lost:",
        "",
        *goal,
        "",
        "Serve's router draws at random (seed 0 above); other seeds:",
        "",
        *seeds,
        "",
        "Routing cost per fleet size (simulated traces, wall time of the real routing code on this CPU; fitevict "
        "only). A hit is decided from the facts alone; a miss asks every node's dry run (on a real cluster they run "
        "at once, each on its own node, so a miss waits for one dry run and the slowest round trip, not the sum):",
        "",
        scale_table,
        "",
        *real_part(real),
        "",
        *NOTES[:-1],
        *real_note(real),
        NOTES[-1],
    ]
    return "\n".join(lines)


def real_note(real: dict | None) -> list[str]:
    """What the real run shows, read from its rows."""
    if real is None:
        return []
    fe, serve = real["rows"][0], real["rows"][1:]
    served = all(r["served"] == r["requests"] for r in real["rows"])
    own = [real["sizes_mib"][k] - real["table_sizes_mib"][k] for k in real["sizes_mib"] if k in real["table_sizes_mib"]]
    others = "; ".join(f"{r['policy']} loaded {r['loads']} times, {r['reload_bytes'] / MiB:.1f} MiB of them reloads"
                       for r in serve)
    return [
        f"- **Real run**: {'each side served every request' if served else 'not every request was served'}; "
        f"fitevict loaded {fe['loads']} times ({fe['reload_bytes'] / MiB:.1f} MiB of them reloads, "
        f"{fe['over_events']} over-budget events); {others}. fitevict's latencies are longer per request: a request "
        "crosses the front door and the node's door before llama-server, and its first requests wait for the loads; "
        f"Serve's proxy goes straight to the replica. The machine's load average was {real.get('load_before', '?')} "
        "before the run, so the latencies are indicative. The simulated tables' prices leave out the llama-server "
        f"process's own overhead ({min(own):.1f} to {max(own):.1f} MiB per seat here, the doors' prices less the "
        "tables'), which is why the real run's budget and N come from the doors' prices."]


NOTES = [
    "What the tables show:",
    "",
    "- **Counting models at the largest safe N** reloads far more than placing by bytes: N is set by the biggest "
    "models (on zipf, llama-medium and jamba-hybrid fill a 320 MiB node, so N = 2 for 27 models, most of them about "
    "20 MiB), and each replica then cycles a Zipf over the whole zoo through two slots. fitevict's nodes hold the "
    "large model beside a few small ones, or a dozen small ones, whatever the bytes allow; once the popular models "
    "are placed, requests are hits.",
    "- **At the N where the mean model fits**, Serve reloads as little as fitevict or less (zipf, zipf-mixed) by "
    "holding more than a node's budget: one model over its mean size in the cache is enough (zipf: N = 10 puts "
    "llama-medium beside nine small models, about 120 MiB over 320 MiB). On a node whose budget is its memory that "
    "is an out-of-memory kill of the replica and of its requests, which the simulation does not play out.",
    "- **Over budget even at the largest safe N**: the multiplexer drops its least recently used model before it "
    "loads the next one, but a dropped model's bytes stay until its last request in flight finishes, so N + 1 models "
    "are resident for a while. A `__del__` that frees at once removes the overlap and cuts those requests instead.",
    "- **Adversarial traces**: on 3 nodes the pair and the trio get a node per model on both sides, and nothing is "
    "reloaded; the 4-model variant makes one model too many. There fitevict reloads about a quarter of Serve's "
    "bytes with no node over budget; its p99 wait is longer, the price of staying within the budget: Serve loads "
    "the next model while the dropped one still finishes its requests, over budget.",
    "- **Waits** are alike on the zoo's traces; on zipf-mixed (declared sizes of 0.4 to 15 GiB) Serve at N = 1 "
    "waits up to tens of seconds behind reloads of up to 21 s, while fitevict keeps the popular models resident.",
    "- **Routing cost** grows linearly with the fleet: a hit scans every node's facts (tens of microseconds at 100 "
    "nodes, against the milliseconds that routing adds to a hit over HTTP, measured in the real run); a miss runs the rule "
    "over every node's dry run, a few hundred microseconds at 100 nodes, plus the dry runs themselves (tens of "
    "microseconds of planner time each, run by each node at once on a real cluster). From 10 nodes on, the zoo fits "
    "the fleet: nothing is reloaded and the misses are the first loads.",
    "- **Not simulated** on Serve's side: the 0.1 s delay before a replica's model ids reach the router (taken as "
    "instant, in Serve's favour), the router's FIFO matching of pending requests to replicas, and replica restarts.",
]
