"""The tables and the doc section of ``bench/lifesize_planning.py``: the simulations per policy, the measured models,
and the real run (its requests, samples and history, as ``lifesize_planning_real.contend`` stored them)."""

from __future__ import annotations

import platform
import time
from collections import Counter
from collections.abc import Mapping, Sequence

from trace_replay import cpu_words
from tracesim import Result

GiB = 2**30
MiB = 2**20
UNDER = 0.99  # a seat counted below this fraction of its price is under-counted (the engine's log rounds to 0.01 MiB)


def fmt_s(x: float) -> str:
    return "-" if x != x else f"{x:.1f}"


def sim_table(rows: Sequence) -> str:
    out = ["| trace | policy | requests | lost | swaps | max wait s | p50 wait s | p99 wait s | peak resident GiB | "
           "budget GiB | over budget GiB | evicted unserved |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for sc, results in rows:
        for r in results:
            r: Result
            lost = str(r.lost) + (f" ({', '.join(f'{k} {v}' for k, v in sorted(r.lost_by.items()))})" if r.lost else "")
            out.append(f"| {sc.case.trace.name} | {r.policy} | {r.requests} | {lost} | {r.loads} | "
                       f"{fmt_s(r.wait_max)} | "
                       f"{fmt_s(r.wait_p50)} | {fmt_s(r.wait_p99)} | {r.peak_resident_bytes / GiB:.2f} | "
                       f"{r.budget_bytes / GiB:.2f} | {max(0, r.over_budget_bytes) / GiB:.2f} | "
                       f"{r.evicted_unserved} |")
    return "\n".join(out)


def models_table(data: Mapping) -> str:
    out = ["| model | file GiB | planned GiB (mapped + committed) | model / context / compute / output MiB | "
           "load s | exit + release s | source |", "|---|---:|---:|---:|---:|---:|---|"]
    rows = [(k, m, "measured") for k, m in data["measured"]["models"].items()]
    rows += [(k, m, "scaled (see below)") for k, m in data.get("scaled", {}).items()]
    for k, m, src in rows:
        d = m["footprint"]["devices"][0]
        terms = " / ".join(f"{d[f'{t}_bytes'] / MiB:.0f}" for t in ("model", "context", "compute", "output"))
        rel = float(m["exit_seconds"] or 0) + float(m["release_seconds"] or 0)
        out.append(f"| {k} | {m['file_bytes'] / GiB:.2f} | {m['needed_bytes'] / GiB:.3f} "
                   f"({m['host_mapped_bytes'] / GiB:.2f} + {m['host_committed_bytes'] / GiB:.2f}) | {terms} | "
                   f"{float(m['load_seconds']):.2f} | {rel:.2f} | {src} |")
    return "\n".join(out)


def real_summary(real: Mapping) -> dict:
    """The real run's figures: requests per status, waits, planned and PSS peaks against the limit, history counts."""
    reqs, samples, hist = real["requests"], real["samples"], real["history"]
    events = Counter(h["event"] for h in hist)
    per_model = {k: [r["seconds"] for r in reqs if r["model"] == k] for k in real["keys"]}
    # a request's wait: its seconds less the engine's own prompt and generation time (llama-server's timings)
    waits = sorted(r["seconds"] - (r["timings"]["prompt_ms"] + r["timings"]["predicted_ms"]) / 1000
                   for r in reqs if isinstance(r.get("timings"), dict))
    return {
        "requests": len(reqs), "ok": sum(r["status"] == 200 for r in reqs),
        "statuses": dict(Counter(str(r["status"]) for r in reqs)),
        "max_s": max((r["seconds"] for r in reqs), default=float("nan")),
        "p50_s": sorted(r["seconds"] for r in reqs)[len(reqs) // 2] if reqs else float("nan"),
        "per_model": per_model, "events": dict(events), "waits": waits,
        "peak_planned": max((s["planned"] for s in samples), default=0),
        "peak_pss": max((s["pss"] for s in samples), default=0),
        "pss_missing": sum(s["pss_missing"] for s in samples), "samples": real.get("samples_taken", len(samples)),
        "max_seats": max((len(s["seats"]) for s in samples), default=0),
        "evict_reasons": [h["reason"] for h in hist if h["event"] == "evict"][:3],
        "under": under_price(samples),
    }


def under_price(samples: Sequence[Mapping]) -> dict[str, tuple[int, float, str]]:
    """Per seat state, the seat readings whose planned bytes (what the planner counts) were below ``UNDER`` x its price:
    how many, the lowest planned / price, and which model (samples with per-seat figures only)."""
    out: dict[str, tuple[int, float, str]] = {}
    for smp in samples:
        for key, (state, predicted, _alloc, _measured, planned) in smp.get("per_seat", {}).items():
            if predicted and planned is not None and planned < UNDER * predicted:
                n, low, who = out.get(state, (0, 1.0, ""))
                r = planned / predicted
                out[state] = (n + 1, min(low, r), key if r < low else who)
    return out


def real_section(label: str, real: Mapping) -> list[str]:
    s = real_summary(real)
    lim = real["limit_bytes"]
    prices = ", ".join(f"{k} {v / GiB:.3f} GiB" for k, v in real["prices"].items())
    ok = (s["ok"] == s["requests"] and s["peak_planned"] <= lim and s["peak_pss"] <= lim)
    lines = [
        f"### The real run, {label}: three life-size models, room for two",
        "",
        f"Run {real['when']} on {real['cpu']}, the front door's code: {real.get('code', 'not recorded')} "
        f"(load average {real['load_average_before']} before, "
        f"{real['load_average_after']} after: the machine's 2 cores were shared with other benches and tests). "
        f"`fitevict serve` with `ram_limit = {lim}` ({lim / GiB:.3f} GiB) and `ram_reserve = 0`; the front door's "
        f"prices: {prices} (any two fit, the three do not). {real['clients']} concurrent clients, each asking the "
        f"three round-robin (client i begins at model i mod 3) for chat answers of {real['max_tokens']} tokens, for "
        f"{real['seconds']:.0f} s (the last requests finish after it); planned bytes (`/v1/models/residents`) and "
        f"the seats' PSS (every process of each seat's group, `/proc/PID/smaps_rollup`, read by the bench) sampled "
        f"every 0.25 s ({s['samples']} samples).",
        "",
        "| requests | answered 200 | lost | p50 s | max s | p50 wait s | max wait s | loads (swaps) | evictions | "
        "peak seats | peak planned GiB | peak PSS GiB | limit GiB | verdict |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        f"| {s['requests']} | {s['ok']} | {s['requests'] - s['ok']} | {s['p50_s']:.1f} | {s['max_s']:.1f} | "
        f"{fmt_s(w[len(w) // 2] if (w := s['waits']) else float('nan'))} | {fmt_s(max(w, default=float('nan')))} | "
        f"{s['events'].get('load', 0)} | {s['events'].get('evict', 0)} | {s['max_seats']} | "
        f"{s['peak_planned'] / GiB:.3f} | {s['peak_pss'] / GiB:.3f} | {lim / GiB:.3f} | "
        f"{'0 lost, never over' if ok else 'MISSED'} |",
        "",
        "Request seconds: from sending to the answer; wait: those less the engine's own prompt and generation "
        "milliseconds (its `timings`), so queueing, loads and swaps. Per model: " + "; ".join(
            f"{k}: {len(v)} requests, max {max(v, default=float('nan')):.1f} s" for k, v in s["per_model"].items())
        + f". History events: {', '.join(f'{k} {v}' for k, v in sorted(s['events'].items()))}."
        + (f" Statuses: {s['statuses']}." if s["ok"] != s["requests"] else "")
        + (f" {s['pss_missing']} seat readings had no PSS (a seat that had just exited)." if s["pss_missing"] else ""),
    ]
    if s["under"]:
        lines += ["", f"Seats counted below {100 * UNDER:.0f}% of their price by the front door (distinct samples "
                  "kept): " + "; ".join(f"{state}: {n}, down to {100 * low:.1f}% of the price ({who})"
                                        for state, (n, low, who) in s["under"].items())
            + ". The planner counts `planned`, so in those instants it saw room that was not there."]
    elif any("per_seat" in x for x in real["samples"]):
        lines += ["", f"No seat was ever counted below {100 * UNDER:.0f}% of its price by the front door."]
    if s["evict_reasons"]:
        lines += ["", "An eviction's reason, as the history gives it: " + s["evict_reasons"][0]]
    return lines


def verdicts(rows: Sequence) -> list[str]:
    """Per queue timeout and trace, fitevict's default row against its targets: 0 lost, never over budget."""
    out = ["Targets (fitevict, eviction `cost`, the default: 0 lost, never over budget):", ""]
    for timeout, part in rows:
        for sc, results in part:
            r = next(x for x in results if x.policy == "fitevict eviction=cost")
            ok = r.lost == 0 and r.over_budget_bytes <= 0
            kept = [b for b in results if not b.policy.startswith("fitevict") and b.over_budget_bytes <= 0]
            best = min(kept, key=lambda b: (b.lost, b.wait_max), default=None)
            than = (f"; the baseline that keeps the budget and loses least, {best.policy}: {best.lost} lost, "
                    f"{best.loads} swaps, max wait {fmt_s(best.wait_max)} s" if best is not None else "")
            out.append(f"- queue_timeout {timeout:g} s, {sc.case.trace.name}: {r.lost} lost, {r.loads} swaps, max "
                       f"wait {fmt_s(r.wait_max)} s, peak {r.peak_resident_bytes / GiB:.2f} of "
                       f"{r.budget_bytes / GiB:.2f} GiB: {'met' if ok else 'MISSED'}{than}")
    return out


def notes(data: Mapping, rows: Sequence) -> list[str]:
    """What the tables show, with the figures they rest on."""
    m = data["measured"]["models"]
    slow = max(m, key=lambda k: float(m[k]["load_seconds"]))
    default_t, part = rows[0]
    lost = [(sc.case.trace.name, r) for sc, res in part for r in res if r.policy == "fitevict eviction=cost" and r.lost]
    over = [(sc.case.trace.name, r) for _t, p in rows for sc, res in p for r in res if r.over_budget_bytes > 0]
    out = ["What the tables show:", "",
           f"- **Loads at life size are long here**: {slow} took {float(m[slow]['load_seconds']):.0f} s to load (its "
           "Q4_0 weights read and repacked on 2 shared cores), the scaled 8B Q8_0 is given "
           f"{float(data['scaled']['llama-3.1-8b-q8_0']['load_seconds']):.0f} s. Two loads back to back are then "
           f"close to the default queue_timeout_seconds ({default_t:g} s)."]
    if lost:
        out.append("- **Lost at the default timeout**: " + "; ".join(
            f"{name}: {r.lost} of {r.requests} (Busy: waited {default_t:g} s)" for name, r in lost)
            + ". A request that arrives while one model loads and finds its own evicted waits for that load, that "
            "model's turn and its own load; the baseline that keeps the budget and loses least lost " + "; ".join(
                f"{least_lost(part, name)} on {name}" for name, _r in lost) + ". With queue_timeout_seconds "
            f"{rows[-1][0]:g} nothing is lost (second table): a deployment of models this slow to load should raise "
            "it.")
    if over:
        worst = max(over, key=lambda x: x[1].over_budget_bytes)
        out.append(f"- **Over budget**: only count-LRU with a models-max chosen by mean size (up to "
                   f"{worst[1].over_budget_bytes / GiB:.2f} GiB over on {worst[0]}); fitevict's rows never pass it.")
    runs = data.get("real", {})
    went = [f"{label} (planned {real_summary(run)['peak_planned'] / GiB:.3f} GiB, PSS "
            f"{real_summary(run)['peak_pss'] / GiB:.3f} GiB)" for label, run in sorted(runs.items())
            if real_summary(run)["peak_planned"] > run["limit_bytes"]]
    out.append("- **The real runs** check the same two rules on real seats (planned bytes and PSS against the limit). "
               "A front door that counts a seat below its price (a loading seat at its partial PSS, a ready one at "
               "PSS before its engine's buffers are read) can admit a third model. Runs whose planned bytes passed "
               f"the limit: {', '.join(went) if went else 'none'}.")
    return out


def least_lost(part: Sequence, name: str) -> int:
    """The fewest requests a baseline that keeps the budget lost on trace ``name``."""
    return min(r.lost for sc, res in part if sc.case.trace.name == name for r in res
               if not r.policy.startswith("fitevict") and r.over_budget_bytes <= 0)


def doc_body(data: Mapping, rows: Sequence, took: float) -> str:
    meas = data["measured"]
    lines = [
        "## Planning at life size (`bench/lifesize_planning.py`)",
        "",
        f"Simulated {time.strftime('%Y-%m-%d')} (took {took:.1f} s on {cpu_words()}, Python "
        f"{platform.python_version()}); `.venv/bin/python bench/lifesize_planning.py` (the prices and load times: "
        "`--measure`; the real run: `--real`). fitevict's rows run the real `Scheduler` and planner in simulated "
        "time (`bench/tracesim.py`), beside the baselines of the trace replay (`bench/baselines.py`, described in its "
        "section); every policy sees the same requests, bytes and load seconds.",
        "",
        f"The models: the life-size zoo (`fitevict.zoo.lifesize`), each priced by `fitevict serve` itself "
        f"(`POST /v1/models/{{m}}/plan`: the bytes the planner counts, mapped + committed, the engine process's "
        f"overhead included; CPU only, ctx 4096, 1 slot, the default contract) and loaded and unloaded once through "
        f"it, {meas['when']} on {meas['cpu']} (load average {meas['load_average_before']} before, "
        f"{meas['load_average_after']} after; the files were in the page cache, and other benches shared the 2 "
        "cores, so load seconds are those of a busy machine). On this AMD CPU the Q4_0 weights of the 8B and the MoE "
        "also get a CPU_REPACK copy, so their host price is about twice the file.",
        "",
        models_table(data),
        "",
        "**Scaled, not measured:** `llama-3.1-8b-q8_0` has no life-size file. Its price is llama-3.1-8b's structure "
        "with every Q4_0 tensor retyped Q8_0 (34 bytes per 32 weights instead of 18), priced by the same pricer and "
        "configuration with the Q4_0 file's dry-run compute bytes and the same engine overhead rules (the same steps "
        "on the unchanged structure give the front door's price to the byte, checked by the script); Q8_0 gets no "
        "repack copy on this CPU. Its load seconds are the 8B Q4_0's measured load times the file-size ratio.",
        "",
        "Service seconds per request are declared per trace (3 s on the workstation, 2 s on the laptop: a short chat "
        "answer on a CPU); fitevict's policy is the configuration's default.",
        "",
    ]
    for sc, _ in rows[0][1]:
        lines.append(f"- **{sc.case.trace.name}** ({sc.name}): {sc.case.trace.about}. Budget {sc.case.why_budget}.")
    lines += ["", "Columns: lost = refused or timed out (Busy: waited queue_timeout_seconds); swaps = loads started; "
              "wait = arrival to the start of service, load waits included; peak resident = the highest sum of the "
              "seats' bytes, a seat counted from the start of its load to the end of its release; evicted unserved = "
              "seats evicted before serving one request.", ""]
    for timeout, part in rows:
        lines += [f"**queue_timeout_seconds {timeout:g}**" + (" (the default)" if timeout == rows[0][0] else
                                                              " (every policy)"), "", sim_table(part), ""]
    lines += [*verdicts(rows), "", *notes(data, rows), ""]
    for label, run in sorted(data.get("real", {}).items(), key=lambda x: x[1]["when"]):
        lines += real_section(label, run) + [""]
    if not data.get("real"):
        lines += ["The real run was not made yet (`--real`)."]
    return "\n".join(lines)
